package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/exporter"
)

// fakeEngine answers the given routes (GET path -> status and body);
// every other route is a 404, as the engines' routers answer.
func fakeEngine(t *testing.T, routes map[string][2]string) *url.URL {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := routes[r.URL.Path]
		if !ok || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		code := http.StatusOK
		if rt[0] != "" && rt[0] != "200" {
			code = map[string]int{"503": 503, "500": 500}[rt[0]]
		}
		w.WriteHeader(code)
		io.WriteString(w, rt[1])
	}))
	t.Cleanup(s.Close)
	u, _ := url.Parse(s.URL)
	return u
}

var (
	ollamaRoutes = map[string][2]string{
		"/":            {"", "Ollama is running"},
		"/api/version": {"", `{"version":"0.17.4"}`},
		"/v1/models":   {"", `{"object":"list","data":[{"id":"tiny:latest","object":"model","created":1,"owned_by":"library"}]}`},
	}
	vllmRoutes = map[string][2]string{
		"/health":    {"", ""},
		"/version":   {"", `{"version":"0.11.2"}`},
		"/v1/models": {"", `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}`},
	}
	sglangRoutes = map[string][2]string{
		"/health":          {"", ""},
		"/get_server_info": {"", `{"version":"0.5.4","tp_size":1}`},
		"/v1/models":       {"", `{"object":"list","data":[{"id":"m","object":"model","owned_by":"sglang"}]}`},
	}
	tgiRoutes = map[string][2]string{
		"/health":    {"", ""},
		"/info":      {"", `{"model_id":"m","router":"text-generation-router","version":"3.3.7","sha":"db931fcf"}`},
		"/v1/models": {"", `{"object":"list","data":[{"id":"m","object":"model","owned_by":"m"}]}`},
	}
	llamaRoutes = map[string][2]string{
		"/health":    {"", `{"status":"ok"}`},
		"/props":     {"", `{"default_generation_settings":{},"total_slots":4,"build_info":"b7200-abcdef0"}`},
		"/v1/models": {"", `{"object":"list","data":[{"id":"m","object":"model","owned_by":"llamacpp"}]}`},
	}
)

func TestDetectEngine(t *testing.T) {
	cases := []struct {
		name   string
		routes map[string][2]string
		want   engineInfo
	}{
		{"ollama", ollamaRoutes, engineInfo{"ollama", "0.17.4", "/api/version"}},
		{"vllm", vllmRoutes, engineInfo{"vllm", "0.11.2", "/v1/models owned_by"}},
		{"sglang", sglangRoutes, engineInfo{"sglang", "0.5.4", "/v1/models owned_by"}},
		{"tgi", tgiRoutes, engineInfo{"tgi", "3.3.7", "/info"}},
		{"llamacpp", llamaRoutes, engineInfo{"llamacpp", "b7200-abcdef0", "/props"}},
		{"simulator", map[string][2]string{"/v1/models": {"", `{"object":"list","data":[{"id":"sim","object":"model","owned_by":"tokentap"}]}`}},
			engineInfo{"simulator", "", "/v1/models owned_by"}},
		{"unknown", map[string][2]string{"/health": {"", ""}}, engineInfo{Kind: "unknown"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, reached := detectEngine(context.Background(), &http.Client{Timeout: 2 * time.Second}, fakeEngine(t, c.routes))
			if !reached || got != c.want {
				t.Fatalf("detected %+v (reached %v), want %+v", got, reached, c.want)
			}
		})
	}
	dead, _ := url.Parse("http://127.0.0.1:1")
	if _, reached := detectEngine(context.Background(), &http.Client{Timeout: time.Second}, dead); reached {
		t.Fatal("a dead engine counted as reached")
	}
}

// tokentap_upstream_info{engine,version} = 1, one series; the proxy is
// told the kind; the log says it.
func TestWatchEngineExportsInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	info := newUpstreamInfo(reg)
	var logs bytes.Buffer
	var mu sync.Mutex
	kind := ""
	watchEngine(context.Background(), fakeEngine(t, tgiRoutes), "", info, func(k string) { mu.Lock(); kind = k; mu.Unlock() },
		slog.New(slog.NewTextHandler(&logs, nil)))
	if kind != "tgi" {
		t.Fatalf("proxy told %q", kind)
	}
	if n := testutil.CollectAndCount(info.g); n != 1 {
		t.Fatalf("%d series", n)
	}
	if v := testutil.ToFloat64(info.g.WithLabelValues("tgi", "3.3.7")); v != 1 {
		t.Fatalf("tokentap_upstream_info{engine=tgi,version=3.3.7} = %v", v)
	}
	if !strings.Contains(logs.String(), "engine detected") || !strings.Contains(logs.String(), "kind=tgi") {
		t.Fatalf("log: %s", logs.String())
	}
	// A configured kind is used as it is.
	watchEngine(context.Background(), fakeEngine(t, vllmRoutes), "sglang", info, func(k string) { kind = k }, slog.New(slog.DiscardHandler))
	if kind != "sglang" || testutil.ToFloat64(info.g.WithLabelValues("sglang", "")) != 1 || testutil.CollectAndCount(info.g) != 1 {
		t.Fatalf("configured kind: proxy told %q", kind)
	}
	if got := boundLabel("v1.2 \"quoted\"\n" + strings.Repeat("x", 100)); len(got) > 64 || strings.ContainsAny(got, " \"\n") {
		t.Fatalf("label %q", got)
	}
}

func readyz(t *testing.T, r *readiness) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	return w.Code, w.Body.String()
}

// The default health check finds each engine's real endpoint, says which
// it uses, and /readyz explains a failure.
func TestReadinessAuto(t *testing.T) {
	m := exporter.New(exporter.Config{})
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
			r := newReadiness(fakeEngine(t, c.routes), HealthAuto, m, slog.New(slog.NewTextHandler(&logs, nil)))
			code, body := readyz(t, r)
			if code != c.code || !strings.Contains(body, c.body) {
				t.Fatalf("/readyz %d %q, want %d containing %q", code, body, c.code, c.body)
			}
			if c.log != "" && !strings.Contains(logs.String(), "health check found") || !strings.Contains(logs.String(), c.log) {
				t.Fatalf("log %q does not name %q", logs.String(), c.log)
			}
		})
	}
	if code, body := readyz(t, newReadiness(fakeEngine(t, llamaRoutes), HealthAuto, m, nil)); code != 200 || !strings.Contains(body, "/health") {
		t.Fatalf("llama.cpp: %d %q", code, body)
	}
	// The loading model's own words reach /readyz.
	_, body := readyz(t, newReadiness(fakeEngine(t, map[string][2]string{"/health": {"503", `{"error":{"message":"Loading model"}}`}}), HealthAuto, m, nil))
	if !strings.Contains(body, "503 Service Unavailable") || !strings.Contains(body, "Loading model") {
		t.Fatalf("/readyz %q", body)
	}
	// Unreachable: says where and why.
	dead, _ := url.Parse("http://127.0.0.1:1")
	code, body := readyz(t, newReadiness(dead, HealthAuto, m, nil))
	if code != 503 || !strings.Contains(body, "upstream unreachable: GET http://127.0.0.1:1/health") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	// A configured path is used as it is, and named in the failure.
	code, body = readyz(t, newReadiness(fakeEngine(t, ollamaRoutes), "/health", m, nil))
	if code != 503 || !strings.Contains(body, "/health answered 404 Not Found") {
		t.Fatalf("configured /health in front of Ollama: %d %q", code, body)
	}
}
