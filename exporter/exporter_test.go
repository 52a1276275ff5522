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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// A scrape that negotiates OpenMetrics finds the trace id as an exemplar
// on the TTFT histogram.
func TestTraceIDExemplarOnTTFT(t *testing.T) {
	m := New(Config{})
	r := record.New(2)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", "live", true, record.Success
	r.AddToken(r.Arrive.Add(120*time.Millisecond), 1, true)
	r.Terminal = r.Arrive.Add(130 * time.Millisecond)
	r.TraceID, r.SpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	m.Publish(r, record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic})
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

// The OTLP metrics carry the semantic-convention names and units and the
// same explicit bucket boundaries as /metrics.
func TestOTelMetricsSemconv(t *testing.T) {
	rd := sdkmetric.NewManualReader()
	om, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := record.New(3)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", "live", true, record.Success
	for _, ms := range []int{100, 130, 170} {
		r.AddToken(r.Arrive.Add(time.Duration(ms)*time.Millisecond), 1, true)
	}
	r.Terminal, r.InputTokens, r.OutputTokens = r.Arrive.Add(180*time.Millisecond), 5, 3
	om.Publish(r, record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic})
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	for name, unit := range map[string]string{"gen_ai.server.time_to_first_token": "s", "gen_ai.server.time_per_output_token": "s",
		"gen_ai.server.request.duration": "s", "gen_ai.client.inference.usage.input_tokens": "{token}",
		"gen_ai.client.inference.usage.output_tokens": "{token}", "tokentap.inter_token_latency": "s", "tokentap.requests": "{request}"} {
		if m, ok := got[name]; !ok || m.Unit != unit {
			t.Errorf("%s: present %v unit %q, want %q", name, ok, m.Unit, unit)
		}
	}
	h := got["gen_ai.server.time_to_first_token"].Data.(metricdata.Histogram[float64])
	if dp := h.DataPoints[0]; len(dp.Bounds) != len(ttftBuckets) || dp.Bounds[0] != 0.001 || dp.Count != 1 || dp.Sum != 0.1 {
		t.Errorf("TTFT: bounds %v count %d sum %v", dp.Bounds[:3], dp.Count, dp.Sum)
	}
	if itl := got["tokentap.inter_token_latency"].Data.(metricdata.Histogram[float64]); itl.DataPoints[0].Count != 2 {
		t.Errorf("ITL observations %d, want 2 gaps", itl.DataPoints[0].Count)
	}
}

// tokentap_internal_errors_total has both of its series from the start
// (0, so that a rule sees 0 rather than no data) and counts each where
// on its own (issue 40, item 1).
func TestInternalErrorsCounted(t *testing.T) {
	m := New(Config{})
	m.InternalError("request")
	m.InternalError("request")
	rr := httptest.NewRecorder()
	promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}).ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range []string{`tokentap_internal_errors_total{where="request"} 2`, `tokentap_internal_errors_total{where="end"} 0`} {
		if !strings.Contains(rr.Body.String(), line+"\n") {
			t.Errorf("no %s in the scrape", line)
		}
	}
}
