package stream

import (
	"encoding/json"
	"testing"
)

// Gemini payloads, shaped after https://ai.google.dev/api/generate-content
// (GenerateContentResponse, UsageMetadata) and Google's error object.
func TestParseGemini(t *testing.T) {
	cases := []struct {
		name, in string
		want     func(c *Chunk) bool
	}{
		{"thought part is reasoning", `{"candidates":[{"content":{"parts":[{"text":"hmm","thought":true}],"role":"model"},"index":0}]}`,
			func(c *Chunk) bool { return c.Reasoning && !c.Output && !c.Usage && c.Choices == -1 }},
		{"text part is output", `{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"index":0}],"usageMetadata":{"promptTokenCount":4,"totalTokenCount":4},"modelVersion":"gemini-2.0-flash","responseId":"r1"}`,
			func(c *Chunk) bool {
				return c.Output && !c.Reasoning && c.HasPrompt && c.PromptTokens == 4 && !c.Usage && string(c.Model) == "gemini-2.0-flash" && string(c.ID) == "r1"
			}},
		{"empty text is no token", `{"candidates":[{"content":{"parts":[{"text":""}],"role":"model"},"index":0}]}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"thought signature alone is no token", `{"candidates":[{"content":{"parts":[{"thoughtSignature":"CiQB"}],"role":"model"},"index":0}]}`,
			func(c *Chunk) bool { return !c.TokenBearing() }},
		{"function call is output", `{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"a":1}}}],"role":"model"},"index":0}]}`,
			func(c *Chunk) bool { return c.Output }},
		{"last chunk: finish reason, output = candidates + thoughts", `{"candidates":[{"content":{"parts":[{"text":"!"}],"role":"model"},"finishReason":"MAX_TOKENS","index":0}],"usageMetadata":{"promptTokenCount":9,"cachedContentTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":37,"thoughtsTokenCount":25}}`,
			func(c *Chunk) bool {
				return c.Output && string(c.FinishReason) == "MAX_TOKENS" && c.Usage && c.CompletionTokens == 28 && c.PromptTokens == 9 && c.CachedTokens == 5 && !c.Done
			}},
		{"blocked prompt", `{"promptFeedback":{"blockReason":"SAFETY","safetyRatings":[]},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8}}`,
			func(c *Chunk) bool { return string(c.FinishReason) == "SAFETY" && !c.TokenBearing() && !c.Error }},
		{"error", `{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}`,
			func(c *Chunk) bool {
				return c.Error && c.ErrorCode == 429 && string(c.ErrorType) == "RESOURCE_EXHAUSTED" && c.Rejection()
			}},
		{"internal error is no rejection", `{"error":{"code":500,"message":"x","status":"INTERNAL"}}`,
			func(c *Chunk) bool { return c.Error && c.ErrorCode == 500 && !c.Rejection() }},
		{"array body (no alt=sse): elements pooled", `[{"candidates":[{"content":{"parts":[{"text":"a","thought":true}]}}]},{"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":1}}]`,
			func(c *Chunk) bool {
				return c.Output && c.Reasoning && string(c.FinishReason) == "STOP" && c.CompletionTokens == 1 && c.PromptTokens == 2
			}},
		{"array with a non-object", `[{"candidates":[]},3]`, func(c *Chunk) bool { return c.Malformed && !c.TokenBearing() }},
		{"not JSON", `{"candidates":[`, func(c *Chunk) bool { return c.Malformed }},
	}
	for _, tc := range cases {
		var c Chunk
		Parse(FormatGemini, []byte(tc.in), &c)
		if !tc.want(&c) {
			t.Errorf("%s: %+v", tc.name, c)
		}
	}
}

// The recorded streams: token events, the end, the counts; the answer
// text without the thoughts.
func TestGeminiFixtures(t *testing.T) {
	b, err := readFixture("gemini_stream.sse")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var last Chunk
	var fr Framer
	on := func(e *Event) {
		Parse(FormatGemini, e.Data, &last)
		switch {
		case last.Reasoning:
			kinds = append(kinds, "reasoning")
		case last.Output:
			kinds = append(kinds, "output")
		}
	}
	fr.Feed(b, on)
	fr.Finish(on)
	if got := len(kinds); got != 3 || kinds[0] != "reasoning" || kinds[1] != "output" {
		t.Fatalf("token events %v", kinds)
	}
	if string(last.FinishReason) != "STOP" || last.CompletionTokens != 28 || last.PromptTokens != 9 {
		t.Fatalf("last event %+v", last)
	}
	if got := AnswerTextOf(FormatOfAPI(NameGemini), b, true); got != "Hello there!" {
		t.Fatalf("answer %q", got)
	}
	whole := `{"candidates":[{"content":{"parts":[{"text":"plan","thought":true},{"text":"Paris"}],"role":"model"},"finishReason":"STOP","index":0}]}`
	if got := AnswerTextOf(FormatGemini, []byte(whole), false); got != "Paris" {
		t.Fatalf("whole body answer %q", got)
	}
	if got := AnswerTextOf(FormatGemini, []byte("["+whole+","+whole+"]"), false); got != "ParisParis" {
		t.Fatalf("array body answer %q", got)
	}
}

// Routes, the model from the path, and the zero allocations of the
// adapter.
func TestGeminiAPI(t *testing.T) {
	for path, want := range map[string]*API{
		"/v1beta/models/gemini-2.5-flash:streamGenerateContent": APIGemini,
		"/v1/models/gemini-2.0-flash:generateContent":           APIGemini,
		"/v1beta/models/gemini-2.0-flash:countTokens":           APIOther,
	} {
		if got := Classify(path, ""); got != want {
			t.Errorf("Classify(%s) = %s", path, got.Name)
		}
	}
	if m := APIGemini.Request.ModelFromPath("/v1beta/tunedModels/my-model:generateContent"); m != "my-model" {
		t.Errorf("model %q", m)
	}
	data := []byte(`{"candidates": [{"content": {"parts": [{"text": " x"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "r"}`)
	var c Chunk
	if n := testing.AllocsPerRun(1000, func() { Parse(FormatGemini, data, &c) }); n != 0 {
		t.Fatalf("%.1f allocations per payload", n)
	}
}

// FuzzParseGemini: fuzzFormat's rules, except that a JSON array of
// objects (the body without alt=sse) is well-formed too.
func FuzzParseGemini(f *testing.F) {
	addSeeds(f, "gemini_stream.sse", false)
	addSeeds(f, "gemini_stream_error.sse", false)
	f.Add([]byte(`[{"candidates":[]},{"usageMetadata":{"candidatesTokenCount":1}}]`))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzArrayFormat(t, FormatGemini, data) })
}

// fuzzArrayFormat is fuzzFormat for a format that also reads a JSON
// array of objects, its elements pooled (Gemini's body without alt=sse,
// llama.cpp's results of several prompts): such an array is well-formed.
func fuzzArrayFormat(t *testing.T, f Format, data []byte) {
	if d := trimWS(data); len(d) == 0 || d[0] != '[' {
		fuzzFormat(t, f, data)
		return
	}
	var c Chunk
	Parse(f, data, &c)
	if json.Valid(data) {
		var elems []json.RawMessage
		isObjs := json.Unmarshal(data, &elems) == nil
		for _, e := range elems {
			var m map[string]json.RawMessage
			isObjs = isObjs && json.Unmarshal(e, &m) == nil && m != nil
		}
		if isObjs == c.Malformed {
			t.Fatalf("%v %q: malformed=%v, encoding/json says array of objects=%v", f, data, c.Malformed, isObjs)
		}
	}
	if c.Malformed && (c.TokenBearing() || c.Usage) {
		t.Fatalf("%v %q: a malformed payload says something: %+v", f, data, c)
	}
}

// TestGeminiCandidatesAreMulti: a response of several candidates
// (generationConfig.candidateCount, https://ai.google.dev/api/rest/v1beta/GenerationConfig:
// up to 8; each Candidate has its index) pools their text and calls, so
// the Collector says Multi, as for OpenAI's n > 1: two JSON answers read
// as one text were one invalid JSON. One candidate, with its index 0 or
// without one, and the elements of a streamed array, each one candidate,
// are one answer.
func TestGeminiCandidatesAreMulti(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		multi    bool
	}{
		{"two candidates in a body", `{"candidates": [{"content": {"parts": [{"text": "{\"answer\": \"a\"}"}],"role": "model"},"finishReason": "STOP","avgLogprobs": -0.01},` +
			`{"content": {"parts": [{"text": "{\"answer\": \"b\"}"}],"role": "model"},"finishReason": "STOP","index": 1,"avgLogprobs": -0.02}],` +
			`"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 12,"totalTokenCount": 21},"modelVersion": "gemini-2.5-flash","responseId": "r1"}`, true},
		{"a stream event of the second candidate", `{"candidates": [{"content": {"parts": [{"text": "{\"answer\""}],"role": "model"},"index": 1}],"modelVersion": "gemini-2.5-flash"}`, true},
		{"one candidate, index 0", `{"candidates": [{"content": {"parts": [{"text": "{}"}],"role": "model"},"finishReason": "STOP","index": 0}]}`, false},
		{"one candidate, no index", `{"candidates": [{"content": {"parts": [{"text": "{}"}],"role": "model"},"finishReason": "STOP"}]}`, false},
		{"streamed array, one candidate each", `[{"candidates": [{"content": {"parts": [{"text": "{"}]},"index": 0}]},{"candidates": [{"content": {"parts": [{"text": "}"}]},"finishReason": "STOP","index": 0}]}]`, false},
	} {
		col := NewCollector(1<<10, true)
		var c Chunk
		ParseCollect(FormatGemini, []byte(tc.in), &c, col)
		if c.Malformed || col.Multi() != tc.multi {
			t.Errorf("%s: malformed %v, multi %v, want %v", tc.name, c.Malformed, col.Multi(), tc.multi)
		}
		col.Release()
	}
}
