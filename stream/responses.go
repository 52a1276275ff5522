package stream

import "bytes"

// ParseResponses reads one OpenAI Responses API payload into c: the data
// of one typed SSE event of POST /v1/responses with "stream":true, or a
// whole non-streaming response object. It never allocates.
//
// Sources: the ResponseStreamEvent union of OpenAI's API
// (openai/openai-openapi openapi.yaml: ResponseTextDeltaEvent,
// ResponseReasoningTextDeltaEvent, ResponseCompletedEvent,
// ResponseIncompleteEvent, ResponseFailedEvent, ResponseErrorEvent, and
// the Response object with its ResponseUsage), and two servers of it:
// Ollama v0.17.4 (openai/responses.go, ResponsesStreamConverter: the
// sequence response.created, response.in_progress, output_item and
// content_part events, response.output_text.delta..., response.completed
// with usage) and vLLM (vllm/entrypoints/openai/responses; "event: {type}"
// and no "[DONE]"). Every event repeats its type in the payload, so the
// SSE event name is not needed.
//
// What counts:
//   - output: response.output_text.delta, response.refusal.delta,
//     response.function_call_arguments.delta and the other deltas of
//     generated text (custom tool input, code interpreter code, MCP call
//     arguments, audio transcript), when their delta is not empty;
//     logprobs on an output_text delta give its token count;
//   - reasoning: response.reasoning_text.delta and
//     response.reasoning_summary_text.delta;
//   - the end: response.completed and response.incomplete (Done), with
//     response.usage (input_tokens, output_tokens,
//     input_tokens_details.cached_tokens) and a finish reason: the
//     incomplete_details.reason, else the status ("completed");
//   - the engine's times: llama.cpp's "timings" object beside the event
//     (on response.completed, on every event with timings_per_token;
//     ggml-org/llama.cpp tools/server/server-task.cpp,
//     to_json_oaicompat_resp_stream), read as on its chat stream
//     (parseLlamaTimings): prompt_ms and predicted_ms;
//   - errors: the "error" event (code and message, at the top level as
//     the schema has them or under "error" as some servers send them)
//     and response.failed (response.error.code); an HTTP error body
//     {"error":{...}}.
//
// The response id (resp_...) and model come from the response object of
// response.created (and of the terminal event).
func ParseResponses(data []byte, c *Chunk) { parseResponses(data, c, nil) }

// parseResponses is ParseResponses, writing to t (when not nil) the
// answer text: the response.output_text.delta deltas, or a whole
// response's output_text parts of its message items (not the refusals
// nor the reasoning); and the function calls, a stream's keyed by their
// output_index. llama.cpp's stream names none
// (ggml-org/llama.cpp tools/server/server-task.cpp,
// to_json_oaicompat_resp: output_item.added and
// function_call_arguments.delta carry the item and its item_id, no
// output_index) and sends each call whole before the next: there an
// output_item.added begins a new call and a delta continues the call
// begun last (keyed 0, two parallel calls were one, their arguments two
// objects end to end).
func parseResponses(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	var typ, object, delta, logprobs, resp, errv, code, item, outIndex []byte
	ok := eachMember(d, func(k, v []byte) bool {
		switch string(k) {
		case "item":
			item = v
		case "output_index":
			outIndex = v
		case "type":
			typ, _ = strVal(v)
		case "object":
			object, _ = strVal(v)
		case "delta":
			delta = v
		case "logprobs":
			logprobs = v
		case "response":
			resp = v
		case "error":
			errv = v
		case "code":
			code = v
		case "timings": // llama.cpp (ParseResponses)
			parseLlamaTimings(v, c)
		}
		return true
	})
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	switch string(typ) {
	case "response.output_text.delta":
		if t != nil {
			t.add(delta)
		}
		if nonEmptyStr(delta) {
			c.Output = true
			if n := countElements(logprobs); n > 0 {
				c.Tokens, c.TokensFrom = int64(n), SourceLogprobs
			}
		}
	case "response.function_call_arguments.delta":
		c.Output = nonEmptyStr(delta)
		if t != nil {
			t.callArgs(callKey(outIndex, t.lastKey(0)), delta, true)
		}
	case "response.output_item.added":
		if t != nil {
			responsesCall(item, callKey(outIndex, newCall), t)
		}
	case "response.refusal.delta",
		"response.custom_tool_call_input.delta", "response.code_interpreter_call_code.delta",
		"response.mcp_call_arguments.delta", "response.audio.transcript.delta":
		c.Output = nonEmptyStr(delta)
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		c.Reasoning = nonEmptyStr(delta)
	case "response.created", "response.in_progress", "response.queued":
		parseResponseObject(resp, c, nil)
	case "response.completed", "response.incomplete":
		status, reason := parseResponseObject(resp, c, nil)
		c.Done = true
		c.FinishReason = status
		if len(reason) > 0 {
			c.FinishReason = reason
		}
	case "response.failed":
		parseResponseObject(resp, c, nil)
		c.Error = true
		if c.ErrorType == nil {
			c.ErrorType = []byte("failed")
		}
	case "error":
		c.Error = true
		if isObject(errv) {
			parseError(errv, c)
		}
		if s, ok := strVal(code); ok && len(s) > 0 && c.ErrorType == nil {
			c.ErrorType = s
		} else if n, ok := intVal(code); ok && c.ErrorCode == 0 {
			c.ErrorCode = n
		}
		if c.ErrorType == nil {
			c.ErrorType = []byte("error")
		}
	case "":
		switch {
		case string(object) == "response": // a whole non-streaming response
			status, reason := parseResponseObject(d, c, t)
			switch string(status) {
			case "failed":
				c.Error = true
			case "completed", "incomplete":
				c.Done = true
				c.FinishReason = status
				if len(reason) > 0 {
					c.FinishReason = reason
				}
			}
		case len(errv) > 0 && string(errv) != "null": // an HTTP error body
			c.Error = true
			if _, ok := strVal(errv); ok {
				c.ErrorType = []byte("error")
			} else {
				parseError(errv, c)
			}
		}
	}
}

