package stream

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseFormats(t *testing.T) {
	cases := []struct {
		name string
		f    Format
		in   string
		want func(c *Chunk) bool
	}{
		// Responses
		{"responses: empty delta is no token", FormatResponses, `{"type":"response.output_text.delta","delta":"","sequence_number":3}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"responses: type after the delta", FormatResponses, `{"delta":"x","logprobs":[{"token":"x"},{"token":"y"}],"type":"response.output_text.delta"}`,
			func(c *Chunk) bool { return c.Output && c.Tokens == 2 && c.TokensFrom == SourceLogprobs }},
		{"responses: tool arguments", FormatResponses, `{"type":"response.function_call_arguments.delta","delta":"{\"a\""}`,
			func(c *Chunk) bool { return c.Output }},
		{"responses: reasoning text", FormatResponses, `{"type":"response.reasoning_text.delta","delta":"hmm"}`,
			func(c *Chunk) bool { return c.Reasoning && !c.Output }},
		{"responses: incomplete", FormatResponses, `{"type":"response.incomplete","response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":16,"input_tokens_details":{"cached_tokens":2}}}}`,
			func(c *Chunk) bool {
				return c.Done && string(c.FinishReason) == "max_output_tokens" && c.CompletionTokens == 16 && c.PromptTokens == 3 && c.CachedTokens == 2
			}},
		{"responses: failed", FormatResponses, `{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"rate_limit_exceeded","message":"x"}}}`,
			func(c *Chunk) bool { return c.Error && c.Rejection() && string(c.ID) == "resp_1" }},
		{"responses: error nested", FormatResponses, `{"type":"error","sequence_number":2,"error":{"code":"unknown-error","message":"Foobar","param":null}}`,
			func(c *Chunk) bool { return c.Error && string(c.ErrorType) == "unknown-error" }},
		{"responses: vllm error code", FormatResponses, `{"type":"error","code":500,"message":"x"}`,
			func(c *Chunk) bool { return c.Error && c.ErrorCode == 500 }},
		{"responses: whole body", FormatResponses, `{"id":"resp_9","object":"response","status":"completed","model":"m","output":[],"usage":{"input_tokens":5,"output_tokens":7}}`,
			func(c *Chunk) bool {
				return c.Done && c.Usage && c.CompletionTokens == 7 && string(c.ID) == "resp_9" && string(c.FinishReason) == "completed"
			}},
		// llama.cpp's last event (ggml-org/llama.cpp
		// tools/server/server-task.cpp, to_json_oaicompat_resp_stream:
		// "timings" beside the response, as on its chat stream).
		{"responses: llama.cpp timings on response.completed", FormatResponses, `{"type":"response.completed","response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"m","output":[],` +
			`"usage":{"input_tokens":12,"output_tokens":4,"total_tokens":16,"input_tokens_details":{"cached_tokens":3}}},` +
			`"timings":{"cache_n":3,"prompt_n":9,"prompt_ms":41.5,"prompt_per_token_ms":4.6,"prompt_per_second":216.8,"predicted_n":4,"predicted_ms":80.25,"predicted_per_token_ms":20.06,"predicted_per_second":49.8}}`,
			func(c *Chunk) bool {
				return c.Done && c.Engine.Known == EnginePrompt|EngineDecode && c.Engine.Prompt == 41500*time.Microsecond &&
					c.Engine.Decode == 80250*time.Microsecond && c.CachedTokens == 3 && c.PromptTokens == 12 && c.CompletionTokens == 4
			}},
		{"responses: http error body", FormatResponses, `{"error":{"message":"model not found","type":"not_found_error","param":null,"code":null}}`,
			func(c *Chunk) bool { return c.Error && string(c.ErrorType) == "not_found_error" }},
		{"responses: created has no usage", FormatResponses, `{"type":"response.created","response":{"id":"resp_1","usage":null,"status":"in_progress"}}`,
			func(c *Chunk) bool {
				return !c.Usage && !c.Done && string(c.ID) == "resp_1" && len(c.FinishReason) == 0
			}},
		// Messages
		{"messages: empty text delta", FormatMessages, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"messages: signature is no token", FormatMessages, `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"messages: ping", FormatMessages, `{"type": "ping"}`, func(c *Chunk) bool { return !c.TokenBearing() && !c.Done && !c.Error }},
		{"messages: start output is a placeholder", FormatMessages, `{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":10,"output_tokens":1}}}`,
			func(c *Chunk) bool { return !c.Usage && c.HasPrompt && c.PromptTokens == 10 }},
		{"messages: delta usage", FormatMessages, `{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":15}}`,
			func(c *Chunk) bool {
				return c.Usage && c.CompletionTokens == 15 && !c.HasPrompt && string(c.FinishReason) == "max_tokens"
			}},
		{"messages: whole body", FormatMessages, `{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":4,"output_tokens":2}}`,
			func(c *Chunk) bool {
				return c.Done && c.CompletionTokens == 2 && c.PromptTokens == 4 && string(c.ID) == "msg_2"
			}},
		{"messages: http error body", FormatMessages, `{"type":"error","error":{"type":"not_found_error","message":"model \"x\" not found"}}`,
			func(c *Chunk) bool { return c.Error && !c.Rejection() && string(c.ErrorType) == "not_found_error" }},
		{"messages: rate limit", FormatMessages, `{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`,
			func(c *Chunk) bool { return c.Error && c.Rejection() }},
		// Ollama
		{"ollama: tool calls", FormatOllama, `{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}`,
			func(c *Chunk) bool { return c.Output }},
		{"ollama: logprobs", FormatOllama, `{"model":"m","response":"ab","logprobs":[{"token":"a","logprob":-1},{"token":"b","logprob":-1}],"done":false}`,
			func(c *Chunk) bool { return c.Output && c.Tokens == 2 && c.TokensFrom == SourceLogprobs }},
		{"ollama: done with eval_count omitted", FormatOllama, `{"model":"m","response":"","done":true,"done_reason":"stop","total_duration":5}`,
			func(c *Chunk) bool {
				return c.Done && c.Usage && c.CompletionTokens == 0 && c.Engine.Known == EngineTotal
			}},
		{"ollama: not done has no usage", FormatOllama, `{"model":"m","response":"x","done":false}`,
			func(c *Chunk) bool { return !c.Usage && !c.Done && c.Output }},
		{"ollama: http error body", FormatOllama, `{"error":"model 'x' not found"}`, func(c *Chunk) bool { return c.Error && !c.Rejection() }},
		// TGI
		{"tgi: whole generate body", FormatTGI, `{"generated_text":"Hi","details":{"finish_reason":"length","generated_tokens":4,"seed":null,"prefill":[],"tokens":[{"id":1,"text":"a","logprob":0,"special":false}]}}`,
			func(c *Chunk) bool {
				return c.Done && c.Usage && c.CompletionTokens == 4 && string(c.FinishReason) == "length" && !c.Output
			}},
		{"tgi: validation error", FormatTGI, `{"error":"Input validation error","error_type":"validation"}`,
			func(c *Chunk) bool { return c.Error && !c.Rejection() && string(c.ErrorType) == "validation" }},
		{"tgi: error type first", FormatTGI, `{"error_type":"overloaded","error":"busy"}`, func(c *Chunk) bool { return c.Error && c.Rejection() }},
		// llama.cpp
		{"llamacpp: return_tokens", FormatLlamaCpp, `{"index":0,"content":"ab","tokens":[5,6],"stop":false,"tokens_predicted":2}`,
			func(c *Chunk) bool { return c.Output && c.Tokens == 2 && c.TokensFrom == SourceTokenIDs && c.Usage }},
		{"llamacpp: probabilities", FormatLlamaCpp, `{"content":"a","stop":false,"completion_probabilities":[{"id":5,"token":"a","logprob":-0.1}]}`,
			func(c *Chunk) bool { return c.Tokens == 1 && c.TokensFrom == SourceLogprobs }},
		{"llamacpp: empty content is no token", FormatLlamaCpp, `{"content":"","tokens":[7],"stop":false}`,
			func(c *Chunk) bool { return !c.TokenBearing() && c.Tokens == 0 }},
		{"llamacpp: error", FormatLlamaCpp, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`,
			func(c *Chunk) bool { return c.Error && c.Rejection() && c.ErrorCode == 503 }},
		{"llamacpp: timings exponent", FormatLlamaCpp, `{"content":"","stop":true,"timings":{"prompt_ms":1.5e1,"predicted_ms":2}}`,
			func(c *Chunk) bool {
				return c.Done && c.Engine.Prompt == 15*time.Millisecond && c.Engine.Decode == 2*time.Millisecond
			}},
		// tools/server/README.md, /completion: "Multiple prompts are also
		// supported. In this case, the completion result will be an array."
		{"llamacpp: several prompts' results pooled", FormatLlamaCpp, `[{"index":0,"content":"Paris","tokens":[],"id_slot":0,"stop":true,"model":"m","tokens_predicted":3,"tokens_evaluated":7,"stop_type":"eos","stopping_word":"","tokens_cached":9,"timings":{"cache_n":2,"prompt_ms":5.5,"predicted_ms":9}},` +
			`{"index":1,"content":"Rome","tokens":[],"id_slot":1,"stop":true,"model":"m","tokens_predicted":4,"tokens_evaluated":8,"stop_type":"limit","stopping_word":"","tokens_cached":11,"timings":{"cache_n":3,"prompt_ms":6,"predicted_ms":12}}]`,
			func(c *Chunk) bool {
				return !c.Malformed && c.Done && c.Output && c.Usage && c.CompletionTokens == 7 && c.PromptTokens == 15 && c.CachedTokens == 5 &&
					string(c.FinishReason) == "limit" && string(c.Model) == "m" && c.Engine.Known == 0
			}},
		{"llamacpp: a result still going is no end", FormatLlamaCpp, `[{"content":"a","stop":true},{"content":"b","stop":false}]`,
			func(c *Chunk) bool { return !c.Malformed && !c.Done && c.Output }},
		{"llamacpp: an array holding a non-object", FormatLlamaCpp, `[{"content":"a","stop":true},3]`,
			func(c *Chunk) bool { return c.Malformed && !c.Done && !c.Output }},
		{"openai: llama.cpp timings on the last chunk", FormatOpenAI, `{"choices":[],"usage":{"completion_tokens":2,"prompt_tokens":3},"timings":{"prompt_ms":4.25,"predicted_ms":8}}`,
			func(c *Chunk) bool { return c.UsageOnly() && c.Engine.Prompt == 4250*time.Microsecond }},
		// every format: the [DONE] marker and malformed payloads
		{"responses: [DONE]", FormatResponses, `[DONE]`, func(c *Chunk) bool { return c.Done }},
		{"messages: [DONE] (vLLM after an error)", FormatMessages, `[DONE]`, func(c *Chunk) bool { return c.Done }},
		{"ollama: malformed", FormatOllama, `{"done":tru`, func(c *Chunk) bool { return c.Malformed }},
		{"tgi: malformed", FormatTGI, `data`, func(c *Chunk) bool { return c.Malformed }},
		{"llamacpp: malformed", FormatLlamaCpp, `[1]`, func(c *Chunk) bool { return c.Malformed }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Chunk
			Parse(tc.f, []byte(tc.in), &c)
			if !tc.want(&c) {
				t.Fatalf("Parse(%v, %q) = %+v", tc.f, tc.in, c)
			}
		})
	}
}

// Every adapter reads a token event without allocating (the hot path's
// rule: docs/design.md, no allocation per token).
func TestParseFormatsZeroAllocs(t *testing.T) {
	events := map[Format]string{
		FormatOpenAI:    `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}`,
		FormatResponses: `{"content_index":0,"delta":" hello","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`,
		FormatMessages:  `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" hello"}}`,
		FormatOllama:    `{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":" hello"},"done":false}`,
		FormatTGI:       `{"index":3,"token":{"id":22557,"text":" hello","logprob":-0.31,"special":false},"generated_text":null,"details":null}`,
		FormatLlamaCpp:  `{"index":0,"content":" hello","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":3,"tokens_evaluated":12}`,
	}
	for f, ev := range events {
		data := []byte(ev)
		var c Chunk
		Parse(f, data, &c)
		if !c.Output {
			t.Fatalf("%v: %q is not read as output", f, ev)
		}
		if n := testing.AllocsPerRun(1000, func() { Parse(f, data, &c) }); n != 0 {
			t.Errorf("%v: %.1f allocations per event", f, n)
		}
	}
}

func TestLineFramer(t *testing.T) {
	in := "{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\":3}"
	type ev struct {
		data       string
		start, end int64
		partial    bool
	}
	frame := func(parts ...string) []ev {
		var f LineFramer
		var out []ev
		on := func(e *Event) { out = append(out, ev{string(e.Data), e.Start, e.End, e.Partial}) }
		for _, p := range parts {
			f.Feed([]byte(p), on)
		}
		f.Finish(on)
		return out
	}
	want := []ev{{`{"a":1}`, 0, 8, false}, {`{"b":2}`, 13, 22, false}, {`{"c":3}`, 22, 29, true}}
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			got := frame(in[:i], in[i:j], in[j:])
			if len(got) != len(want) {
				t.Fatalf("split %d,%d: %+v", i, j, got)
			}
			for k := range got {
				if got[k] != want[k] {
					t.Fatalf("split %d,%d: line %d %+v, want %+v", i, j, k, got[k], want[k])
				}
			}
		}
	}
}

