package stream

import "bytes"

// ParseOllama reads one payload of Ollama's native API into c: one NDJSON
// line of a streamed POST /api/chat or /api/generate, or a whole
// non-streaming body. It never allocates.
//
// Sources: ollama/ollama v0.17.4 api/types.go (ChatResponse: message with
// content, thinking and tool_calls; GenerateResponse: response, thinking,
// tool_calls; both: done, done_reason, logprobs, and Metrics:
// total_duration, load_duration, prompt_eval_count, prompt_eval_duration,
// eval_count, eval_duration, durations in nanoseconds, all omitted when
// zero) and server/routes.go (streamResponse: application/x-ndjson, one
// JSON object per line; an error after the first line is a final
// {"error":"..."} line under HTTP 200, before it an HTTP error status
// with that body).
//
// What counts: a line whose message.content / response is not empty, or
// that carries tool_calls, is output; message.thinking / thinking is
// reasoning; logprobs entries count its tokens. The done:true line is the
// end (Done): done_reason is the finish reason, eval_count the output
// count (0 when omitted), prompt_eval_count the input count, and the
// durations the engine's own timings. Ollama sends no id.
func ParseOllama(data []byte, c *Chunk) { parseOllama(data, c, nil) }

// parseOllama is ParseOllama, writing to t (when not nil) the answer
// text: message.content and response (not the thinking).
func parseOllama(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	var engine EngineTimes
	var counts usageCounts
	ok := eachMember(d, func(k, v []byte) bool {
		switch string(k) {
		case "model":
			c.Model, _ = strVal(v)
		case "message":
			eachMember(v, func(k, v []byte) bool {
				ollamaContent(k, v, c, t)
				return true
			})
		case "response", "thinking", "tool_calls":
			ollamaContent(k, v, c, t)
		case "logprobs":
			if n := countElements(v); n > 0 {
				c.Tokens, c.TokensFrom = int64(n), SourceLogprobs
			}
		case "done":
			c.Done = boolVal(v)
		case "done_reason":
			c.FinishReason, _ = strVal(v)
		case "total_duration":
			engine.setNanos(EngineTotal, v)
		case "load_duration":
			engine.setNanos(EngineLoad, v)
		case "prompt_eval_duration":
			engine.setNanos(EnginePrompt, v)
		case "eval_duration":
			engine.setNanos(EngineDecode, v)
		case "error":
			c.Error = true
			if s, ok := strVal(v); ok {
				c.ErrorType = s // the message: Rejection looks for "overload" and kin in it
			} else {
				parseError(v, c)
			}
		default:
			counts.member(&usageOllama, k, v)
		}
		return true
	})
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	counts.set(c)
	if c.Done {
		c.Usage = true // eval_count is omitted when zero
		c.Engine = engine
	}
}

// usageOllama: Metrics, at the top level of a payload.
var usageOllama = Usage{Input: []string{"prompt_eval_count"}, Output: []string{"eval_count"}}

func ollamaContent(k, v []byte, c *Chunk, t *Collector) {
	switch string(k) {
	case "content", "response":
		c.Output = c.Output || nonEmptyStr(v)
		if t != nil {
			t.add(v)
		}
	case "thinking":
		c.Reasoning = c.Reasoning || nonEmptyStr(v)
	case "tool_calls":
		c.Output = c.Output || countElements(v) > 0
		if t != nil { // whole calls: {function: {name, arguments: {...}}}
			eachElement(v, func(call []byte) bool {
				var name, args []byte
				eachMember(call, func(k, v []byte) bool {
					if string(k) == "function" {
						eachMember(v, func(k, v []byte) bool {
							switch string(k) {
							case "name":
								name = v
							case "arguments":
								args = v
							}
							return true
						})
					}
					return true
				})
				t.callArgs(t.callName(newCall, name), args, false)
				return true
			})
		}
	}
}

