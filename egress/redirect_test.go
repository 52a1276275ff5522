package egress

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokentap/tokentap/record"
)

// A hosted API that answers with a redirect, through egress: the client
// gets the 3xx and its Location as sent (its own client decides whether
// to follow), the sidecar follows nothing (the target, another hosted
// host, is never asked), and the record and the counters say no_answer,
// never success (issue 40).
func TestRedirectThroughEgress(t *testing.T) {
	var elsewhere atomic.Int64
	h := newHarness(t, harnessOpts{})
	_, otherPort := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	}), "api.other.azure.test")
	to := "https://api.other.azure.test:" + otherPort + "/v1/chat/completions"
	_, port := hosted(t, h.hosted, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Location", to)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusTemporaryRedirect)
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}), "api.openai.test")
	c := h.client(t, false)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, body := range []string{chatBody, strings.Replace(chatBody, `"stream":true`, `"stream":false`, 1)} {
		resp, err := c.Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != to {
			t.Errorf("the client got %d, Location %q; want the 307 and its Location", resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	for _, r := range h.sink.wait(t, 2) {
		if r.Outcome != record.NoAnswer || r.ErrorType != record.ErrHTTP3xx || r.HTTPStatus != http.StatusTemporaryRedirect ||
			r.TokenEvents() != 0 || r.OutputTokens != -1 || r.Target != "api.openai.test:"+port {
			t.Errorf("record %s/%s HTTP %d events %d tokens %d target %s; want no_answer/http_3xx 307, no token",
				r.Outcome, r.ErrorType, r.HTTPStatus, r.TokenEvents(), r.OutputTokens, r.Target)
		}
	}
	for outcome, want := range map[string]float64{"no_answer": 2, "success": 0} {
		if got := counter(t, h.metrics.Registry, "tokentap_target_requests_total", map[string]string{"outcome": outcome}); got != want {
			t.Errorf("tokentap_target_requests_total{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target was asked %d times", n)
	}
}
