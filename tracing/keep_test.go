package tracing

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// With a ratio of 0, only failed spans and SLO misses are exported; the
// decisions are counted.
func TestKeepSlowOrFailed(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	keep := NewKeepProcessor(sdktrace.NewSimpleSpanProcessor(exp), 0, prometheus.NewRegistry())
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
