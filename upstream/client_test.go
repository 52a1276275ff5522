package upstream

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/engine"
)

// One client for everything the sidecar asks the engine: the health
// check, detection, the model list and the engine metrics scraper given
// Client and URL all go over one connection (keep-alive), each with the
// URL's credentials exactly once; the credentials are on no URL, and a
// redirect to another host is not followed (issue 40).
func TestOneClient(t *testing.T) {
	var elsewhere atomic.Value
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Store(r.Header.Values("Authorization"))
	}))
	defer other.Close()
	var mu sync.Mutex
	auth := map[string][]string{}
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth[r.URL.Path] = r.Header.Values("Authorization")
		mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			w.Write([]byte("vllm:num_requests_running 3\n"))
		case "/away":
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
		default:
			engineHandler(vllmRoutes, nil).ServeHTTP(w, r)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base, _ := url.Parse(strings.Replace(srv.URL, "http://", "http://admin:s3cret@", 1))

	u := New(Options{URL: base})
	ctx := context.Background()
	if ok, why := u.check(u.round(ctx)); !ok {
		t.Fatal(why)
	}
	if !u.detect(u.round(ctx), func(string) {}) {
		t.Fatal("not detected")
	}
	u.refreshModels(u.round(ctx))
	reg := prometheus.NewRegistry()
	engine.New(engine.Options{Config: config.EngineDefaults(), Upstream: u.URL(), Client: u.Client(), Registry: reg}).Scrape(ctx)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP tokentap_engine_requests_running Requests the engine is running (in its batch), as it last reported them.
# TYPE tokentap_engine_requests_running gauge
tokentap_engine_requests_running{engine="vllm"} 3
`), "tokentap_engine_requests_running"); err != nil {
		t.Fatalf("the scraper through Client: %v", err)
	}
	const want = "Basic YWRtaW46czNjcmV0" // admin:s3cret
	mu.Lock()
	for _, p := range []string{"/health", "/api/version", "/info", "/props", "/v1/models", "/version", "/metrics"} {
		if a := auth[p]; len(a) != 1 || a[0] != want {
			t.Errorf("GET %s carried Authorization %q, want %q once", p, a, want)
		}
	}
	mu.Unlock()
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections to the engine, want 1: the polls and the scraper share one client", n)
	}
	if u.URL().User != nil || strings.Contains(u.URL().String(), "s3cret") {
		t.Errorf("URL() %s has the credentials", u.URL())
	}
	resp, err := u.Client().Get(u.url("/away"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if a, asked := elsewhere.Load().([]string); asked || resp.StatusCode != http.StatusFound {
		t.Errorf("a redirect to another host was followed (Authorization %q), the client got %d; want the 302 itself", a, resp.StatusCode)
	}
	// A request that brings its own Authorization keeps it.
	req, _ := http.NewRequest("GET", u.url("/health"), nil)
	req.Header.Set("Authorization", "Bearer x")
	resp, err = u.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	if a := auth["/health"]; len(a) != 1 || a[0] != "Bearer x" {
		t.Errorf("own Authorization became %q", a)
	}
	mu.Unlock()
}
