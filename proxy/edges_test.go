package proxy

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/tokentap/tokentap/record"
)

// An engine that read the request (it was queued) and died before
// answering: the request reached it, so the record says the connection
// broke (upstream_reset), not that the engine was unreachable, whether
// the connection ended with a FIN or a reset. Unreachable is for a
// connection that could not be made (TestUnreachableUpstreamIs502).
func TestEngineDiedWithRequestQueued(t *testing.T) {
	for _, reset := range []bool{false, true} {
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			if reset {
				conn.(*net.TCPConn).SetLinger(0)
			}
			conn.Close()
		}), Options{})
		resp, body := do(t, fs, "/v1/chat/completions", streamBody)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "tokentap_upstream_reset") {
			t.Fatalf("reset=%v: %d %q, want a 502 naming upstream_reset", reset, resp.StatusCode, body)
		}
		r := only(t, sink)
		if r.Outcome != record.Error || r.ErrorType != record.ErrUpstreamReset || r.HTTPStatus != 502 || r.UpstreamSent.IsZero() {
			t.Fatalf("reset=%v: record %s/%s %d sent=%v", reset, r.Outcome, r.ErrorType, r.HTTPStatus, r.UpstreamSent)
		}
	}
}

// lockedWriter is a log destination that the test reads while the proxy
// writes it.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Credentials in the upstream URL go on proxied requests as basic
// authentication, unless the client sent an Authorization of its own;
// they are never logged.
func TestUpstreamURLCredentials(t *testing.T) {
	const user, pass = "admin", "s3cret-pw"
	var (
		mu  sync.Mutex
		got [][]string
	)
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Values("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer us.Close()
	u, _ := url.Parse(us.URL)
	u.User = url.UserPassword(user, pass)
	var logs lockedWriter
	fs, _ := front(t, nil, Options{Upstream: u, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	send := func(auth string) int {
		req, _ := http.NewRequest(http.MethodPost, fs.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	send("")
	send("Bearer client-key")
	mu.Lock()
	want := [][]string{{"Basic YWRtaW46czNjcmV0LXB3"}, {"Bearer client-key"}} // base64("admin:s3cret-pw")
	if len(got) != 2 || strings.Join(got[0], "|") != want[0][0] || strings.Join(got[1], "|") != want[1][0] {
		t.Fatalf("the upstream saw Authorization %q, want %q", got, want)
	}
	mu.Unlock()
	us.Close() // a failing request is logged
	if code := send(""); code != http.StatusBadGateway {
		t.Fatalf("an unreachable upstream: %d", code)
	}
	l := logs.String()
	if !strings.Contains(l, "upstream request failed") || strings.Contains(l, pass) || strings.Contains(l, "YWRtaW46") {
		t.Fatalf("the log has the credentials, or no line: %s", l)
	}
}
