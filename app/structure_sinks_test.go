package app

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// otlpSink is a loopback OTLP/HTTP receiver that keeps every body it
// gets, by signal, decompressed.
type otlpSink struct {
	mu              sync.Mutex
	traces, metrics bytes.Buffer
}

func (o *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, _ := io.ReadAll(body)
	o.mu.Lock()
	switch r.URL.Path {
	case "/v1/traces":
		o.traces.Write(b)
	case "/v1/metrics":
		o.metrics.Write(b)
	}
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (o *otlpSink) bytes() (traces, metrics []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return bytes.Clone(o.traces.Bytes()), bytes.Clone(o.metrics.Bytes())
}

// TestStructureNeverInSinks: requests whose structure is checked (an SLO
// declares structure: required), their prompts, tool arguments, tool
// names and JSON answers carrying a marker, valid and not, through the
// whole sidecar with every sink on: the records file, the log (at
// debug), Prometheus' /metrics, OTLP spans and metrics (to a loopback
// receiver), and /slo as HTML and as JSON. Each record's structure and
// SLO verdict are exact, each sink shows the checks' names, and none
// holds the marker; the client got it from the engine every time (the
// control: the marker is there to be found, and the grep finds it).
func TestStructureNeverInSinks(t *testing.T) {
	const marker = "MARKER_c41f07e2"
	type structCase struct {
		name, resp string // resp: the engine's answer, by the request's name
		json       bool   // asks for a JSON output (else declares a tool)
		want       []string
	}
	chunk := func(delta, finish string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + "}]}\n\n"
	}
	call := func(name string, args ...string) string {
		b := chunk(`{"role":"assistant","content":""}`, "null")
		for i, a := range args {
			fn := `{"arguments":` + strconv.Quote(a) + `}`
			if i == 0 {
				fn = `{"name":` + strconv.Quote(name) + `,"arguments":` + strconv.Quote(a) + `}`
			}
			b += chunk(`{"tool_calls":[{"index":0,"function":`+fn+`}]}`, "null")
		}
		return b + chunk(`{}`, `"tool_calls"`) + "data: [DONE]\n\n"
	}
	text := func(finish string, parts ...string) string {
		b := chunk(`{"role":"assistant","content":""}`, "null")
		for _, p := range parts {
			b += chunk(`{"content":`+strconv.Quote(p)+`}`, "null")
		}
		return b + chunk(`{}`, `"`+finish+`"`) + "data: [DONE]\n\n"
	}
	huge := `{"city":"` + marker + strings.Repeat("x", 300<<10) + `"}` // over the 256 KiB bound
	cases := []structCase{
		{"valid", call("get_weather", `{"city":`, `"`+marker+`"}`), false, nil},
		{"invalid_json", call("get_weather", `{"city":`, `"`+marker+`"`), false, []string{"tool_args_invalid_json"}},
		{"schema", call("get_weather", `{"town":"`+marker+`"}`), false, []string{"tool_args_schema"}},
		{"unknown", call(marker+"_tool", `{"city":"x"}`), false, []string{"unknown_tool"}},
		{"too_large", call("get_weather", huge[:len(huge)/2], huge[len(huge)/2:]), false, []string{"too_large"}},
		{"output_valid", text("stop", `{"answer":`, `"`+marker+`"}`), true, nil},
		{"output_cut", text("length", `{"answer":`, `"`+marker[:6]), true, []string{"truncated_json"}},
	}
	resp := map[string]string{}
	for _, c := range cases {
		resp[c.name] = c.resp
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		json.NewDecoder(r.Body).Decode(&req)
		body, ok := resp[req.Model]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for ev := range strings.SplitAfterSeq(body, "\n\n") {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	var otlp otlpSink
	collector := httptest.NewServer(&otlp)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	cfg := filepath.Join(t.TempDir(), "tokentap.yaml")
	os.WriteFile(cfg, []byte(`log_level: debug
slo:
  objectives:
    - name: answers
      target: 0.9
      structure: required
      thresholds:
        ttft: 1m
`), 0o644)
	var logs lockedBuffer
	a, records := startSidecarEnv(t, up.URL, func(e *Env) {
		e.Getenv = os.Getenv
		e.Stderr = io.MultiWriter(&logs, testWriter{t})
	}, "--config", cfg)

	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","description":"` + marker + `","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}}}]`
	const format = `"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}}}`
	for _, c := range cases {
		decl := tools
		if c.json {
			decl = format
		}
		r, err := http.Post("http://"+a.Proxy+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+c.name+`","stream":true,"messages":[{"role":"user","content":"`+marker+`"}],`+decl+`}`))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if string(got) != c.resp || !bytes.Contains(got, []byte(marker[:6])) {
			t.Fatalf("%s: the client got %d bytes, not the engine's %d with the marker", c.name, len(got), len(c.resp))
		}
	}

	// The records: each check's result and verdict, exact.
	type verdict struct {
		Name      string   `json:"name"`
		Qualified bool     `json:"qualified"`
		Failed    []string `json:"failed"`
	}
	var recBytes []byte
	waitUntil(t, "every record", 10*time.Second, func() bool {
		recBytes, _ = os.ReadFile(records)
		return bytes.Count(recBytes, []byte("\n")) >= len(cases)
	})
	for line := range bytes.Lines(recBytes) {
		var r struct {
			Model     string    `json:"model"`
			Outcome   string    `json:"outcome"`
			Structure string    `json:"structure"`
			Failed    []string  `json:"structure_failed"`
			SLO       []verdict `json:"slo"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("record %s: %v", line, err)
		}
		i := slices.IndexFunc(cases, func(c structCase) bool { return c.name == r.Model })
		if i < 0 {
			t.Fatalf("a record of %q", r.Model)
		}
		c := cases[i]
		status := "pass"
		if c.want != nil {
			status = "fail"
		}
		if r.Outcome != "success" || r.Structure != status || !slices.Equal(r.Failed, c.want) || len(r.SLO) != 1 ||
			r.SLO[0].Qualified != (c.want == nil) || !slices.Equal(r.SLO[0].Failed, c.want) && !(c.want == nil && len(r.SLO[0].Failed) == 0) {
			t.Errorf("%s: outcome %s structure %q %v verdicts %+v, want success, %q %v", c.name, r.Outcome, r.Structure, r.Failed, r.SLO, status, c.want)
		}
	}

	get := func(path string) []byte {
		r, err := http.Get("http://" + a.Admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return b
	}
	metrics := get("/metrics")
	sloHTML, sloJSON := get("/slo"), get("/slo?format=json")
	var traces, otlpMetrics []byte
	waitUntil(t, "the OTLP spans and the structure counters in OTLP metrics", 10*time.Second, func() bool {
		traces, otlpMetrics = otlp.bytes()
		return len(traces) > 0 && bytes.Contains(otlpMetrics, []byte("tokentap.structure.failures")) && bytes.Contains(otlpMetrics, []byte("too_large"))
	})
	var page struct {
		SLOs []struct {
			Offered     int64    `json:"offered"`
			FastInvalid int64    `json:"fast_invalid"`
			Share       *float64 `json:"fast_invalid_share"`
		} `json:"slos"`
	}
	if err := json.Unmarshal(sloJSON, &page); err != nil || len(page.SLOs) != 1 || page.SLOs[0].Offered != 7 || page.SLOs[0].FastInvalid != 5 {
		t.Fatalf("/slo?format=json (%v): %s, want 7 offered, 5 fast but invalid", err, sloJSON)
	}
	sinks := []struct {
		name string
		b    []byte
		show string // what the sink shows of the checks
	}{
		{"records file", recBytes, `"structure_failed":["tool_args_schema"]`},
		{"log", []byte(logs.String()), "tokentap is up"},
		{"/metrics", metrics, `tokentap_structure_failures_total{check="too_large"`},
		{"OTLP spans", traces, "chat"},
		{"OTLP metrics", otlpMetrics, "tool_args_invalid_json"},
		{"/slo", sloHTML, "<th>fast but invalid</th>"},
		{"/slo?format=json", sloJSON, `"fast_invalid_share"`},
	}
	for _, s := range sinks {
		if !bytes.Contains(s.b, []byte(s.show)) {
			t.Errorf("%s (%d bytes) does not show %q", s.name, len(s.b), s.show)
		}
		for _, m := range []string{marker, marker[:6]} {
			if i := bytes.Index(s.b, []byte(m)); i >= 0 {
				t.Errorf("%s holds the content: %q", s.name, s.b[max(0, i-80):min(len(s.b), i+80)])
			}
		}
	}
}
