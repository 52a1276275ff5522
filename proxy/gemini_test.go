package proxy

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Gemini (stream/gemini.go) through the real proxy at scripted instants,
// like TestFormatsScripted: TTFT at the thought part, TTFOT at the first
// text part, the gaps, TPOT over candidatesTokenCount+thoughtsTokenCount,
// the finish reason, the model from the path; an error event; a whole
// :generateContent body; an HTTP error. Fixtures: stream/testdata/fixtures
// (README.md cites https://ai.google.dev/api/generate-content).
func TestGeminiScripted(t *testing.T) {
	apiGemini := stream.Name(stream.NameGemini)
	const req = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":64,"temperature":0.5}}`
	cases := []struct {
		name, fixture, path string
		w                   want
	}{
		{"stream", "gemini_stream.sse", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
			want{api: apiGemini, stream: true, outcome: record.Success, finish: "STOP", tokenEvents: []int{0, 1, 2}, firstOutput: 1,
				terminal: -1, in: 9, out: 28, source: "usage", responseID: "mMgcaZ6BNOaFkdUPqZ-pkAs"}},
		{"error event", "gemini_stream_error.sse", "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
			want{api: apiGemini, stream: true, outcome: record.Error, errorType: record.ErrStreamError, errorCode: 500, tokenEvents: []int{0},
				firstOutput: 0, terminal: 1, in: 6, out: 1, source: "events", responseID: "Qk8caYKZL4-vkdUP2c3EgQs"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := fixtureSteps(t, tc.fixture, false, irregular)
			u := &lockstepUp{ct: "text/event-stream", steps: steps}
			r, got := runLockstep(t, u, Options{InjectUsage: true}, tc.path, req)
			if want := string(readFixture(t, tc.fixture)); got != want {
				t.Fatalf("client bytes differ:\n got %q\nwant %q", got, want)
			}
			if b := <-u.body; string(b) != req {
				t.Fatalf("the engine got %q, want the client's body unchanged", b)
			}
			checkRecord(t, r, steps, tc.w)
			if r.Model != "gemini-2.5-flash" && r.Model != "gemini-2.0-flash" || r.TapFailed != "" {
				t.Errorf("model %q tap_failed %q", r.Model, r.TapFailed)
			}
		})
	}
	t.Run("whole body", func(t *testing.T) {
		body := `{"candidates": [{"content": {"parts": [{"text": "plan","thought": true},{"text": "Hi"}],"role": "model"},"finishReason": "STOP","index": 0}],` +
			`"usageMetadata": {"promptTokenCount": 5,"candidatesTokenCount": 1,"totalTokenCount": 10,"thoughtsTokenCount": 4},"modelVersion": "gemini-2.5-flash","responseId": "r9"}`
		steps := []step{{at: 9 * time.Millisecond, raw: body, client: body}}
		u := &lockstepUp{ct: "application/json", steps: steps}
		r, _ := runLockstep(t, u, Options{}, "/v1beta/models/gemini-2.5-flash:generateContent", req)
		checkRecord(t, r, steps, want{api: apiGemini, outcome: record.Success, finish: "STOP", in: 5, out: 5, source: "usage",
			responseID: "r9", terminal: -1, firstOutput: -1})
		if r.MaxTokens != 64 || r.Model != "gemini-2.5-flash" {
			t.Errorf("max_tokens %d model %q, want 64 (generationConfig.maxOutputTokens) and the path's", r.MaxTokens, r.Model)
		}
	})
	t.Run("http 429", func(t *testing.T) {
		const e = `{"error": {"code": 429,"message": "Resource has been exhausted (e.g. check quota).","status": "RESOURCE_EXHAUSTED"}}`
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(429)
			io.WriteString(w, e)
		}), Options{InjectUsage: true})
		resp, body := do(t, fs, "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse", req)
		if resp.StatusCode != 429 || body != e {
			t.Fatalf("client got %d %q", resp.StatusCode, body)
		}
		if r := waitOne(t, sink); r.API != apiGemini || r.Outcome != record.Rejected || r.ErrorType != record.ErrRejected || r.ErrorCode != 429 || !r.Stream {
			t.Fatalf("record %s %s/%s code %d stream %v", r.API, r.Outcome, r.ErrorType, r.ErrorCode, r.Stream)
		}
	})
}