func TestLineFramerBound(t *testing.T) {
	f := LineFramer{MaxLineBytes: 8}
	var got []string
	on := func(e *Event) { got = append(got, string(e.Data)) }
	f.Feed([]byte("short\n0123456789"), on)
	f.Feed([]byte("0123\nok\n"), on)
	f.Finish(on)
	if f.Oversized != 1 || strings.Join(got, ",") != "short,ok" {
		t.Fatalf("oversized=%d lines %q, want the long line dropped", f.Oversized, got)
	}
	f = LineFramer{MaxLineBytes: 8}
	got = nil
	f.Feed([]byte("0123456789\nok\n0123456789\n"), on) // over the bound within one read, twice
	if f.Oversized != 2 || strings.Join(got, ",") != "ok" {
		t.Fatalf("oversized=%d lines %q", f.Oversized, got)
	}
}

func TestLineFramerZeroAllocs(t *testing.T) {
	line := []byte(`{"model":"m","message":{"role":"assistant","content":"x"},"done":false}` + "\n")
	var f LineFramer
	n := 0
	on := func(*Event) { n++ }
	f.Feed(line[:10], on)
	f.Feed(line[10:], on)
	if a := testing.AllocsPerRun(1000, func() { f.Feed(line[:10], on); f.Feed(line[10:], on) }); a != 0 {
		t.Fatalf("%.1f allocations per line", a)
	}
}

