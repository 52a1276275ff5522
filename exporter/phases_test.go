package exporter

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// phased returns a finished request with the given connection phases.
func phased(traffic, target string, up record.Upstream) *record.Record {
	r := record.New(1)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", traffic, true, record.Success
	r.TargetRule, r.Target = target, target
	r.AddToken(r.Arrive.Add(264*time.Millisecond), 1, true)
	r.Terminal, r.Upstream = r.Arrive.Add(270*time.Millisecond), up
	return r
}

// The connection phases are one histogram, one observation per phase
// that happened, by phase and conn_reused (and traffic, probe, target:
// no model, operation or outcome), in both backends alike; a request
// that never reached the transport adds none.
func TestUpstreamPhaseHistogram(t *testing.T) {
	const ms = time.Millisecond
	fresh := record.Upstream{Asked: true}
	fresh.Set(record.UpConnWait, 24*ms)
	fresh.Set(record.UpConnect, 3*ms)
	fresh.Set(record.UpTLS, 20*ms)
	fresh.Set(record.UpServer, 240*ms)
	reused := record.Upstream{Asked: true, Reused: true}
	reused.Set(record.UpConnWait, 0)
	reused.Set(record.UpServer, 240*ms)
	recs := []*record.Record{phased("live", "api.openai.test", fresh), phased("live", "api.openai.test", reused),
		phased("live", "api.openai.test", reused), phased("live", "", record.Upstream{})}

	type series struct {
		phase, reused string
	}
	want := map[series]struct {
		n   uint64
		sum float64
	}{
		{"conn_wait", "false"}: {1, 0.024}, {"connect", "false"}: {1, 0.003}, {"tls", "false"}: {1, 0.02},
		{"server", "false"}: {1, 0.24}, {"conn_wait", "true"}: {2, 0}, {"server", "true"}: {2, 0.48},
	}

	m := New(Config{})
	for _, r := range recs {
		m.Publish(r, record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic})
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[series]*dto.Histogram{}
	for _, mf := range mfs {
		if mf.GetName() != "tokentap_upstream_phase_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range s.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if len(l) != 5 || l["target"] != "api.openai.test" || l["traffic"] != "live" || l["probe"] != "" {
				t.Errorf("labels %v", l)
			}
			got[series{l["phase"], l["conn_reused"]}] = s.GetHistogram()
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d series, want %d: %v", len(got), len(want), got)
	}
	for k, w := range want {
		if h := got[k]; h == nil || h.GetSampleCount() != w.n || !near(h.GetSampleSum(), w.sum) {
			t.Errorf("%v: %v, want %d observations summing to %v", k, h, w.n, w.sum)
		}
	}

	rd := sdkmetric.NewManualReader()
	om, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		om.Publish(r, record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic})
	}
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	points := 0
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != "tokentap.upstream.phase" {
				continue
			}
			for _, dp := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
				phase, _ := dp.Attributes.Value("tokentap.upstream.phase")
				reused, _ := dp.Attributes.Value("tokentap.upstream.conn_reused")
				w := want[series{phase.AsString(), reused.AsString()}]
				if dp.Count != w.n || !near(dp.Sum, w.sum) || len(dp.Bounds) != len(phaseBuckets) || mt.Unit != "s" {
					t.Errorf("OTLP %s/%s: %d observations summing to %v (bounds %d, unit %q), want %d, %v", phase.AsString(), reused.AsString(),
						dp.Count, dp.Sum, len(dp.Bounds), mt.Unit, w.n, w.sum)
				}
				points++
			}
		}
	}
	if points != len(want) {
		t.Errorf("OTLP: %d data points, want %d", points, len(want))
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
