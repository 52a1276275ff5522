package stream

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestParseOpenAI(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want func(c *Chunk) bool
	}{
		{"done", "[DONE]", func(c *Chunk) bool { return c.Done }},
		{"done with spaces", "  [DONE] ", func(c *Chunk) bool { return c.Done }},
		{"role only is not a token", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			func(c *Chunk) bool { return !c.TokenBearing() && c.Choices == 1 }},
		{"null content is not a token", `{"choices":[{"delta":{"role":"assistant","content":null}}]}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"content", `{"id":"a","model":"m","choices":[{"delta":{"content":"hi"},"finish_reason":null}]}`,
			func(c *Chunk) bool { return c.Output && !c.Reasoning && string(c.ID) == "a" && string(c.Model) == "m" }},
		{"reasoning", `{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`,
			func(c *Chunk) bool { return c.Reasoning && !c.Output && c.TokenBearing() }},
		{"reasoning (new name)", `{"choices":[{"delta":{"reasoning":"hmm"}}]}`, func(c *Chunk) bool { return c.Reasoning }},
		{"tool call args", `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}`,
			func(c *Chunk) bool { return c.Output }},
		// TGI before 3.2.0: one call as an object, not an array (its
		// integration-tests snapshot test_flash_llama_grammar_tools_stream.json
		// at v3.1.0; changed by huggingface/text-generation-inference #3075).
		{"tool call as an object (TGI before 3.2)", `{"choices":[{"delta":{"content":null,"role":"assistant","tool_calls":{"function":{"arguments":"{\"","name":null},"id":"","index":0,"type":"function"}},` +
			`"finish_reason":null,"index":0,"logprobs":null}],"created":1732293235,"id":"","model":"meta-llama/Llama-3.1-8B-Instruct","object":"chat.completion.chunk","system_fingerprint":"2.4.1-dev0-native","usage":null}`,
			func(c *Chunk) bool { return c.Output && c.TokenBearing() && c.Choices == 1 }},
		{"refusal", `{"choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}`,
			func(c *Chunk) bool { return c.Output && c.TokenBearing() }},
		{"empty refusal is not a token", `{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":""}}]}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"null refusal is not a token", `{"choices":[{"delta":{"refusal":null}}]}`, func(c *Chunk) bool { return !c.TokenBearing() }},
		{"choice index", `{"choices":[{"index":3,"delta":{"content":"a"}}]}`,
			func(c *Chunk) bool { return c.Index == 3 && c.Choices == 1 && c.ChoicesData == nil }},
		{"choice index absent", `{"choices":[{"delta":{"content":"a"}}]}`, func(c *Chunk) bool { return c.Index == 0 }},
		{"choice index not an integer", `{"choices":[{"index":"2","delta":{"content":"a"}}]}`, func(c *Chunk) bool { return c.Index == 0 }},
		{"two choices", `{"choices":[{"index":1,"delta":{"content":"a"}},{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			func(c *Chunk) bool {
				return c.Index == 1 && c.Choices == 2 && string(c.ChoicesData) == `[{"index":1,"delta":{"content":"a"}},{"index":0,"delta":{},"finish_reason":"stop"}]`
			}},
		{"empty tool calls", `{"choices":[{"delta":{"tool_calls":[]}}]}`, func(c *Chunk) bool { return !c.Output }},
		{"legacy completions", `{"object":"text_completion","choices":[{"index":0,"text":" x","finish_reason":"length"}]}`,
			func(c *Chunk) bool { return c.Output && string(c.FinishReason) == "length" }},
		{"token ids", `{"choices":[{"delta":{"content":"ab"},"token_ids":[1,2,3]}]}`,
			func(c *Chunk) bool { return c.Tokens == 3 && c.TokensFrom == SourceTokenIDs }},
		{"chat logprobs", `{"choices":[{"delta":{"content":"ab"},"logprobs":{"content":[{"token":"a"},{"token":"b"}]}}]}`,
			func(c *Chunk) bool { return c.Tokens == 2 && c.TokensFrom == SourceLogprobs }},
		{"completions logprobs", `{"choices":[{"text":"ab","logprobs":{"tokens":["a","b"],"token_logprobs":[0,0]}}]}`,
			func(c *Chunk) bool { return c.Tokens == 2 && c.TokensFrom == SourceLogprobs }},
		{"usage only", `{"id":"x","choices":[],"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`,
			func(c *Chunk) bool {
				return c.UsageOnly() && c.PromptTokens == 12 && c.CompletionTokens == 2 && c.CachedTokens == 8
			}},
		{"continuous usage is not usage-only", `{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":5}}`,
			func(c *Chunk) bool { return !c.UsageOnly() && c.Usage && c.Output }},
		{"usage null", `{"choices":[{"delta":{"content":"a"}}],"usage":null}`, func(c *Chunk) bool { return !c.Usage }},
		{"vllm error", `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`,
			func(c *Chunk) bool {
				return c.Error && c.ErrorCode == 500 && string(c.ErrorType) == "InternalServerError" && !c.Rejection()
			}},
		{"old vllm error", `{"object":"error","message":"x","type":"BadRequestError","code":400}`,
			func(c *Chunk) bool { return c.Error && c.ErrorCode == 400 }},
		{"tgi error", `{"error":"Model is overloaded","error_type":"overloaded"}`,
			func(c *Chunk) bool { return c.Error && c.Rejection() }},
		{"tgi openai error", `{"error":{"message":"m","http_status_code":422}}`, func(c *Chunk) bool { return c.Error && c.ErrorCode == 422 }},
		{"overload error", `{"error":{"message":"busy","type":"overloaded","code":503}}`, func(c *Chunk) bool { return c.Error && c.Rejection() }},
		{"code outside error ignored", `{"code":500,"choices":[]}`, func(c *Chunk) bool { return !c.Error && c.ErrorCode == 0 }},
		{"malformed", `{"choices":[`, func(c *Chunk) bool { return c.Malformed }},
		{"not an object", `"hello"`, func(c *Chunk) bool { return c.Malformed }},
		{"trailing garbage", `{"a":1} x`, func(c *Chunk) bool { return c.Malformed }},
		{"mismatched brackets", `{"a":[1}`, func(c *Chunk) bool { return c.Malformed }},
		{"deep nesting is bounded", `{"a":` + string(bytes.Repeat([]byte("["), 5000)) + string(bytes.Repeat([]byte("]"), 5000)) + `}`,
			func(c *Chunk) bool { return c.Malformed }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ch Chunk
			ParseOpenAI([]byte(c.in), &ch)
			if !c.want(&ch) {
				t.Fatalf("ParseOpenAI(%q) = %+v", c.in, ch)
			}
		})
	}
}

// EachChoice reads the choices of one payload one by one: each its own
// index (its position when it has none), output and finish reason.
func TestEachChoice(t *testing.T) {
	type got struct {
		index         int64
		output, think bool
		tokens        int64
		finish        string
	}
	cases := []struct {
		in   string
		want []got
	}{
		{`{"choices":[{"index":1,"delta":{"content":"a"},"token_ids":[4,5]},{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			[]got{{index: 1, output: true, tokens: 2}, {index: 0, finish: "stop"}}},
		{`{"choices":[{"delta":{"reasoning_content":"a"}},7,{"delta":{"refusal":"no"},"finish_reason":"length"}]}`,
			[]got{{index: 0, think: true}, {index: 2, output: true, finish: "length"}}},
		{`{"choices":[{"message":{"content":"a"},"finish_reason":"stop","index":0},{"message":{"content":"b"},"finish_reason":"length","index":1}]}`,
			[]got{{index: 0, output: true, finish: "stop"}, {index: 1, output: true, finish: "length"}}},
	}
	for _, tc := range cases {
		var c, each Chunk
		ParseOpenAI([]byte(tc.in), &c)
		var gots []got
		EachChoice(c.ChoicesData, &each, func(e *Chunk) {
			gots = append(gots, got{e.Index, e.Output, e.Reasoning, e.Tokens, string(e.FinishReason)})
		})
		if len(gots) != len(tc.want) {
			t.Fatalf("%s: %+v, want %+v", tc.in, gots, tc.want)
		}
		for i := range gots {
			if gots[i] != tc.want[i] {
				t.Errorf("%s: choice %d %+v, want %+v", tc.in, i, gots[i], tc.want[i])
			}
		}
	}
	var c Chunk
	EachChoice(nil, &c, func(*Chunk) { t.Fatal("a call for no choices") })
	data := []byte(`[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]`)
	fn := func(*Chunk) {}
	if n := testing.AllocsPerRun(1000, func() { EachChoice(data, &c, fn) }); n != 0 {
		t.Fatalf("EachChoice allocates %.1f times", n)
	}
}

func TestParseOpenAIZeroAllocs(t *testing.T) {
	data := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null,"token_ids":[5]}]}`)
	var c Chunk
	if n := testing.AllocsPerRun(1000, func() { ParseOpenAI(data, &c) }); n != 0 {
		t.Fatalf("ParseOpenAI allocates %.1f times per event", n)
	}
}

// refOutput reads the same facts with encoding/json, through maps so that
// keys match case-sensitively as ParseOpenAI's do (struct decoding would
// match "ChoICes" to "choices").
func refOutput(top map[string]json.RawMessage) (choices int, hasChoices, output bool, usage *int64) {
	var chs []map[string]json.RawMessage
	if raw, ok := top["choices"]; ok {
		hasChoices = json.Unmarshal(raw, &chs) == nil
	}
	nonEmpty := func(raw json.RawMessage) bool {
		var s string
		return json.Unmarshal(raw, &s) == nil && s != ""
	}
	for _, ch := range chs {
		var d map[string]json.RawMessage
		if json.Unmarshal(ch["delta"], &d) == nil {
			var tc []json.RawMessage
			if nonEmpty(d["content"]) || nonEmpty(d["refusal"]) || (json.Unmarshal(d["tool_calls"], &tc) == nil && len(tc) > 0) {
				output = true
			}
		}
		if nonEmpty(ch["text"]) {
			output = true
		}
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(top["usage"], &u) == nil {
		var n int64
		if raw, ok := u["completion_tokens"]; ok && json.Unmarshal(raw, &n) == nil && !bytes.ContainsAny(raw, ".eE") {
			usage = &n
		}
	}
	return len(chs), hasChoices, output, usage
}

func FuzzParseOpenAI(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"delta":{"content":"a"}}]}`, `[DONE]`, `{"choices":[],"usage":{"completion_tokens":3}}`,
		`{"error":{"code":500}}`, `{"choices":[{"text":"x","logprobs":{"tokens":["x"]}}]}`, `{"a":[{"b":{}}],"c":"\"}"}`,
		`{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"refusal":"no"}}]}`,
		`{"choices":[{"index":1,"delta":{"content":"a"}},{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"choices":[{"index":1000000000000000000,"delta":{"content":"a"}}]}`,
		`{"choices":[{"index":999999999999999999,"delta":{"content":"a"}},{"index":1e3,"delta":{}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Chunk
		ParseOpenAI(data, &c) // must not panic
		if !json.Valid(data) || c.Done {
			return
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(data, &top) != nil || top == nil { // null decodes to a nil map
			if !c.Malformed {
				t.Fatalf("%q: not a JSON object, but not malformed", data)
			}
			return
		}
		if c.Malformed {
			t.Fatalf("%q: a valid JSON object parsed as malformed", data)
		}
		if bytes.Contains(data, []byte(`\`)) || bytes.Contains(data, []byte(`"error"`)) || bytes.Contains(data, []byte(`"object"`)) {
			return // escaped keys and error objects: readings need not agree
		}
		n, hasChoices, output, usage := refOutput(top)
		if hasChoices && n != c.Choices {
			t.Fatalf("%q: %d choices, encoding/json says %d", data, c.Choices, n)
		}
		if output && !c.Output {
			t.Fatalf("%q: encoding/json sees output, ParseOpenAI does not", data)
		}
		if usage != nil && *usage < 1e15 && *usage > -1e15 && (!c.Usage || c.CompletionTokens != *usage) {
			t.Fatalf("%q: completion_tokens %d (usage=%v), encoding/json says %d", data, c.CompletionTokens, c.Usage, *usage)
		}
		var chs []map[string]json.RawMessage
		if json.Unmarshal(top["choices"], &chs) == nil && len(chs) > 0 {
			// An index is read when it is an integer of at most 18
			// digits; any other number names no choice (IndexOutOfRange,
			// never 0: issue 40, item 9); anything else is the position.
			var want int64
			if raw, ok := chs[0]["index"]; ok && len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
				if bytes.ContainsAny(raw, ".eE") || json.Unmarshal(raw, &want) != nil || want >= 1e18 || want <= -1e18 {
					want = IndexOutOfRange
				}
			}
			if c.Index != want {
				t.Fatalf("%q: index %d, encoding/json says %d", data, c.Index, want)
			}
		}
		// Read one by one, the choices say what the payload said pooled.
		if (c.ChoicesData != nil) != (c.Choices > 1) {
			t.Fatalf("%q: %d choices, choices data %q", data, c.Choices, c.ChoicesData)
		}
		var each Chunk
		calls, anyOutput, anyReasoning := 0, false, false
		EachChoice(c.ChoicesData, &each, func(e *Chunk) {
			calls++
			anyOutput, anyReasoning = anyOutput || e.Output, anyReasoning || e.Reasoning
		})
		if c.ChoicesData != nil && (calls > c.Choices || anyOutput != c.Output || anyReasoning != c.Reasoning) {
			t.Fatalf("%q: one by one %d choices, output %v reasoning %v; pooled %d, %v, %v",
				data, calls, anyOutput, anyReasoning, c.Choices, c.Output, c.Reasoning)
		}
		if hasChoices && c.ChoicesData != nil && calls != n {
			t.Fatalf("%q: %d object choices one by one, encoding/json says %d", data, calls, n)
		}
	})
}

func FuzzFramer(f *testing.F) {
	for _, s := range []string{
		"data: a\n\n", "data: a\r\n\r\n", "data:a\r\rdata:b\r\r", ": c\n\ndata: x\ndata: y\n\n", "\xEF\xBB\xBFdata: z\n\n",
		"event: error\ndata: {}\n\n", "data: [DONE]", "\n\n\ndata: 1\n\n",
	} {
		f.Add([]byte(s), uint16(3), uint16(7))
	}
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16) {
		whole := frameAll(string(in))
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		split := frameAll(string(in[:i]), string(in[i:j]), string(in[j:]))
		if len(whole) != len(split) {
			t.Fatalf("%q split at %d,%d: %d events, whole: %d", in, i, j, len(split), len(whole))
		}
		// Outside the events' ranges there are only stray blank lines
		// (and a BOM that came first): the ranges tile the stream.
		var at int64
		gap := func(to int64) {
			for ; at < to; at++ {
				if c := in[at]; c != '\r' && c != '\n' && !(at < 3 && bytes.HasPrefix(in, bom)) {
					t.Fatalf("%q: byte %d (%q) belongs to no event %+v", in, at, c, whole)
				}
			}
		}
		for _, w := range whole {
			if w.Start < at {
				t.Fatalf("%q: event %+v overlaps what came before %d", in, w, at)
			}
			gap(w.Start)
			at = w.End
		}
		gap(int64(len(in)))
		var prev int64
		for k := range whole {
			w, s := whole[k], split[k]
			if w.Data != s.Data || w.Name != s.Name || w.HasData != s.HasData || w.Start != s.Start || w.Partial != s.Partial {
				t.Fatalf("%q split at %d,%d: event %d %+v, whole %+v", in, i, j, k, s, w)
			}
			if s.End != w.End && !(s.End+1 == w.End && in[s.End-1] == '\r' && in[s.End] == '\n') {
				t.Fatalf("%q split at %d,%d: event %d ends at %d, whole at %d", in, i, j, k, s.End, w.End)
			}
			if w.Start < prev || w.End < w.Start || w.End > int64(len(in)) {
				t.Fatalf("%q: bad range %+v", in, w)
			}
			prev = w.End
		}
	})
}
