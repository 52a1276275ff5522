package stream

import "testing"

// The one usage reader: members named, nested ("a.b"), summed, and set
// only when one of them is an integer.
func TestReadUsage(t *testing.T) {
	u := Usage{Input: []string{"in", "cache_in"}, Cached: []string{"details.cached"},
		Output: []string{"out"}, Reasoning: []string{"thoughts"}}
	cases := []struct {
		obj  string
		want Chunk
	}{
		{`{"in":3,"cache_in":4,"details":{"cached":4,"other":1},"out":5,"thoughts":2}`,
			Chunk{HasPrompt: true, PromptTokens: 7, CachedTokens: 4, Usage: true, CompletionTokens: 7}},
		{`{"thoughts":2}`, Chunk{Usage: true, CompletionTokens: 2}},
		{`{"in":null,"out":"5","details":[1],"other":9}`, Chunk{}},
		{`{"cache_in":0}`, Chunk{HasPrompt: true}},
		{`{}`, Chunk{}},
	}
	for _, tc := range cases {
		var c Chunk
		readUsage(&u, []byte(tc.obj), &c)
		if c.HasPrompt != tc.want.HasPrompt || c.PromptTokens != tc.want.PromptTokens || c.CachedTokens != tc.want.CachedTokens ||
			c.Usage != tc.want.Usage || c.CompletionTokens != tc.want.CompletionTokens {
			t.Errorf("%s: %+v, want %+v", tc.obj, c, tc.want)
		}
	}
	var c Chunk
	c.CachedTokens = 9
	readUsage(&usageMessagesStart, []byte(`{"input_tokens":10,"output_tokens":1}`), &c)
	if !c.HasPrompt || c.PromptTokens != 10 || c.Usage || c.CachedTokens != 9 {
		t.Errorf("message_start: %+v: its output_tokens is a placeholder, the absent cached count is kept", c)
	}
}

// Reading usage allocates nothing either: vLLM's continuous usage stats
// put it on every event.
func TestReadUsageZeroAllocs(t *testing.T) {
	events := map[Format]string{
		FormatOpenAI:    `{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`,
		FormatResponses: `{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":9,"output_tokens":1,"input_tokens_details":{"cached_tokens":4}}}}`,
		FormatMessages:  `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":5,"cache_read_input_tokens":4,"output_tokens":1}}`,
		FormatOllama:    `{"message":{"content":""},"done":true,"prompt_eval_count":9,"eval_count":1}`,
		FormatTGI:       `{"token":{"id":1,"text":"a","special":false},"generated_text":"a","details":{"finish_reason":"length","generated_tokens":1,"input_length":9}}`,
		FormatLlamaCpp:  `{"content":"","stop":true,"tokens_predicted":1,"tokens_evaluated":9,"timings":{"cache_n":4}}`,
		FormatGemini:    `{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":9,"cachedContentTokenCount":4,"candidatesTokenCount":1,"thoughtsTokenCount":2}}`,
	}
	for f, ev := range events {
		data := []byte(ev)
		var c Chunk
		Parse(f, data, &c)
		if !c.Usage || !c.HasPrompt || c.PromptTokens != 9 {
			t.Fatalf("%v: %q: usage not read: %+v", f, ev, c)
		}
		if n := testing.AllocsPerRun(1000, func() { Parse(f, data, &c) }); n != 0 {
			t.Errorf("%v: %.1f allocations per event", f, n)
		}
	}
}
