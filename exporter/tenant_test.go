package exporter

import (
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// With tenants off no per-tenant series exists; with them on, the SLO
// counters are counted again by tenant, declared tenants pre-created.
func TestPerTenantCounters(t *testing.T) {
	rec := func(tenant string, qualified bool) *record.Record {
		r := record.New(2)
		r.Arrive = time.Now()
		r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, "m", "live", true, record.Success
		r.AddToken(r.Arrive.Add(10*time.Millisecond), 1, true)
		r.Terminal, r.OutputTokens, r.Tenant = r.Arrive.Add(20*time.Millisecond), 7, tenant
		r.SLO = []record.Verdict{{Name: "chat", Qualified: qualified}}
		return r
	}
	off := New(Config{SLOs: []string{"chat"}})
	off.Publish(rec("", true), record.Key{API: stream.NameChat, Model: "m", Traffic: "live"})
	for _, name := range []string{"tokentap_slo_requests_by_tenant_total", "tokentap_tenant_output_tokens_total"} {
		if n := series(t, off, name); len(n) != 0 {
			t.Errorf("tenants off: %s has series %v", name, n)
		}
	}
	on := New(Config{SLOs: []string{"chat"}, Tenants: []string{"acme", "beta"}})
	for _, r := range []*record.Record{rec("acme", true), rec("acme", false), rec("t-0123456789ab", true)} {
		on.Publish(r, record.Key{API: stream.NameChat, Model: "m", Traffic: "live"})
	}
	want := map[string]map[string]float64{
		"tokentap_slo_requests_by_tenant_total":                {"acme": 2, "beta": 0, "t-0123456789ab": 1},
		"tokentap_slo_qualified_requests_by_tenant_total":      {"acme": 1, "beta": 0, "t-0123456789ab": 1},
		"tokentap_slo_qualified_output_tokens_by_tenant_total": {"acme": 7, "beta": 0, "t-0123456789ab": 7},
		"tokentap_tenant_output_tokens_total":                  {"acme": 14, "t-0123456789ab": 7},
	}
	for name, w := range want {
		got := series(t, on, name)
		if len(got) != len(w) {
			t.Errorf("%s: %v, want %v", name, got, w)
		}
		for k, v := range w {
			if got[k] != v {
				t.Errorf("%s{tenant=%q} = %v, want %v", name, k, got[k], v)
			}
		}
	}
}

// series returns a counter's values by tenant label.
func series(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "tenant" {
					out[l.GetValue()] = s.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
