package probe

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// countingServer serves h on a loopback address (host "127.0.0.1" or
// another loopback host: where that cannot be listened on, as on macOS
// without an alias, another port of 127.0.0.1), counting the requests
// that reach it.
func countingServer(t *testing.T, host string, n *atomic.Int64, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil && host != "127.0.0.1" {
		t.Logf("cannot listen on %s (%v): another server on 127.0.0.1 instead", host, err)
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// A canary whose URL redirects fails, with a reason that names the
// redirect and where it pointed, and follows none (issue 40): to itself,
// and to another loopback host that would answer well. The probe's URL
// is asked once per probe; the redirect's target never.
func TestProbeFailsARedirect(t *testing.T) {
	answer := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}
	var targetHits atomic.Int64
	target := countingServer(t, "127.0.0.2", &targetHits, answer)
	for _, c := range []struct {
		name   string
		status int
		to     func(self string) string
	}{
		{"itself", http.StatusTemporaryRedirect, func(self string) string { return self + "/v1/chat/completions" }},
		{"itself, 308", http.StatusPermanentRedirect, func(self string) string { return self + "/v1/chat/completions" }},
		{"another host", http.StatusFound, func(string) string { return target.URL + "/v1/chat/completions?sig=secret" }},
		{"another host, 301", http.StatusMovedPermanently, func(string) string { return target.URL + "/v1/chat/completions" }},
		{"another host, 303", http.StatusSeeOther, func(string) string { return target.URL + "/v1/chat/completions" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hits atomic.Int64
			var self string
			us := countingServer(t, "127.0.0.1", &hits, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", c.to(self))
				w.Header().Set("Content-Type", "text/event-stream") // and a whole answer: still none
				w.WriteHeader(c.status)
				io.WriteString(w, `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
			})
			self = us.URL
			before := targetHits.Load()
			reg := prometheus.NewRegistry()
			var recs sink
			cfg := Config{Probes: []Def{{Name: "hosted", URL: us.URL, Interval: time.Minute, Expect: Expect{Contains: "Paris"}}}}.WithDefaults("m")
			p := New(Options{Config: cfg, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}}), Registry: reg})
			for range 2 {
				p.run(context.Background(), p.defs[0], time.Now()) // its end stages have run when it returns
			}
			if n := hits.Load(); n != 2 {
				t.Errorf("the probe URL was asked %d times for 2 probes; a redirect to itself was followed", n)
			}
			if n := targetHits.Load() - before; n != 0 {
				t.Errorf("the redirect's target was asked %d times; it never is", n)
			}
			recs.mu.Lock()
			defer recs.mu.Unlock()
			if len(recs.recs) != 2 {
				t.Fatalf("%d records, want 2", len(recs.recs))
			}
			for _, r := range recs.recs {
				wantTo := `to "` + strings.TrimSuffix(c.to(self), "?sig=secret") + `"`
				if r.Outcome != record.NoAnswer || r.ErrorType != record.ErrHTTP3xx || r.HTTPStatus != c.status || r.OutputTokens != -1 ||
					r.TokenEvents() != 0 || r.Probe == nil || r.Probe.Result != ResultFailed ||
					!strings.Contains(r.Probe.Failure, "redirect not followed: HTTP") || !strings.Contains(r.Probe.Failure, wantTo) ||
					strings.Contains(r.Probe.Failure, "secret") {
					t.Errorf("record %s/%s HTTP %d tokens %d events %d probe %+v; want no_answer/http_3xx %d, failed, naming the redirect %s (no query)",
						r.Outcome, r.ErrorType, r.HTTPStatus, r.OutputTokens, r.TokenEvents(), r.Probe, c.status, wantTo)
				}
			}
			if got := testutil.ToFloat64(p.results.WithLabelValues("hosted", ResultFailed)); got != 2 {
				t.Errorf("tokentap_probe_results_total{result=failed} = %v, want 2", got)
			}
			if got := testutil.ToFloat64(p.results.WithLabelValues("hosted", ResultSuccess)); got != 0 {
				t.Errorf("tokentap_probe_results_total{result=success} = %v, want 0", got)
			}
			if got := testutil.ToFloat64(p.success.WithLabelValues("hosted")); got != 0 {
				t.Errorf("probe_success = %v, want 0", got)
			}
			if got := testutil.ToFloat64(p.consecutive.WithLabelValues("hosted")); got != 2 {
				t.Errorf("tokentap_probe_consecutive_failures = %v, want 2", got)
			}
			lf := p.Status().Probes[0].LastFailure
			if lf == nil || lf.HTTPStatus != c.status || lf.Outcome != string(record.NoAnswer) || !strings.Contains(lf.Failure, "redirect not followed") {
				t.Errorf("/probes last failure %+v", lf)
			}
		})
	}
}

// A redirect's Location, as a failure names it: no credentials, query or
// fragment, quoted, bounded.
func TestLocationIsBoundedAndRedacted(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                     "no Location",
		"http://u:pw@h:1/p?token=x#f":          `"http://h:1/p"`,
		"/relative":                            `"/relative"`,
		"http://h/" + strings.Repeat("a", 300): `"http://h/` + strings.Repeat("a", 191) + `..."`,
		"http://h/\x01":                        "an unparseable Location",
		"http://h/é":                           `"http://h/%C3%A9"`,
		"%zz":                                  "an unparseable Location",
	} {
		if got := location(raw); got != want {
			t.Errorf("location(%q) = %s, want %s", raw, got, want)
		}
	}
}
