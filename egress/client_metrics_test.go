package egress

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/tracing"
)

// clientHist is what a test expects of one series of a GenAI client
// histogram: its count, its sum and its cumulative bucket counts by
// upper bound (only the bounds listed are checked).
type clientHist struct {
	name    string
	labels  map[string]string
	count   uint64
	sum     float64
	buckets map[float64]uint64
}

// The GenAI client metrics of the semantic conventions v1.41.0, in
// egress mode (the sidecar is the client of a hosted API): a scripted
// chat completion from a TLS upstream (chatScript, on the fake clock the
// upstream sets: the first output chunk at 100 ms, the next ones 30, 15
// and 255 ms apart, the end at 420 ms, 9 input and 4 output tokens)
// gives, on /metrics and over OTLP/HTTP to a real receiver (Jaeger's
// collector, whose Prometheus exporter translates the OTel names),
// gen_ai.client.operation.time_to_first_chunk = 0.1 s, one
// time_per_output_chunk per chunk after the first (0.03, 0.015, 0.255 s,
// each in its bucket of the conventions' boundaries),
// operation.duration = 0.42 s and token.usage 9 (input) and 4 (output),
// with the conventions' required attributes and the target. The names on
// /metrics are the ones the OTel→Prometheus translation gives.
func TestGenAIClientMetricsThroughEgress(t *testing.T) {
	jaeger := testtool.Need(t, "jaeger")
	col := testtool.MetricsCollector{OTLPHTTP: clientFreeAddr(t), Prometheus: clientFreeAddr(t)}
	cfg := filepath.Join(t.TempDir(), "collector.yaml")
	if err := os.WriteFile(cfg, []byte(col.Config()), 0o644); err != nil {
		t.Fatal(err)
	}
	testtool.Start(t, "collector", jaeger, "--config", cfg)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", col.OTLPHTTP); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the OTLP collector did not start in 60 s")
		}
	}

	// The OTLP backend as the sidecar builds it: the OTEL_* environment.
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://"+col.OTLPHTTP+"/v1/metrics")
	ctx := context.Background()
	prov, err := tracing.Setup(ctx, config.Tracing{}, os.Getenv, prometheus.NewRegistry(), nil)
	if err != nil || prov.Metrics == nil {
		t.Fatalf("OTLP metrics: %v, %+v", err, prov)
	}
	t.Cleanup(func() { prov.Shutdown(context.Background()) })
	otlp, err := exporter.NewOTLP(prov.Metrics, exporter.Config{})
	if err != nil {
		t.Fatal(err)
	}

	u := newLockstep(t, script())
	h := newHarness(t, harnessOpts{clock: u.clock, otlp: otlp})
	_, port := hosted(t, h.hosted, u, "api.openai.test")
	req, _ := http.NewRequest("POST", "https://api.openai.test:"+port+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readLockstep(t, u, resp.Body)
	resp.Body.Close()
	<-u.req
	h.sink.wait(t, 1) // the metric backends ran before the sinks
	if err := prov.Metrics.ForceFlush(ctx); err != nil {
		t.Fatalf("flushing the OTLP metrics: %v", err)
	}

	// The sidecar's labels, and the collector's (OTel attribute names
	// translated: tokentap.target is tokentap_target).
	prom := map[string]string{"target": "api.openai.test", "gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai_compatible",
		"gen_ai_request_model": "gpt-test", "traffic": "live"}
	otel := map[string]string{"tokentap_target": "api.openai.test", "gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai_compatible",
		"gen_ai_request_model": "gpt-test", "tokentap_traffic": "live"}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for kk, vv := range base {
			out[kk] = vv
		}
		return out
	}
	want := func(labels map[string]string, tokenLabel bool) []clientHist {
		usage := func(kind string, n float64, le float64) clientHist {
			return clientHist{name: "gen_ai_client_token_usage", labels: with(labels, "gen_ai_token_type", kind), count: 1, sum: n,
				buckets: map[float64]uint64{le / 4: 0, le: 1}}
		}
		out := []clientHist{
			{name: "gen_ai_client_operation_time_to_first_chunk_seconds", labels: labels, count: 1, sum: 0.1,
				buckets: map[float64]uint64{0.08: 0, 0.16: 1}},
			// One per chunk after the first: 30, 15 and 255 ms.
			{name: "gen_ai_client_operation_time_per_output_chunk_seconds", labels: labels, count: 3, sum: 0.3,
				buckets: map[float64]uint64{0.01: 0, 0.02: 1, 0.04: 2, 0.16: 2, 0.32: 3, 81.92: 3}},
			{name: "gen_ai_client_operation_duration_seconds", labels: labels, count: 1, sum: 0.42,
				buckets: map[float64]uint64{0.32: 0, 0.64: 1}},
		}
		if tokenLabel {
			out = append(out, usage("input", 9, 16), usage("output", 4, 4))
		}
		return out
	}

	// /metrics.
	srv := httptest.NewServer(promhttp.HandlerFor(h.metrics.Registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	checkClientMetrics(t, "/metrics", scrapeFamilies(t, srv.URL), want(prom, true))

	// OTLP, as the receiver exposes what it received.
	var fams map[string]*dto.MetricFamily
	for i := 0; i < 100; i++ { // the receiver's exporter may lag its receiver
		if fams = scrapeFamilies(t, "http://"+col.Prometheus); fams["gen_ai_client_token_usage"] != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkClientMetrics(t, "OTLP receiver", fams, want(otel, true))
}

// checkClientMetrics compares the series of fams with want.
func checkClientMetrics(t *testing.T, where string, fams map[string]*dto.MetricFamily, want []clientHist) {
	t.Helper()
	for _, w := range want {
		mf := fams[w.name]
		if mf == nil {
			t.Errorf("%s: no %s", where, w.name)
			continue
		}
		var found *dto.Histogram
		for _, m := range mf.GetMetric() {
			if matchLabels(m, w.labels) {
				found = m.GetHistogram()
			}
		}
		if found == nil {
			t.Errorf("%s: %s has no series with %v: %v", where, w.name, w.labels, mf.GetMetric())
			continue
		}
		if found.GetSampleCount() != w.count || math.Abs(found.GetSampleSum()-w.sum) > 1e-9 {
			t.Errorf("%s: %s%v: count %d sum %v, want %d and %v", where, w.name, w.labels, found.GetSampleCount(), found.GetSampleSum(), w.count, w.sum)
		}
		have := map[float64]uint64{}
		for _, b := range found.GetBucket() {
			have[b.GetUpperBound()] = b.GetCumulativeCount()
		}
		for le, n := range w.buckets {
			if c, ok := have[le]; !ok || c != n {
				t.Errorf("%s: %s%v: bucket le=%v holds %d (present %v), want %d", where, w.name, w.labels, le, c, ok, n)
			}
		}
	}
}

// scrapeFamilies reads a Prometheus text exposition.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return fams
}

func clientFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
