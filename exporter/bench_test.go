package exporter

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// finished returns a successful streamed record of n token events 20 ms
// apart, judged against one SLO and traced, as the pipeline hands it to
// the backends.
func finished(n int) *record.Record {
	r := record.New(n)
	r.Arrive = time.Now()
	r.ID, r.API, r.Model, r.Traffic, r.Stream, r.Outcome, r.HTTPStatus = "b-1", stream.NameChat, "m", "live", true, record.Success, 200
	r.TraceID, r.SpanID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	r.FirstByte = r.Arrive.Add(40 * time.Millisecond)
	for i := range n {
		r.AddToken(r.Arrive.Add(time.Duration(50+20*i)*time.Millisecond), 1, true)
	}
	r.Terminal, r.InputTokens, r.OutputTokens, r.TokenSource = r.LastToken, 5, int64(n), "usage"
	r.PromptClass, r.OutputClass, r.LoadBucket, r.Load = "short", "long", "64", 50
	r.SLO = []record.Verdict{{Name: "interactive", Qualified: true}}
	return r
}

var benchKey = record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}

// BenchmarkPublishPrometheus is the Prometheus backend's work at the end
// of a 200-token request (its gaps were observed live).
func BenchmarkPublishPrometheus(b *testing.B) {
	m := New(Config{SLOs: []string{"interactive"}})
	r := finished(200)
	b.ReportAllocs()
	for b.Loop() {
		m.Publish(r, benchKey)
	}
}

// BenchmarkPublishOTLP is the OTLP backend's work at the end of a
// 200-token request, its 199 ITL gaps included.
func BenchmarkPublishOTLP(b *testing.B) {
	o, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())), Config{})
	if err != nil {
		b.Fatal(err)
	}
	r := finished(200)
	b.ReportAllocs()
	for b.Loop() {
		o.Publish(r, benchKey)
	}
}

// The OTLP backend observes every gap of a request at its end, through
// the SDK; its allocations must not grow with the tokens (0 per token
// event: one attribute set per instrument and request, not per gap).
func TestOTLPPublishAllocsPerTokenZero(t *testing.T) {
	rd := sdkmetric.NewManualReader()
	o, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	short, long := finished(10), finished(1010)
	o.Publish(short, benchKey) // create the series
	o.Publish(long, benchKey)
	a := testing.AllocsPerRun(50, func() { o.Publish(short, benchKey) })
	b := testing.AllocsPerRun(50, func() { o.Publish(long, benchKey) })
	if b > a {
		t.Errorf("Publish allocates %.0f times for 10 tokens and %.0f for 1,010: %.3f per token event, want 0", a, b, (b-a)/1000)
	}
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "tokentap.inter_token_latency" {
				continue
			}
			var n uint64
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				n += dp.Count
			}
			if want := uint64(52 * (9 + 1009)); n != want { // 1 + 51 calls each (AllocsPerRun warms up once)
				t.Errorf("ITL observations %d, want %d (every gap of every Publish)", n, want)
			}
		}
	}
}