// fuzzFormat checks an adapter against encoding/json on what every
// adapter must agree on: a well-formed JSON object is never malformed,
// anything else (but "[DONE]") always is, and parsing never panics.
func fuzzFormat(t *testing.T, f Format, data []byte) {
	var c Chunk
	Parse(f, data, &c)
	if bytes.Equal(trimWS(data), doneMarker) {
		if !c.Done {
			t.Fatalf("%q: [DONE] not read as the end", data)
		}
		return
	}
	// The scanner checks structure, not the grammar of strings and
	// numbers (json.go): only valid JSON is held to agree.
	if json.Valid(data) {
		var top map[string]json.RawMessage
		isObj := json.Unmarshal(data, &top) == nil && top != nil
		if isObj == c.Malformed {
			t.Fatalf("%v %q: malformed=%v, encoding/json says object=%v", f, data, c.Malformed, isObj)
		}
	}
	if c.Malformed && (c.TokenBearing() || c.Done || c.Usage) {
		t.Fatalf("%v %q: a malformed payload says something: %+v", f, data, c)
	}
	if c.Tokens < 0 || (c.Tokens > 0 && c.TokensFrom == SourceNone) {
		t.Fatalf("%v %q: tokens %d from %v", f, data, c.Tokens, c.TokensFrom)
	}
}

