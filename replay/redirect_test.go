package replay

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokentap/tokentap/internal/usage"
)

// A target that answers every request with a redirect answered none of
// them: each is counted no_answer/http_3xx, the run exits 1 saying none
// was answered, and the redirect is followed by no one, not even the
// reachability check: its target is never asked (issue 40).
func TestMainRedirectIsNotAnswered(t *testing.T) {
	var hits atomic.Int64
	elsewhere := loopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	var asked atomic.Int64
	target := loopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, elsewhere+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	path := writeFile(t, "trace.jsonl", traceLine(0, 100, 4, nil, nil)+traceLine(1, 100, 4, nil, nil)+traceLine(2, 100, 4, nil, nil))
	stdout, stderr, err := runMain(t, Env{}, "--trace", path, "--target", target, "--model", "m")
	if usage.ExitCode(err) != 1 || !strings.Contains(err.Error(), "no request of 3 was answered") {
		t.Fatalf("exit %d: %v\n%s\n%s", usage.ExitCode(err), err, stdout, stderr)
	}
	if !strings.Contains(stdout, "no_answer/http_3xx") {
		t.Errorf("the report does not count the redirects:\n%s", stdout)
	}
	if n := asked.Load(); n != 4 {
		t.Errorf("the target was asked %d times, want 4 (the reachability check and 3 requests)", n)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect's target was asked %d times", n)
	}
}
