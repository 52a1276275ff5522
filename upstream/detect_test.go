package upstream

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeEngine answers the given routes (GET path -> status and body);
// every other route is a 404, as the engines' routers answer.
func fakeEngine(t *testing.T, routes map[string][2]string) *url.URL {
	t.Helper()
	s := httptest.NewServer(engineHandler(routes, nil))
	t.Cleanup(s.Close)
	u, _ := url.Parse(s.URL)
	return u
}

// engineHandler serves routes; seen, if set, is told every path asked.
func engineHandler(routes map[string][2]string, seen func(path string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r.URL.Path)
		}
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
	})
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

// Each engine is told by its own endpoints: the proxy is told the kind,
// tokentap_upstream_info carries kind and version (one series), the log
// names the endpoint that told.
func TestDetectEngine(t *testing.T) {
	cases := []struct {
		name               string
		routes             map[string][2]string
		kind, version, how string
	}{
		{"ollama", ollamaRoutes, "ollama", "0.17.4", "/api/version"},
		{"vllm", vllmRoutes, "vllm", "0.11.2", "/v1/models owned_by"},
		{"sglang", sglangRoutes, "sglang", "0.5.4", "/v1/models owned_by"},
		{"tgi", tgiRoutes, "tgi", "3.3.7", "/info"},
		{"llamacpp", llamaRoutes, "llamacpp", "b7200-abcdef0", "/props"},
		{"simulator", map[string][2]string{"/v1/models": {"", `{"object":"list","data":[{"id":"sim","object":"model","owned_by":"tokentap"}]}`}},
			"simulator", "", "/v1/models owned_by"},
		{"unknown", map[string][2]string{"/health": {"", ""}}, "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			u := New(Options{URL: fakeEngine(t, c.routes), Registry: reg, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			told := []string{}
			if !u.detect(u.round(context.Background()), func(k string) { told = append(told, k) }) {
				t.Fatal("the engine counted as not reached")
			}
			label := c.kind
			if c.kind == "" {
				label = "unknown"
			} else if len(told) != 1 || told[0] != c.kind {
				t.Fatalf("proxy told %q, want %q", told, c.kind)
			}
			if c.kind == "" && len(told) != 0 {
				t.Fatalf("proxy told %q for an unknown engine", told)
			}
			if n := testutil.CollectAndCount(u.info); n != 1 {
				t.Fatalf("%d tokentap_upstream_info series", n)
			}
			if v := testutil.ToFloat64(u.info.WithLabelValues(label, c.version)); v != 1 {
				t.Fatalf("tokentap_upstream_info{engine=%s,version=%s} = %v", label, c.version, v)
			}
			want := "engine not recognised"
			if c.kind != "" {
				want = `"how":"` + c.how + `"`
			}
			if !strings.Contains(logs.String(), want) {
				t.Fatalf("log lacks %q: %s", want, logs.String())
			}
		})
	}
	dead, _ := url.Parse("http://127.0.0.1:1")
	u := New(Options{URL: dead})
	if u.detect(u.round(context.Background()), func(k string) { t.Errorf("told %q", k) }) {
		t.Fatal("a dead engine counted as reached")
	}
	if v := testutil.ToFloat64(u.info.WithLabelValues("unknown", "")); v != 1 {
		t.Fatalf("before detection: tokentap_upstream_info{engine=unknown} = %v", v)
	}
}

// A configured kind is used as it is, without asking; a label value
// from the engine is kept short and printable.
func TestConfiguredKind(t *testing.T) {
	var logs bytes.Buffer
	u := New(Options{URL: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}, Kind: "sglang", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	kind := ""
	if !u.fixKind(func(k string) { kind = k }) {
		t.Fatal("a configured kind was not used")
	}
	if kind != "sglang" || testutil.ToFloat64(u.info.WithLabelValues("sglang", "")) != 1 || testutil.CollectAndCount(u.info) != 1 {
		t.Fatalf("configured kind: proxy told %q", kind)
	}
	if !strings.Contains(logs.String(), "how=engine.kind") {
		t.Fatalf("log: %s", logs.String())
	}
	for _, k := range []string{"", "auto"} {
		if New(Options{URL: &url.URL{Scheme: "http", Host: "h"}, Kind: k}).fixKind(func(string) { t.Errorf("%q told a kind", k) }) {
			t.Fatalf("kind %q is not detected", k)
		}
	}
	if got := boundLabel("v1.2 \"quoted\"\n" + strings.Repeat("x", 100)); len(got) > 64 || strings.ContainsAny(got, " \"\n") {
		t.Fatalf("label %q", got)
	}
}
