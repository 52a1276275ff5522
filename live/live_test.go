package live

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

func rec(i int, at time.Time) *record.Record {
	r := record.New(4)
	r.ID, r.Traffic, r.API, r.Stream = fmt.Sprintf("r-%d", i), "live", stream.NameChat, true
	r.Arrive = at
	r.AddToken(at.Add(10*time.Millisecond), 1, true)
	r.AddToken(at.Add(20*time.Millisecond), 2, true)
	r.Outcome, r.HTTPStatus, r.OutputTokens, r.Terminal = record.Success, 200, 3, at.Add(25*time.Millisecond)
	return r
}

func get(t *testing.T, h http.Handler, url string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
	return w.Code, w.Body.String()
}

// The page keeps the last Requests records, oldest first in its data,
// and a poll that has seen the newest gets no record back.
func TestRingKeepsTheLastRecords(t *testing.T) {
	p := New(Options{Requests: 5})
	t0 := time.Unix(1000, 0)
	for i := range 12 {
		p.Write(rec(i, t0.Add(time.Duration(i)*time.Second)))
	}
	p.Write(&record.Record{Outcome: record.NotSent}) // a probe not sent: not kept
	code, body := get(t, p, "/live/data")
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, body)
	}
	var d struct {
		Seq       uint64
		Capacity  int
		Unchanged bool
		Records   []struct {
			ID      string    `json:"id"`
			TokenMS []float64 `json:"token_ms"`
		}
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Seq != 12 || d.Capacity != 5 || len(d.Records) != 5 {
		t.Fatalf("seq %d capacity %d records %d, want 12, 5, 5", d.Seq, d.Capacity, len(d.Records))
	}
	for i, r := range d.Records {
		if want := fmt.Sprintf("r-%d", 7+i); r.ID != want {
			t.Errorf("record %d is %s, want %s (oldest first)", i, r.ID, want)
		}
		if len(r.TokenMS) != 2 || r.TokenMS[1] != 20 {
			t.Errorf("record %s token_ms %v, want [10 20]", r.ID, r.TokenMS)
		}
	}
	_, body = get(t, p, "/live/data?n=2&since=12")
	if !strings.Contains(body, `"unchanged":true`) || !strings.Contains(body, `"records":[]`) {
		t.Errorf("a poll at the newest seq got %s", body)
	}
	_, body = get(t, p, "/live/data?n=2&since=11")
	if err := json.Unmarshal([]byte(body), &d); err != nil || len(d.Records) != 2 || d.Records[1].ID != "r-11" {
		t.Errorf("n=2 after a new record: %s", body)
	}
}

// Query parameters are bounded: a count outside 1 to the capacity, or a
// seq that is not a number, is a 400.
func TestDataQueryBounds(t *testing.T) {
	p := New(Options{Requests: 10})
	for _, q := range []string{"n=0", "n=11", "n=-1", "n=abc", "since=-1", "since=x", "n=99999999999999999999"} {
		if code, body := get(t, p, "/live/data?"+q); code != http.StatusBadRequest {
			t.Errorf("?%s: HTTP %d, want 400 (%s)", q, code, body)
		}
	}
	if code, _ := get(t, p, "/live/data?n=10&since=0"); code != 200 {
		t.Errorf("?n=10&since=0: HTTP %d", code)
	}
	if New(Options{Requests: 1 << 20}).o.Requests != MaxRequests || New(Options{}).o.Requests != DefaultRequests {
		t.Error("Requests is not bounded to MaxRequests, or 0 does not mean the default")
	}
}

// At most MaxConcurrentPolls answers are made at once; a poll beyond
// them gets a 503 at once, and every poll is counted by its result.
func TestPollsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := New(Options{Requests: 4, Registry: reg})
	p.Write(rec(0, time.Unix(1000, 0)))
	for range MaxConcurrentPolls {
		p.polls <- struct{}{} // answers being made
	}
	code, _ := get(t, p, "/live/data")
	if code != http.StatusServiceUnavailable {
		t.Fatalf("a poll beyond %d at once: HTTP %d, want 503", MaxConcurrentPolls, code)
	}
	<-p.polls
	get(t, p, "/live/data")
	get(t, p, "/live/data?since=1")
	get(t, p, "/live/data?n=5")
	for result, want := range map[string]float64{"busy": 1, "served": 1, "unchanged": 1, "bad_request": 1} {
		if got := testutil.ToFloat64(p.counted.WithLabelValues(result)); got != want {
			t.Errorf("tokentap_live_polls_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "tokentap_live_polls_total"); err != nil || n != 4 {
		t.Errorf("%d series of tokentap_live_polls_total registered (%v), want 4", n, err)
	}
}

// FuzzDataQuery: any query string gets a 200 or a 400, never a panic,
// and a 200 is JSON with at most the records asked for.
func FuzzDataQuery(f *testing.F) {
	for _, q := range []string{"", "n=1", "n=3&since=2", "since=18446744073709551615", "n=%ff", "n=1&n=2", "since=-0"} {
		f.Add(q)
	}
	p := New(Options{Requests: 3})
	for i := range 5 {
		p.Write(rec(i, time.Unix(1000, 0)))
	}
	f.Fuzz(func(t *testing.T, q string) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/live/data", nil)
		r.URL.RawQuery = q
		p.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusBadRequest:
		case http.StatusOK:
			var d Data
			if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil || len(d.Records) > 3 {
				t.Fatalf("?%s: %v, %d records", q, err, len(d.Records))
			}
		default:
			t.Fatalf("?%s: HTTP %d", q, w.Code)
		}
	})
}

