package slo

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// /slo's per-tenant rows are the verdicts of each tenant's records; the
// row of the SLO is their sum. Without tenants there is no such row.
func TestPerTenantRows(t *testing.T) {
	cfg := Config{Objectives: []Objective{objective()}}
	j, book := NewJudge(cfg), NewBook(cfg, nil)
	now := time.Unix(2000, 0)
	book.clock = func() time.Time { return now }
	sc := NewScorecard(book, NewLoadBuckets(config.Capacity{}), config.Cost{}, false, nil)
	add := func(tenant string, r *record.Record) {
		r.Tenant = tenant
		judged(j, r)
		book.Add(r)
	}
	add("", good())
	if p := book.Status(now); len(p.SLOs[0].Tenants) != 0 {
		t.Fatalf("a record without a tenant made tenant rows: %+v", p.SLOs[0].Tenants)
	}
	want := map[string][2]int64{"acme": {3, 2}, "t-0123456789ab": {2, 0}, "_none": {1, 1}}
	for tenant, n := range want {
		for i := range n[0] {
			if i < n[1] {
				add(tenant, good())
			} else {
				add(tenant, rec(record.Error, 0))
			}
		}
	}
	rr := httptest.NewRecorder()
	sc.ServeHTTP(rr, httptest.NewRequest("GET", "/slo?format=json", nil))
	var p Page
	if err := json.Unmarshal(rr.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	s := p.SLOs[0]
	if s.Offered != 7 || len(s.Tenants) != 3 {
		t.Fatalf("row %d offered, tenants %+v", s.Offered, s.Tenants)
	}
	for _, ts := range s.Tenants {
		w := want[ts.Tenant]
		if ts.Offered != w[0] || ts.Qualified != w[1] || ts.Attainment == nil || *ts.Attainment != float64(w[1])/float64(w[0]) {
			t.Errorf("tenant %s: %d/%d, want %d/%d", ts.Tenant, ts.Qualified, ts.Offered, w[1], w[0])
		}
		if ts.Tenant == "t-0123456789ab" && (len(ts.TopFailures) != 1 || ts.TopFailures[0].Reason != "error") {
			t.Errorf("tenant %s failures %+v", ts.Tenant, ts.TopFailures)
		}
	}
	rr = httptest.NewRecorder()
	sc.ServeHTTP(rr, httptest.NewRequest("GET", "/slo", nil))
	html := rr.Body.String()
	if !strings.Contains(html, `<h2 id="tenants-chat">chat by tenant</h2>`) || !strings.Contains(html, "<td style=\"text-align:left\">t-0123456789ab</td><td>2</td><td>0</td>") {
		t.Errorf("the HTML page has no tenant table:\n%s", html)
	}
	// The window slides: a tenant whose requests left it has no row.
	now = now.Add(cfg.WithDefaults().Objectives[0].Window + time.Minute)
	if p := book.Status(now); len(p.SLOs[0].Tenants) != 0 {
		t.Errorf("rows after the window: %+v", p.SLOs[0].Tenants)
	}
}
