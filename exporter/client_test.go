package exporter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// The GenAI client metrics are the egress requests' only (a record with
// a target), on both backends, under the configured provider name, with
// the conventions' v1.41.0 bucket boundaries; a token count that is
// unknown is not reported.
func TestGenAIClientMetricsOnlyForEgress(t *testing.T) {
	rd := sdkmetric.NewManualReader()
	cfg := Config{ProviderName: "vllm"}
	om, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pm := New(cfg)
	publish := func(target string) {
		r := record.New(3)
		r.Arrive = time.Now()
		r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", "live", true, record.Success
		for _, ms := range []int{100, 130, 170} {
			r.AddToken(r.Arrive.Add(time.Duration(ms)*time.Millisecond), 1, true)
		}
		r.Terminal, r.InputTokens, r.OutputTokens = r.Arrive.Add(180*time.Millisecond), -1, 3
		r.Target, r.TargetRule = target, target
		k := record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic}
		om.Publish(r, k)
		pm.Publish(r, k)
	}
	publish("")                // behind the reverse proxy: not a client
	publish("api.openai.test") // egress

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
	for name, want := range map[string]struct {
		count uint64
		sum   float64
	}{
		"gen_ai.client.operation.duration":              {1, 0.18},
		"gen_ai.client.operation.time_to_first_chunk":   {1, 0.1},
		"gen_ai.client.operation.time_per_output_chunk": {2, 0.07},
		"gen_ai.client.token.usage":                     {1, 3}, // output only: the input count is unknown
	} {
		h, ok := got[name].Data.(metricdata.Histogram[float64])
		if !ok || len(h.DataPoints) != 1 {
			t.Errorf("OTLP %s: %d data points, want 1 (the egress request's)", name, len(h.DataPoints))
			continue
		}
		dp := h.DataPoints[0]
		if dp.Count != want.count || dp.Sum < want.sum-1e-9 || dp.Sum > want.sum+1e-9 {
			t.Errorf("OTLP %s: count %d sum %v, want %d and %v", name, dp.Count, dp.Sum, want.count, want.sum)
		}
		if p, _ := dp.Attributes.Value("gen_ai.provider.name"); p.AsString() != "vllm" {
			t.Errorf("OTLP %s: gen_ai.provider.name %q, want vllm", name, p.AsString())
		}
		if tg, _ := dp.Attributes.Value("tokentap.target"); tg.AsString() != "api.openai.test" {
			t.Errorf("OTLP %s: tokentap.target %q", name, tg.AsString())
		}
		bounds := clientSecondsBuckets
		if name == "gen_ai.client.token.usage" {
			bounds = clientTokenBuckets
			if tt, _ := dp.Attributes.Value("gen_ai.token.type"); tt.AsString() != "output" {
				t.Errorf("OTLP %s: gen_ai.token.type %q, want output", name, tt.AsString())
			}
		}
		if len(dp.Bounds) != len(bounds) || dp.Bounds[0] != bounds[0] || dp.Bounds[len(bounds)-1] != bounds[len(bounds)-1] {
			t.Errorf("OTLP %s: bounds %v, want %v", name, dp.Bounds, bounds)
		}
	}
	// /metrics: one series each, the egress request's.
	for _, name := range []string{"gen_ai_client_operation_duration_seconds", "gen_ai_client_operation_time_to_first_chunk_seconds",
		"gen_ai_client_operation_time_per_output_chunk_seconds", "gen_ai_client_token_usage"} {
		if n := testutil.CollectAndCount(pm.Registry, name); n != 1 {
			t.Errorf("/metrics %s: %d series, want 1", name, n)
		}
	}
	exp, err := testutil.CollectAndFormat(pm.Registry, expfmt.TypeTextPlain, "gen_ai_client_token_usage")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(exp), `gen_ai_provider_name="vllm"`) || !strings.Contains(string(exp), `gen_ai_token_type="output"`) {
		t.Errorf("/metrics gen_ai_client_token_usage lacks the provider or the token type:\n%s", exp)
	}
}