// ParseTGI reads one payload of text-generation-inference's native API
// into c: the data of one SSE event of POST /generate_stream, or a whole
// POST /generate body. It never allocates.
//
// Sources: huggingface/text-generation-inference router/src/lib.rs
// (StreamResponse: index, token {id, text, logprob, special},
// top_tokens, generated_text, details; StreamDetails: finish_reason,
// generated_tokens, seed, input_length; GenerateResponse: generated_text,
// details; FinishReason: length, eos_token, stop_sequence; ErrorResponse:
// error, error_type) and router/src/server.rs (generate_stream_internal:
// one event per generated token, the last one with generated_text set and
// details when parameters.details is true; no "[DONE]"; an error as an
// ErrorResponse event).
//
// What counts: every event with a token object is one generated token
// (Tokens 1, exact: the engine gives its id); an event with
// generated_text set is the end (Done), its details the finish reason
// and the output (generated_tokens) and input (input_length) counts.
// error_type "overloaded" is a rejection. TGI sends no id.
func ParseTGI(data []byte, c *Chunk) { parseTGI(data, c, nil) }

// parseTGI is ParseTGI, writing to t (when not nil) the answer text: the
// text of a token that is not special, or the generated_text of a whole
// /generate body (an event with a token object repeats it).
func parseTGI(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	var token, generated []byte
	ok := eachMember(d, func(k, v []byte) bool {
		switch string(k) {
		case "token":
			if isObject(v) {
				c.Output = true
				c.Tokens, c.TokensFrom = 1, SourceTokenIDs
				token = v
			}
		case "generated_text":
			if _, ok := strVal(v); ok {
				c.Done = true
				generated = v
			}
		case "details":
			var counts usageCounts
			eachMember(v, func(k, v []byte) bool {
				if string(k) == "finish_reason" {
					c.FinishReason, _ = strVal(v)
				} else {
					counts.member(&usageTGI, k, v)
				}
				return true
			})
			counts.set(c)
		case "error":
			c.Error = true
			if _, ok := strVal(v); ok {
				if c.ErrorType == nil {
					c.ErrorType = []byte("error")
				}
			} else {
				parseError(v, c)
			}
		case "error_type":
			if s, ok := strVal(v); ok {
				c.ErrorType = s
			}
		}
		return true
	})
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	if t != nil {
		tgiText(token, generated, t)
	}
}

// usageTGI: StreamDetails (and Details), beside the finish reason.
var usageTGI = Usage{Input: []string{"input_length"}, Output: []string{"generated_tokens"}}

// tgiText writes the answer text of a TGI payload to t: its token's text
// unless the token is special, else the generated_text of a whole body.
func tgiText(token, generated []byte, t *Collector) {
	if token == nil {
		t.add(generated)
		return
	}
	var text []byte
	special := false
	eachMember(token, func(k, v []byte) bool {
		switch string(k) {
		case "text":
			text = v
		case "special":
			special = boolVal(v)
		}
		return true
	})
	if !special {
		t.add(text)
	}
}

// ParseLlamaCpp reads one payload of llama.cpp server's native completion
// API into c: the data of one SSE event of POST /completion (or
// /completions without /v1) with "stream":true, or a whole
// non-streaming body (an array of them for a request of several
// prompts, pooled: llamaCppResults). It never allocates.
//
// Sources: ggml-org/llama.cpp tools/server/server-task.cpp
// (server_task_result_cmpl_partial::to_json_non_oaicompat: index,
// content, tokens, stop:false, id_slot, tokens_predicted,
// tokens_evaluated, timings when set, completion_probabilities;
// server_task_result_cmpl_final::to_json_non_oaicompat: stop:true, model,
// stop_type eos|word|limit|none, stopping_word, tokens_cached, timings
// {cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms, ...}) and
// server-context.cpp (the native stream ends after the stop:true event,
// with no "[DONE]"; a mid-stream error is {"error":{code,message,type}}).
//
// What counts: non-empty content is output; tokens (with return_tokens)
// or completion_probabilities entries count its tokens; stop:true is the
// end (Done), stop_type the finish reason; tokens_predicted is the
// engine's output count so far (exact on the last event), tokens_evaluated
// the input count, timings.cache_n the cached input, timings.prompt_ms
// and predicted_ms the engine's prefill and decode times.
func ParseLlamaCpp(data []byte, c *Chunk) { parseLlamaCpp(data, c, nil) }

