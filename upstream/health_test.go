package upstream

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func readyz(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	return w.Code, w.Body.String()
}

func readiness(u *url.URL, path string, log *slog.Logger) http.Handler {
	return New(Options{URL: u, HealthPath: path, Logger: log}).Readiness(nil)
}

// The default health check finds each engine's real endpoint, says which
// it uses, and /readyz explains a failure.
func TestReadinessAuto(t *testing.T) {
	cases := []struct {
		name   string
		routes map[string][2]string
		code   int
		body   string // in /readyz's answer
		log    string
	}{
		{"ollama: /health is a 404, /v1/models answers", ollamaRoutes, 200, "upstream ready (GET /v1/models answered 200 OK)", "/v1/models"},
		{"vllm", vllmRoutes, 200, "GET /health answered 200", "/health"},
		{"llama.cpp loading", map[string][2]string{"/health": {"503", `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`}},
			503, "not ready: upstream not ready: GET http://", "/health"},
		{"no health route at all", map[string][2]string{}, 503,
			"no health endpoint found on the upstream (/health 404 Not Found, /v1/models 404 Not Found, /api/version 404 Not Found, / 404 Not Found)", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			code, body := readyz(t, readiness(fakeEngine(t, c.routes), HealthAuto, slog.New(slog.NewTextHandler(&logs, nil))))
			if code != c.code || !strings.Contains(body, c.body) {
				t.Fatalf("/readyz %d %q, want %d containing %q", code, body, c.code, c.body)
			}
			if c.log != "" && !strings.Contains(logs.String(), "health check found") || !strings.Contains(logs.String(), c.log) {
				t.Fatalf("log %q does not name %q", logs.String(), c.log)
			}
		})
	}
	if code, body := readyz(t, readiness(fakeEngine(t, llamaRoutes), HealthAuto, nil)); code != 200 || !strings.Contains(body, "/health") {
		t.Fatalf("llama.cpp: %d %q", code, body)
	}
	// The loading model's own words reach /readyz.
	_, body := readyz(t, readiness(fakeEngine(t, map[string][2]string{"/health": {"503", `{"error":{"message":"Loading model"}}`}}), HealthAuto, nil))
	if !strings.Contains(body, "503 Service Unavailable") || !strings.Contains(body, "Loading model") {
		t.Fatalf("/readyz %q", body)
	}
	// Unreachable: says where and why.
	dead, _ := url.Parse("http://127.0.0.1:1")
	code, body := readyz(t, readiness(dead, HealthAuto, nil))
	if code != 503 || !strings.Contains(body, "upstream unreachable: GET http://127.0.0.1:1/health") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	// A configured path is used as it is, and named in the failure.
	code, body = readyz(t, readiness(fakeEngine(t, ollamaRoutes), "/health", nil))
	if code != 503 || !strings.Contains(body, "/health answered 404 Not Found") {
		t.Fatalf("configured /health in front of Ollama: %d %q", code, body)
	}
}

// Discovery asks the candidates in their order and stops at the first
// route the engine has (any answer but 404, 405, 501, a 503 included);
// the path found is asked alone from then on, until it goes away (the
// engine restarted into another one), when discovery starts again
// (without asking again, in the same round, the path that just went).
func TestDiscoveryOrder(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	routes := map[string][2]string{"/api/version": {"503", "starting"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		rt := routes
		mu.Unlock()
		engineHandler(rt, func(p string) { mu.Lock(); asked = append(asked, p); mu.Unlock() }).ServeHTTP(w, r)
	}))
	defer srv.Close()
	base, _ := url.Parse(srv.URL)
	var ups []bool
	u := New(Options{URL: base, SetUp: func(up bool) { ups = append(ups, up) }})
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		a := asked
		asked = nil
		return a
	}
	check := func() (bool, string) {
		u.health.at = u.health.at.AddDate(0, 0, -1) // the last check is a day old
		return u.check(u.round(context.Background()))
	}

	ok, why := check()
	if got := take(); ok || !slices.Equal(got, []string{"/health", "/v1/models", "/api/version"}) || !strings.Contains(why, "answered 503 Service Unavailable: starting") {
		t.Fatalf("first check: %v %q, asked %v", ok, why, got)
	}
	mu.Lock()
	routes = map[string][2]string{"/api/version": {"", `{"version":"1"}`}, "/": {"", "banner"}}
	mu.Unlock()
	ok, why = check()
	if got := take(); !ok || !slices.Equal(got, []string{"/api/version"}) || why != "upstream ready (GET /api/version answered 200 OK)" {
		t.Fatalf("second check: %v %q, asked %v", ok, why, got)
	}
	mu.Lock()
	delete(routes, "/api/version")
	mu.Unlock()
	ok, why = check()
	if got := take(); !ok || !slices.Equal(got, []string{"/api/version", "/health", "/v1/models", "/"}) || !strings.Contains(why, "GET / answered 200") {
		t.Fatalf("after the route went: %v %q, asked %v", ok, why, got)
	}
	if !slices.Equal(ups, []bool{false, true, true}) {
		t.Fatalf("told up %v", ups)
	}
	// A check within the second answers from the last one.
	if ok, _ := u.check(u.round(context.Background())); !ok || len(take()) != 0 || len(ups) != 3 {
		t.Fatal("a check within the second asked the engine")
	}
	// Shutting down: never ready again, without asking.
	u.ShutDown()
	if ok, why := check(); ok || why != "shutting down" || len(take()) != 0 {
		t.Fatalf("after ShutDown: %v %q", ok, why)
	}
}

// /readyz is also the canary probes' verdict.
func TestReadinessAlso(t *testing.T) {
	h := New(Options{URL: fakeEngine(t, vllmRoutes)}).Readiness(probes{false, "probe x failing"})
	if code, body := readyz(t, h); code != 503 || body != "not ready: probe x failing\n" {
		t.Fatalf("/readyz %d %q", code, body)
	}
}

type probes struct {
	ok  bool
	why string
}

func (p probes) Ready() (bool, string) { return p.ok, p.why }

// A health endpoint that redirects is not ready, whatever the target
// would say: the redirect is not followed (its target is never asked)
// and /readyz names the 3xx (issue 40).
func TestHealthRedirectIsNotReady(t *testing.T) {
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	base, _ := url.Parse(srv.URL)
	for _, path := range []string{"/health", HealthAuto} {
		code, body := readyz(t, readiness(base, path, nil))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "GET "+srv.URL+"/health answered 307 Temporary Redirect") {
			t.Errorf("health path %q: /readyz %d %q; want 503 naming the 307", path, code, body)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect's target was asked %d times", n)
	}
}