func addSeeds(f *testing.F, file string, ndjson bool) {
	b, err := readFixture(file)
	if err != nil {
		f.Fatal(err)
	}
	on := func(e *Event) { f.Add(bytes.Clone(e.Data)) }
	if ndjson {
		var lf LineFramer
		lf.Feed(b, on)
		lf.Finish(on)
		return
	}
	var fr Framer
	fr.Feed(b, on)
	fr.Finish(on)
}

func FuzzParseResponses(f *testing.F) {
	addSeeds(f, "responses_ollama.sse", false)
	addSeeds(f, "responses_openai_error.sse", false)
	f.Fuzz(func(t *testing.T, data []byte) { fuzzFormat(t, FormatResponses, data) })
}

func FuzzParseMessages(f *testing.F) {
	addSeeds(f, "messages_ollama.sse", false)
	addSeeds(f, "messages_anthropic_overloaded.sse", false)
	f.Fuzz(func(t *testing.T, data []byte) { fuzzFormat(t, FormatMessages, data) })
}

func FuzzParseOllama(f *testing.F) {
	addSeeds(f, "ollama_chat.ndjson", true)
	addSeeds(f, "ollama_generate.ndjson", true)
	addSeeds(f, "ollama_generate_error.ndjson", true)
	f.Fuzz(func(t *testing.T, data []byte) { fuzzFormat(t, FormatOllama, data) })
}

