package app

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
)

// startJaeger runs a real Jaeger (v1.76.0, memory storage) with its OTLP
// HTTP receiver and query API on free loopback ports.
func startJaeger(t *testing.T) (otlp, query, otlpGRPC string) {
	bin := testtool.Need(t, "jaeger")
	dir := t.TempDir()
	otlp, otlpGRPC, query, queryGRPC := freePort(t), freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(dir, "jaeger.yaml")
	j := testtool.Jaeger{OTLPHTTP: otlp, OTLPGRPC: otlpGRPC, QueryHTTP: query, QueryGRPC: queryGRPC}
	if err := os.WriteFile(cfg, []byte(j.Config()), 0o644); err != nil {
		t.Fatal(err)
	}
	testtool.Start(t, "jaeger", bin, "--config", cfg)
	waitUntil(t, "Jaeger's query API", 60*time.Second, func() bool {
		resp, err := http.Get("http://" + query + "/api/services")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return otlp, query, otlpGRPC
}

type jTrace struct {
	Spans []jSpan `json:"spans"`
}

type jSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
	Logs []struct {
		Fields []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"fields"`
	} `json:"logs"`
}

func (s jSpan) tag(k string) any {
	for _, t := range s.Tags {
		if t.Key == k {
			return t.Value
		}
	}
	return nil
}

func (s jSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// getTrace polls Jaeger for a trace with want spans; nil if none came.
func getTrace(t *testing.T, query, id string, want int, limit time.Duration) *jTrace {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + query + "/api/traces/" + id)
		if err == nil {
			var r struct {
				Data []jTrace `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			if len(r.Data) == 1 && len(r.Data[0].Spans) >= want {
				return &r.Data[0]
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

func byKind(tr *jTrace) (server, client jSpan) {
	for _, s := range tr.Spans {
		switch s.tag("span.kind") {
		case "server":
			server = s
		case "client":
			client = s
		}
	}
	return
}

// traceUpstream answers by model: "fail" with an error event after 200,
// "slow" with its first token after 150 ms, anything else at once; it
// keeps the traceparent each model arrived with.
type traceUpstream struct {
	mu     sync.Mutex
	parent map[string]string
}

func (u *traceUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	var req struct{ Model string }
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req)
	u.mu.Lock()
	u.parent[req.Model] = r.Header.Get("traceparent")
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	if req.Model == "slow" {
		time.Sleep(150 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		if req.Model == "fail" && i == 1 {
			io.WriteString(w, `data: {"error":{"message":"boom","type":"InternalServerError","code":500}}`+"\n\ndata: [DONE]\n\n")
			return
		}
		io.WriteString(w, `data: {"id":"r1","model":"`+req.Model+`","choices":[{"delta":{"content":"w"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
	}
	io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}`+"\n\ndata: [DONE]\n\n")
}

func send(t *testing.T, proxy, model, traceparent string) {
	req, _ := http.NewRequest("POST", "http://"+proxy+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"secret prompt text"}]}`))
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

type tracedRec struct {
	Model   string   `json:"model"`
	TraceID string   `json:"trace_id"`
	TTFT    *float64 `json:"ttft_ms"`
	Output  int64    `json:"output_tokens"`
	Input   int64    `json:"input_tokens"`
}

func tracedRecords(t *testing.T, path string, n int) map[string]tracedRec {
	out := map[string]tracedRec{}
	waitUntil(t, "records", 10*time.Second, func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r tracedRec
			json.Unmarshal(sc.Bytes(), &r)
			out[r.Model] = r
		}
		return len(out) >= n
	})
	return out
}

func otelEnv(t *testing.T, otlp string) { otelEnvProto(t, otlp, "http/protobuf") }

func otelEnvProto(t *testing.T, otlp, protocol string) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+otlp)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv("OTEL_SERVICE_NAME", "tokentap-test")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
}

func withOSEnv(e *Env) { e.Getenv = os.Getenv }

// TestTracesInJaeger: spans arrive in a real Jaeger through OTLP, continue
// the client's trace, carry the GenAI attributes of the record, the
// first-token event, error.type on a failed stream, no content; and the
// engine received our traceparent.
func TestTracesInJaeger(t *testing.T) {
	otlp, query, otlpGRPC := startJaeger(t)
	for _, proto := range []struct{ name, endpoint string }{{"http/protobuf", otlp}, {"grpc", otlpGRPC}} {
		t.Run(strings.ReplaceAll(proto.name, "/", "-"), func(t *testing.T) {
			otelEnvProto(t, proto.endpoint, proto.name)
			tracesInJaeger(t, query, proto.name == "grpc")
		})
	}
}

func tracesInJaeger(t *testing.T, query string, second bool) {
	up := &traceUpstream{parent: map[string]string{}}
	us := httptest.NewServer(up)
	defer us.Close()
	a, records := startSidecarEnv(t, us.URL, withOSEnv)

	tid, incoming := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if second { // a trace of its own for the second protocol
		tid = "5cf92f3577b34da6a3ce929d0e0e4737"
	}
	send(t, a.Proxy, "ok", "00-"+tid+"-"+incoming+"-01")
	send(t, a.Proxy, "fresh", "")
	send(t, a.Proxy, "fail", "")
	recs := tracedRecords(t, records, 3)

	tr := getTrace(t, query, tid, 2, 15*time.Second)
	if tr == nil {
		t.Fatal("the continued trace never reached Jaeger")
	}
	server, client := byKind(tr)
	if server.OperationName != "POST /v1/chat/completions" || client.OperationName != "chat ok" {
		t.Fatalf("span names %q / %q", server.OperationName, client.OperationName)
	}
	if server.parent() != incoming || client.parent() != server.SpanID {
		t.Fatalf("links: server's parent %q (want the client's %q), client's parent %q (want %q)", server.parent(), incoming, client.parent(), server.SpanID)
	}
	if got, want := up.parent["ok"], "00-"+tid+"-"+client.SpanID+"-01"; got != want {
		t.Fatalf("engine got traceparent %q, want %q", got, want)
	}
	rec := recs["ok"]
	if rec.TraceID != tid {
		t.Fatalf("record trace_id %q", rec.TraceID)
	}
	for k, v := range map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "ok", "gen_ai.provider.name": "openai_compatible",
		"gen_ai.usage.output_tokens": float64(rec.Output), "gen_ai.usage.input_tokens": float64(rec.Input), "gen_ai.request.stream": true, "gen_ai.response.id": "r1"} {
		if got := client.tag(k); got != v {
			t.Errorf("tag %s = %v (%T), want %v", k, got, got, v)
		}
	}
	if ttfc, _ := client.tag("gen_ai.response.time_to_first_chunk").(float64); math.Abs(ttfc*1e3-*rec.TTFT) > 0.01 {
		t.Errorf("time_to_first_chunk %v s, record ttft %v ms", ttfc, *rec.TTFT)
	}
	first := false
	for _, l := range client.Logs {
		for _, f := range l.Fields {
			first = first || (f.Key == "event" && f.Value == "gen_ai.first_token")
		}
	}
	if !first {
		t.Errorf("no first-token event on %+v", client.Logs)
	}

	// The TTFT histogram on the real /metrics, scraped with OpenMetrics
	// negotiation, carries this trace as an exemplar.
	req, _ := http.NewRequest("GET", "http://"+a.Admin+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		found := false
		for _, l := range strings.Split(string(b), "\n") {
			found = found || (strings.HasPrefix(l, "gen_ai_server_time_to_first_token_seconds_bucket") && strings.Contains(l, `gen_ai_request_model="ok"`) && strings.Contains(l, `trace_id="`+tid+`"`))
		}
		if !found {
			t.Errorf("no exemplar with trace_id %s on the TTFT histogram", tid)
		}
	}

	// A request without traceparent starts its own trace, found from the record.
	if fresh := getTrace(t, query, recs["fresh"].TraceID, 2, 10*time.Second); fresh == nil {
		t.Error("the fresh request's trace is not in Jaeger")
	} else if s, _ := byKind(fresh); s.parent() != "" {
		t.Errorf("a fresh trace's server span has parent %q", s.parent())
	}
	// A failed stream carries error.type.
	failed := getTrace(t, query, recs["fail"].TraceID, 2, 10*time.Second)
	if failed == nil {
		t.Fatal("the failed request's trace is not in Jaeger")
	}
	if _, c := byKind(failed); c.tag("error.type") != "stream_error" || c.tag("otel.status_code") != "ERROR" {
		t.Errorf("failed span: error.type %v status %v", c.tag("error.type"), c.tag("otel.status_code"))
	}
	// No prompt or completion in any span by default.
	for _, trc := range []*jTrace{tr, failed} {
		b, _ := json.Marshal(trc)
		if strings.Contains(string(b), "secret prompt") || strings.Contains(string(b), "gen_ai.input.messages") || strings.Contains(string(b), "gen_ai.output.messages") {
			t.Errorf("content found in an exported span")
		}
	}
}

// TestKeepSlowOrFailedInJaeger: with keep_ratio 0, a request that missed
// its SLO and one that failed arrive in Jaeger; a good one does not.
func TestKeepSlowOrFailedInJaeger(t *testing.T) {
	otlp, query, _ := startJaeger(t)
	otelEnv(t, otlp)
	up := &traceUpstream{parent: map[string]string{}}
	us := httptest.NewServer(up)
	defer us.Close()
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte(`
tracing: {keep: slow_or_failed, keep_ratio: 0}
slo:
  objectives:
    - {name: fast, target: 0.9, thresholds: {ttft: 100ms}}
`), 0o644)
	a, records := startSidecarEnv(t, us.URL, withOSEnv, "--config", cfg)
	send(t, a.Proxy, "good", "")
	send(t, a.Proxy, "slow", "")
	send(t, a.Proxy, "fail", "")
	recs := tracedRecords(t, records, 3)
	if getTrace(t, query, recs["slow"].TraceID, 2, 15*time.Second) == nil {
		t.Error("the SLO miss was not exported")
	}
	if getTrace(t, query, recs["fail"].TraceID, 2, 10*time.Second) == nil {
		t.Error("the failure was not exported")
	}
	if getTrace(t, query, recs["good"].TraceID, 1, 2*time.Second) != nil {
		t.Error("a good request was exported with keep_ratio 0")
	}
	m := scrape(t, a.Admin)
	for _, want := range []string{`tokentap_trace_spans_total{decision="dropped",reason="rest"} 2`, `tokentap_trace_spans_total{decision="kept",reason="slo_miss"} 2`, `tokentap_trace_spans_total{decision="kept",reason="error"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// On shutdown the sidecar flushes the spans its batch processor still
// holds: with a 60 s export delay, nothing leaves before the shutdown.
func TestShutdownFlushesSpans(t *testing.T) {
	otlp, query, _ := startJaeger(t)
	otelEnv(t, otlp)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
	up := &traceUpstream{parent: map[string]string{}}
	us := httptest.NewServer(up)
	defer us.Close()
	dir := t.TempDir()
	records := filepath.Join(dir, "r.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--upstream", us.URL, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--records", records},
			Env{Getenv: os.Getenv, Stdout: io.Discard, Stderr: testWriter{t}, Ready: func(a Addrs) { ready <- a }})
	}()
	a := <-ready
	send(t, a.Proxy, "ok", "")
	rec := tracedRecords(t, records, 1)["ok"]
	if getTrace(t, query, rec.TraceID, 1, 1500*time.Millisecond) != nil {
		t.Fatal("spans left before the shutdown although the export delay is 60 s")
	}
	cancel() // what SIGTERM does in main
	if err := <-done; err != nil {
		t.Fatalf("exit: %v", err)
	}
	if getTrace(t, query, rec.TraceID, 2, 10*time.Second) == nil {
		t.Fatal("shutdown did not flush the spans")
	}
}

// In front of the built-in simulator, as the README's first command runs
// it: the inference span of a real completion reaches Jaeger with the
// simulator's model and the record's token counts.
func TestSimulatorTraceInJaeger(t *testing.T) {
	otlp, query, _ := startJaeger(t)
	otelEnv(t, otlp)
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte("simulator: {error_prob: 0, stall_prob: 0}\nprobes: {probes: []}\n"), 0o644)
	a, records := startSidecarEnv(t, "", withOSEnv, "--config", cfg)
	send(t, a.Proxy, "tokentap-sim", "")
	rec := tracedRecords(t, records, 1)["tokentap-sim"]
	tr := getTrace(t, query, rec.TraceID, 2, 15*time.Second)
	if tr == nil {
		t.Fatal("no trace from the simulator run")
	}
	_, client := byKind(tr)
	if client.OperationName != "chat tokentap-sim" || client.tag("gen_ai.usage.output_tokens") != float64(rec.Output) || client.tag("gen_ai.response.model") != "tokentap-sim" {
		t.Fatalf("client span %q, output tokens %v (record %d), response model %v", client.OperationName, client.tag("gen_ai.usage.output_tokens"), rec.Output, client.tag("gen_ai.response.model"))
	}
}
