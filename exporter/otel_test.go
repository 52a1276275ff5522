package exporter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/record"
)

// With a ratio of 0, only failed spans and SLO misses are exported; the
// decisions are counted.
func TestKeepSlowOrFailed(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	m := New(Config{})
	keep := NewKeepProcessor(sdktrace.NewSimpleSpanProcessor(exp), 0, m.Registry)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(keep))
	tr := tp.Tracer("t")
	_, ok := tr.Start(context.Background(), "ok")
	ok.SetAttributes(attribute.Bool("tokentap.slo.qualified", true))
	ok.End()
	_, miss := tr.Start(context.Background(), "slow")
	miss.SetAttributes(attribute.Bool("tokentap.slo.qualified", false))
	miss.End()
	_, failed := tr.Start(context.Background(), "failed")
	failed.SetStatus(codes.Error, "stream_error")
	failed.End()
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "slow,failed" {
		t.Fatalf("exported %v, want the SLO miss and the failure only", names)
	}
	if testutil.ToFloat64(keep.decisions.WithLabelValues("dropped", "rest")) != 1 ||
		testutil.ToFloat64(keep.decisions.WithLabelValues("kept", "slo_miss")) != 1 ||
		testutil.ToFloat64(keep.decisions.WithLabelValues("kept", "error")) != 1 {
		t.Fatal("decisions not counted")
	}
	// Ratio 1 keeps everything.
	all := NewKeepProcessor(sdktrace.NewSimpleSpanProcessor(exp), 1, nil)
	if !all.sampled([16]byte{15: 0xff, 8: 0xff}) {
		t.Fatal("ratio 1 dropped a trace")
	}
}

// A scrape that negotiates OpenMetrics finds the trace id as an exemplar
// on the TTFT histogram.
func TestTraceIDExemplarOnTTFT(t *testing.T) {
	m := New(Config{})
	r := record.New(2)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome = record.APIChat, "m", "live", true, record.Success
	r.AddToken(r.Arrive.Add(120*time.Millisecond), 1, true)
	r.Terminal = r.Arrive.Add(130 * time.Millisecond)
	r.TraceID, r.SpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	m.Begin(record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic}).End(r)
	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	found := false
	for _, l := range strings.Split(string(b), "\n") {
		// Exemplar label order is not fixed: check each label.
		if strings.HasPrefix(l, "gen_ai_server_time_to_first_token_seconds_bucket") && strings.Contains(l, ` # {`) &&
			strings.Contains(l, `trace_id="4bf92f3577b34da6a3ce929d0e0e4736"`) && strings.Contains(l, `span_id="00f067aa0ba902b7"`) && strings.Contains(l, `} 0.12 `) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no trace-id exemplar on the TTFT histogram:\n%s", grep(string(b), "time_to_first_token_seconds_bucket"))
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