func FuzzParseTGI(f *testing.F) {
	addSeeds(f, "tgi_generate_stream.sse", false)
	addSeeds(f, "tgi_generate_stream_overloaded.sse", false)
	f.Fuzz(func(t *testing.T, data []byte) { fuzzFormat(t, FormatTGI, data) })
}

func FuzzParseLlamaCpp(f *testing.F) {
	addSeeds(f, "llamacpp_completion.sse", false)
	f.Add([]byte(`[{"content":"a","stop":true,"tokens_predicted":1},{"content":"b","stop":true,"tokens_predicted":2}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzArrayFormat(t, FormatLlamaCpp, data) // several prompts' results
		fuzzFormat(t, FormatOpenAI, data)        // the OpenAI adapter hands native payloads over
	})
}

// FuzzLineFramer: however a stream is split into reads, the lines are the
// same, each line's range holds exactly its bytes (and its LF), and the
// ranges never overlap.
func FuzzLineFramer(f *testing.F) {
	for _, s := range []string{"{\"a\":1}\n{\"b\":2}\n", "a\r\nb\n\n\nc", "\n\n", "x", "{}\r\n  \n{}"} {
		f.Add([]byte(s), uint16(1), uint16(4))
	}
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16) {
		type ev struct {
			data       string
			start, end int64
			partial    bool
		}
		frame := func(parts ...[]byte) []ev {
			var lf LineFramer
			var out []ev
			on := func(e *Event) { out = append(out, ev{string(e.Data), e.Start, e.End, e.Partial}) }
			for _, p := range parts {
				lf.Feed(p, on)
			}
			lf.Finish(on)
			return out
		}
		whole := frame(in)
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		split := frame(in[:i], in[i:j], in[j:])
		if len(whole) != len(split) {
			t.Fatalf("%q split at %d,%d: %d lines, whole %d", in, i, j, len(split), len(whole))
		}
		var prev int64
		for k := range whole {
			w := whole[k]
			if w != split[k] {
				t.Fatalf("%q split at %d,%d: line %d %+v, whole %+v", in, i, j, k, split[k], w)
			}
			if w.start < prev || w.end > int64(len(in)) || !bytes.HasPrefix(in[w.start:w.end], []byte(w.data)) {
				t.Fatalf("%q: bad range %+v", in, w)
			}
			prev = w.end
		}
	})
}
