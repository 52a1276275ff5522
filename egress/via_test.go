package egress

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tokentap/tokentap/record"
)

// An intercepted request forwarded to the hosted API carries the
// sidecar's Via, as the reverse proxy's do; one that arrives with it
// already (a loop back through the egress proxy) is answered 508, never
// reaches the hosted API, and is recorded as error/loop_detected.
func TestEgressVia(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	h := newHarness(t, harnessOpts{via: "tokentap-egress1"})
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, strings.Join(r.Header.Values("Via"), ", "))
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}), "api.openai.test")
	c := h.client(t, false)
	send := func(via string) int {
		req, _ := http.NewRequest(http.MethodPost, "https://api.openai.test:"+port+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("Content-Type", "application/json")
		if via != "" {
			req.Header.Set("Via", via)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(""); code != 200 {
		t.Fatalf("status %d", code)
	}
	if code := send("1.1 gw, 1.1 tokentap-egress1"); code != http.StatusLoopDetected {
		t.Fatalf("a request naming this sidecar in Via: status %d, want 508", code)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "1.1 tokentap-egress1" {
		t.Errorf("the hosted API saw Via %q: want one request with 1.1 tokentap-egress1", seen)
	}
	mu.Unlock()
	recs := h.sink.wait(t, 2)
	loop := recs[1]
	if recs[0].ErrorType == record.ErrLoop {
		loop = recs[0]
	}
	if loop.Outcome != record.Error || loop.ErrorType != record.ErrLoop || loop.HTTPStatus != http.StatusLoopDetected || loop.Target == "" {
		t.Errorf("loop record %s/%s status %d target %q", loop.Outcome, loop.ErrorType, loop.HTTPStatus, loop.Target)
	}
}
