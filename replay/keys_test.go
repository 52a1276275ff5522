package replay

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// Replay sends --api-key-env's key in each line's API's own key header
// (stream.API's SendKey): an Anthropic-style and a Gemini-style endpoint
// that require x-api-key (and anthropic-version) and x-goog-api-key, and
// refuse a request without them or with a bearer token, answer every
// replayed request; a bearer endpoint gets its bearer token.
func TestReplaySendsEachAPIsKeyHeader(t *testing.T) {
	for _, c := range []struct {
		api, header, value, key string
		also                    [2]string
		body                    string
	}{
		{stream.NameMessages, "x-api-key", "sk-ant-test", "sk-ant-test", [2]string{"anthropic-version", "2023-06-01"},
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		{stream.NameGemini, "x-goog-api-key", "AIza-test", "AIza-test", [2]string{},
			`data: {"candidates":[{"content":{"parts":[{"text":"Paris"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4}}` + "\n\n"},
		{stream.NameChat, "Authorization", "Bearer sk-test", "sk-test", [2]string{},
			`data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"},
	} {
		var mu sync.Mutex
		var sent []string
		url := loopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost { // the reachability check
				return
			}
			v := r.Header.Get(c.header)
			mu.Lock()
			sent = append(sent, v)
			mu.Unlock()
			if v != c.value || (c.header != "Authorization" && r.Header.Get("Authorization") != "") ||
				(c.also[0] != "" && r.Header.Get(c.also[0]) != c.also[1]) {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, c.body)
		}))
		const n = 3
		var trace strings.Builder
		for i := range n {
			trace.WriteString(traceLine(int64(i), 20, 1, nil, &workload.Meta{API: c.api, Model: "m", Stream: true}))
		}
		var rep *Report
		var out, errb bytes.Buffer
		err := Main(t.Context(), []string{"--trace", writeFile(t, "trace.jsonl", trace.String()), "--target", url, "--api-key-env", "KEY"},
			Env{Getenv: func(name string) string { return map[string]string{"KEY": c.key}[name] }, Stdout: &out, Stderr: &errb,
				Report: func(r *Report) { rep = r }})
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.api, err, errb.String())
		}
		mu.Lock()
		if s := rep.Steps[0]; s.Sent != n || s.Answered != n || len(sent) != n {
			t.Errorf("%s: sent %d answered %d failed %v; the endpoint saw %s %q", c.api, s.Sent, s.Answered, s.Failed, c.header, sent)
		}
		for _, v := range sent {
			if v != c.value {
				t.Errorf("%s: %s %q, want %q", c.api, c.header, v, c.value)
			}
		}
		mu.Unlock()
		if strings.Contains(out.String()+errb.String(), c.key) {
			t.Errorf("%s: the key is in the output", c.api)
		}
	}
}