// The page and its files are embedded and served; nothing refers to
// another host.
func TestPageIsEmbedded(t *testing.T) {
	p := New(Options{})
	for _, path := range []string{"/live", "/live/static/live.js", "/live/static/live.css"} {
		code, body := get(t, p, path)
		if code != 200 || len(body) < 100 {
			t.Errorf("%s: HTTP %d, %d bytes", path, code, len(body))
		}
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			if !strings.Contains(body, "http://www.w3.org/2000/svg") || strings.Count(body, "://") > 1 {
				t.Errorf("%s refers to another host", path)
			}
		}
	}
	if code, _ := get(t, p, "/live/static/nope.js"); code != 404 {
		t.Errorf("a missing file: HTTP %d, want 404", code)
	}
}

// Keeping a record costs no allocation: a pointer stored per request.
func TestWriteDoesNotAllocate(t *testing.T) {
	p := New(Options{Requests: 8})
	r := rec(0, time.Unix(1000, 0))
	if a := testing.AllocsPerRun(1000, func() { p.Write(r) }); a != 0 {
		t.Errorf("Write allocates %v times per record, want 0", a)
	}
}

// BenchmarkWrite is the live page's cost per finished request with
// nobody watching.
func BenchmarkWrite(b *testing.B) {
	p := New(Options{})
	r := rec(0, time.Unix(1000, 0))
	b.ReportAllocs()
	for b.Loop() {
		p.Write(r)
	}
}

// BenchmarkPoll is one poll of an open page: /live/data with the page's
// default 30 records (or 1,000, the most it can ask), each of 64 token
// events, and the 15-minute trend. The page polls once every 2 s.
func BenchmarkPoll(b *testing.B) {
	for _, n := range []int{30, 1000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			p := New(Options{Requests: n})
			t0 := time.Unix(1000, 0)
			for i := range n {
				r := record.New(64)
				r.ID, r.Traffic, r.API, r.Stream, r.Arrive = fmt.Sprintf("r-%d", i), "live", stream.NameChat, true, t0
				for k := range 64 {
					r.AddToken(t0.Add(time.Duration(100+20*k)*time.Millisecond), 1, true)
				}
				r.Outcome, r.HTTPStatus, r.OutputTokens, r.Terminal = record.Success, 200, 64, t0.Add(2*time.Second)
				p.Write(r)
			}
			url := fmt.Sprintf("/live/data?n=%d", n)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
			}
		})
	}
}

// With tenants on, the data lists the tenant labels of the records kept,
// and ?tenant= keeps the newest n records of that tenant alone.
func TestTenantFilter(t *testing.T) {
	p := New(Options{Requests: 10})
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		r := rec(i, t0.Add(time.Duration(i)*time.Second))
		r.Tenant = []string{"acme", "t-0123456789ab", "_none"}[i%3]
		p.Write(r)
	}
	var d struct {
		Tenants []string `json:"tenants"`
		Records []struct {
			ID     string `json:"id"`
			Tenant string `json:"tenant"`
		} `json:"records"`
	}
	_, body := get(t, p, "/live/data?n=3&tenant=acme")
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if strings.Join(d.Tenants, ",") != "_none,acme,t-0123456789ab" || len(d.Records) != 3 {
		t.Fatalf("tenants %v, %d records", d.Tenants, len(d.Records))
	}
	for i, want := range []string{"r-3", "r-6", "r-9"} { // acme's newest three, oldest first
		if d.Records[i].ID != want || d.Records[i].Tenant != "acme" {
			t.Errorf("record %d: %+v, want %s of acme", i, d.Records[i], want)
		}
	}
	_, body = get(t, p, "/live/data?n=10")
	d.Tenants, d.Records = nil, nil
	json.Unmarshal([]byte(body), &d)
	if len(d.Records) != 10 {
		t.Errorf("no filter: %d records, want 10", len(d.Records))
	}
	_, body = get(t, New(Options{}), "/live/data")
	if strings.Contains(body, "tenants") {
		t.Errorf("tenants off, yet listed: %s", body)
	}
}