// parseLlamaCpp is ParseLlamaCpp, writing to t (when not nil) the answer
// text: content.
func parseLlamaCpp(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	if len(d) > 0 && d[0] == '[' {
		llamaCppResults(d, c, t)
		return
	}
	if !llamaCppObject(d, c, t) {
		*c = Chunk{Malformed: true, Choices: -1}
	}
}

// llamaCppResults reads the whole body of a request of several prompts
// into c: an array of results, one per prompt (tools/server/README.md,
// /completion: "Multiple prompts are also supported. In this case, the
// completion result will be an array"; read as one object, it was
// malformed and its counts lost). They are pooled: output when one has
// some, the end when every one has ended, the counts summed, the last
// finish reason, the first error; no engine times, which are each
// prompt's own (the prompts run side by side in the server's slots).
// A Collector is marked Multi when there are several.
func llamaCppResults(d []byte, c *Chunk, t *Collector) {
	var e Chunk
	n, bad, ended := 0, false, true
	ok := eachElement(d, func(v []byte) bool {
		e = Chunk{Choices: -1}
		if bad = !llamaCppObject(v, &e, t); bad {
			return false
		}
		n++
		c.Output = c.Output || e.Output
		ended = ended && e.Done
		if len(e.FinishReason) > 0 {
			c.FinishReason = e.FinishReason
		}
		if len(c.Model) == 0 {
			c.Model = e.Model
		}
		if e.Usage {
			c.CompletionTokens, c.Usage = c.CompletionTokens+e.CompletionTokens, true
		}
		if e.HasPrompt {
			c.PromptTokens, c.HasPrompt = c.PromptTokens+e.PromptTokens, true
		}
		c.CachedTokens += e.CachedTokens
		if e.Error && !c.Error {
			c.Error, c.ErrorType, c.ErrorCode = true, e.ErrorType, e.ErrorCode
		}
		return true
	})
	if !ok || bad {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	c.Done = ended && n > 0
	if t != nil && n > 1 {
		t.SetMulti()
	}
}

// llamaCppObject reads one llama.cpp payload, an object, into c (zeroed
// by the caller); false when it is not an object.
func llamaCppObject(d []byte, c *Chunk, t *Collector) bool {
	probs := 0
	var counts usageCounts
	ok := eachMember(d, func(k, v []byte) bool {
		switch string(k) {
		case "content":
			c.Output = nonEmptyStr(v)
			if t != nil {
				t.add(v)
			}
		case "tokens":
			if n := countElements(v); n > 0 {
				c.Tokens, c.TokensFrom = int64(n), SourceTokenIDs
			}
		case "completion_probabilities":
			probs = max(countElements(v), 0)
		case "stop":
			c.Done = boolVal(v)
		case "stop_type":
			c.FinishReason, _ = strVal(v)
		case "model":
			c.Model, _ = strVal(v)
		case "timings":
			parseLlamaTimings(v, c)
		case "error":
			c.Error = true
			if isObject(v) {
				parseError(v, c)
			} else {
				c.ErrorType = []byte("error")
			}
		default:
			counts.member(&usageLlamaCpp, k, v)
		}
		return true
	})
	if !ok {
		return false
	}
	counts.set(c)
	if c.TokensFrom == SourceNone && probs > 0 && c.Output {
		c.Tokens, c.TokensFrom = int64(probs), SourceLogprobs
	}
	if !c.Output {
		c.Tokens, c.TokensFrom = 0, SourceNone
	}
	return true
}

// usageLlamaCpp: the counts at the top level of every payload; the
// cached input is timings.cache_n (parseLlamaTimings).
var usageLlamaCpp = Usage{Input: []string{"tokens_evaluated"}, Output: []string{"tokens_predicted"}}

// parseLlamaTimings reads llama.cpp's timings object (result_timings):
// prompt_ms and predicted_ms are the engine's prefill and decode times,
// cache_n the prompt tokens reused from its cache.
func parseLlamaTimings(v []byte, c *Chunk) {
	eachMember(v, func(k, v []byte) bool {
		switch string(k) {
		case "prompt_ms":
			c.Engine.setMillis(EnginePrompt, v)
		case "predicted_ms":
			c.Engine.setMillis(EngineDecode, v)
		case "cache_n":
			if n, ok := intVal(v); ok && n > 0 {
				c.CachedTokens = n
			}
		}
		return true
	})
}
