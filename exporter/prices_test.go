package exporter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// The declared prices reach both backends; the accrued cost is the
// hourly price times the hours since start.
func TestPrices(t *testing.T) {
	m := New(Config{})
	start := time.Now().Add(-30 * time.Minute)
	p := Prices{Currency: "EUR", PerHour: 11, EnergyPerKWh: 0.25}
	m.RegisterPrices(p, start)
	want := `# HELP tokentap_energy_price_per_kwh ` + priceEnergy.Help + `
# TYPE tokentap_energy_price_per_kwh gauge
tokentap_energy_price_per_kwh{currency="EUR"} 0.25
# HELP tokentap_replica_price_per_hour ` + priceHourly.Help + `
# TYPE tokentap_replica_price_per_hour gauge
tokentap_replica_price_per_hour{currency="EUR"} 11
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "tokentap_replica_price_per_hour", "tokentap_energy_price_per_kwh"); err != nil {
		t.Fatal(err)
	}
	mfs, _ := m.Registry.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "tokentap_replica_cost_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v < 5.5 || v > 5.51 {
				t.Errorf("accrued %v after 30 min at 11/h, want 5.5", v)
			}
		}
	}
	// Nothing declared, nothing exported.
	n := New(Config{})
	n.RegisterPrices(Prices{}, start)
	if c, _ := testutil.GatherAndCount(n.Registry, "tokentap_replica_price_per_hour", "tokentap_replica_cost_total", "tokentap_energy_price_per_kwh"); c != 0 {
		t.Errorf("%d price series with no price declared", c)
	}

	rd := sdkmetric.NewManualReader()
	if err := RegisterOTLPPrices(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), p, start); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			switch d := x.Data.(type) {
			case metricdata.Gauge[float64]:
				got[x.Name+" "+x.Unit] = d.DataPoints[0].Value
			case metricdata.Sum[float64]:
				got[x.Name+" "+x.Unit] = d.DataPoints[0].Value
				if v, _ := d.DataPoints[0].Attributes.Value("tokentap.currency"); v.AsString() != "EUR" || !d.IsMonotonic {
					t.Errorf("accrued cost: %+v", d)
				}
			}
		}
	}
	if got["tokentap.replica.price_per_hour {EUR}/h"] != 11 || got["tokentap.energy.price_per_kwh {EUR}/kW.h"] != 0.25 ||
		got["tokentap.replica.cost {EUR}"] < 5.5 || got["tokentap.replica.cost {EUR}"] > 5.51 {
		t.Fatalf("OTLP prices %v", got)
	}
}

// A judged record with a load bucket counts in the by-load SLO counters
// of both backends, with the load label.
func TestByLoadCounters(t *testing.T) {
	r := record.New(3)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", "live", true, record.Success
	for _, ms := range []int{100, 130, 170} {
		r.AddToken(r.Arrive.Add(time.Duration(ms)*time.Millisecond), 1, true)
	}
	r.Terminal, r.OutputTokens = r.Arrive.Add(180*time.Millisecond), 3
	r.SLO = []record.Verdict{{Name: "chat", Qualified: true}, {Name: "strict", Failed: []string{"ttft"}}}
	r.Load, r.LoadBucket = 5.5, "6"
	k := record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic}

	m := New(Config{SLOs: []string{"chat", "strict"}})
	m.Publish(r, k)
	want := `# HELP tokentap_slo_qualified_output_tokens_by_load_total ` + specs[SLOQualifiedTokensByLoad].Help + `
# TYPE tokentap_slo_qualified_output_tokens_by_load_total counter
tokentap_slo_qualified_output_tokens_by_load_total{load="6",slo="chat"} 3
# HELP tokentap_slo_qualified_requests_by_load_total ` + specs[SLOQualifiedByLoad].Help + `
# TYPE tokentap_slo_qualified_requests_by_load_total counter
tokentap_slo_qualified_requests_by_load_total{load="6",slo="chat"} 1
# HELP tokentap_slo_requests_by_load_total ` + specs[SLOOfferedByLoad].Help + `
# TYPE tokentap_slo_requests_by_load_total counter
tokentap_slo_requests_by_load_total{load="6",slo="chat"} 1
tokentap_slo_requests_by_load_total{load="6",slo="strict"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "tokentap_slo_requests_by_load_total",
		"tokentap_slo_qualified_requests_by_load_total", "tokentap_slo_qualified_output_tokens_by_load_total"); err != nil {
		t.Fatal(err)
	}

	rd := sdkmetric.NewManualReader()
	o, err := NewOTLP(sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	o.Publish(r, k)
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			if x.Name == "tokentap.slo.requests_by_load" {
				for _, dp := range x.Data.(metricdata.Sum[int64]).DataPoints {
					if v, _ := dp.Attributes.Value("tokentap.load"); v.AsString() == "6" && dp.Value == 1 {
						found++
					}
				}
			}
		}
	}
	if found != 2 {
		t.Fatalf("OTLP tokentap.slo.requests_by_load: %d points with load 6, want 2", found)
	}
	// Without a load bucket (no meter), none of them.
	r.LoadBucket = ""
	n := New(Config{})
	n.Publish(r, k)
	if c, _ := testutil.GatherAndCount(n.Registry, "tokentap_slo_requests_by_load_total"); c != 0 {
		t.Fatalf("%d by-load series without a load", c)
	}
}

// With the load buckets declared, every SLO's by-load counters exist at 0
// before any request, one series per bucket, so that the first request in
// a bucket is an increase rate() sees.
func TestByLoadCountersPreCreated(t *testing.T) {
	m := New(Config{SLOs: []string{"chat"}, LoadBuckets: []string{"1", "6", "+Inf"}})
	var want strings.Builder
	for _, spec := range []Spec{specs[SLOQualifiedTokensByLoad], specs[SLOQualifiedByLoad], specs[SLOOfferedByLoad]} {
		fmt.Fprintf(&want, "# HELP %s %s\n# TYPE %s counter\n", spec.Prom, spec.Help, spec.Prom)
		for _, b := range []string{"+Inf", "1", "6"} {
			fmt.Fprintf(&want, "%s{load=%q,slo=\"chat\"} 0\n", spec.Prom, b)
		}
	}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want.String()), "tokentap_slo_requests_by_load_total",
		"tokentap_slo_qualified_requests_by_load_total", "tokentap_slo_qualified_output_tokens_by_load_total"); err != nil {
		t.Fatal(err)
	}
}