// parseResponseObject reads a Responses API response object: id, model,
// usage, error, and the answer text of its output into t when t is not
// nil; it returns its status and incomplete_details.reason.
func parseResponseObject(v []byte, c *Chunk, t *Collector) (status, reason []byte) {
	eachMember(v, func(k, v []byte) bool {
		switch string(k) {
		case "output":
			if t != nil {
				responseOutputText(v, t)
			}
		case "id":
			c.ID, _ = strVal(v)
		case "model":
			c.Model, _ = strVal(v)
		case "status":
			status, _ = strVal(v)
		case "incomplete_details":
			eachMember(v, func(k, v []byte) bool {
				if string(k) == "reason" {
					reason, _ = strVal(v)
				}
				return true
			})
		case "usage":
			readUsage(&usageResponses, v, c)
		case "error":
			eachMember(v, func(k, v []byte) bool {
				if string(k) == "code" {
					if s, ok := strVal(v); ok && len(s) > 0 {
						c.ErrorType = s
					}
				}
				return true
			})
		}
		return true
	})
	return status, reason
}

// responseOutputText writes the text of the output_text parts of the
// message items of a response's output to t.
func responseOutputText(output []byte, t *Collector) {
	eachElement(output, func(item []byte) bool {
		var typ, content []byte
		eachMember(item, func(k, v []byte) bool {
			switch string(k) {
			case "type":
				typ, _ = strVal(v)
			case "content":
				content = v
			}
			return true
		})
		if string(typ) == "function_call" {
			responsesCall(item, newCall, t)
			return true
		}
		if string(typ) != "message" {
			return true
		}
		eachElement(content, func(part []byte) bool {
			var typ, text []byte
			eachMember(part, func(k, v []byte) bool {
				switch string(k) {
				case "type":
					typ, _ = strVal(v)
				case "text":
					text = v
				}
				return true
			})
			if string(typ) == "output_text" {
				t.add(text)
			}
			return true
		})
		return true
	})
}

// usageResponses: ResponseUsage (output_tokens includes the
// output_tokens_details.reasoning_tokens).
var usageResponses = Usage{Input: []string{"input_tokens"}, Cached: []string{"input_tokens_details.cached_tokens"},
	Output: []string{"output_tokens"}}

// responsesCall begins a function_call output item (its name, and its
// arguments when the item carries them: a whole response's do, a
// stream's output_item.added has them empty) under the key i, the
// item's output_index (newCall: a new call).
func responsesCall(item []byte, i int64, t *Collector) {
	var typ, name, args []byte
	eachMember(item, func(k, v []byte) bool {
		switch string(k) {
		case "type":
			typ, _ = strVal(v)
		case "name":
			name = v
		case "arguments":
			args = v
		}
		return true
	})
	if string(typ) != "function_call" {
		return
	}
	i = t.callName(i, name)
	t.callArgs(i, args, true)
}

func isObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }
