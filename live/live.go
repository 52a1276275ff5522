// Package live serves the admin port's live page (docs/live.md): the
// last finished requests as token strips on a common time axis, the
// rolling figures of the last 15 minutes (slo.Trend) and the canary's
// last results. The page's files are embedded in the binary (vanilla
// JavaScript, nothing fetched from elsewhere); the page polls
// /live/data while it is open.
//
// It costs nothing per token: the page keeps the last finished records
// (a record sink, one pointer stored per request: records are never
// reused, and nothing writes one once it reaches the sinks), and
// encodes them only when a browser asks.
package live

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
)

//go:embed static
var static embed.FS

// The bounds of Options.Requests.
const (
	DefaultRequests = 100
	MaxRequests     = 1000
)

// MaxConcurrentPolls bounds the /live/data answers being made at once
// (each encodes up to MaxRequests records): a poll beyond them gets a
// 503 with Retry-After, counted as busy. An open page polls every 2 s,
// one poll at a time.
const MaxConcurrentPolls = 4

// Options configure the live page.
type Options struct {
	// Requests is how many finished requests the page keeps and shows:
	// 0 means DefaultRequests; at most MaxRequests (clamped).
	Requests int
	// Trend gives the rolling figures; nil: none shown.
	Trend *slo.Trend
	// StallThreshold is the gap above which the page marks a stall (the
	// SLO section's stall_threshold); 0 means 1 s.
	StallThreshold time.Duration
	// Synthetic, when not empty, is shown as a warning on the page and
	// in its data: the numbers come from the built-in simulator, and
	// what else is made up (a demo SLO, a demo price, demo load).
	Synthetic string
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
	// Registry receives tokentap_live_polls_total; nil: not exported.
	Registry prometheus.Registerer
}

// Page is the live page: a record sink and its HTTP handler.
type Page struct {
	o      Options
	static http.Handler
	polls  chan struct{} // MaxConcurrentPolls slots
	// counted counts the /live/data polls by result (docs/metrics.md).
	counted *prometheus.CounterVec

	mu   sync.Mutex
	ring []*record.Record // the last len(ring) records, ring[next] the oldest once full
	next int
	n    int    // records held
	seq  uint64 // records written ever
}

// New returns the live page.
func New(o Options) *Page {
	if o.Requests <= 0 {
		o.Requests = DefaultRequests
	}
	o.Requests = min(o.Requests, MaxRequests)
	if o.StallThreshold <= 0 {
		o.StallThreshold = time.Second
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	sub, _ := fs.Sub(static, "static")
	p := &Page{o: o, ring: make([]*record.Record, o.Requests), static: http.StripPrefix("/live/static/", http.FileServerFS(sub)),
		polls: make(chan struct{}, MaxConcurrentPolls),
		counted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_live_polls_total",
			Help: "Polls of the live page's data (/live/data) by result: served (records encoded), unchanged (nothing new since the caller's last poll), busy (refused with a 503: MaxConcurrentPolls answers were being made), bad_request (a query parameter out of bounds)."},
			[]string{"result"})}
	for _, r := range []string{"served", "unchanged", "busy", "bad_request"} {
		p.counted.WithLabelValues(r)
	}
	if o.Registry != nil {
		o.Registry.MustRegister(p.counted)
	}
	return p
}

// Write keeps a finished record (record.Sink): one pointer stored under
// a lock held for nothing else, once per request. A record that never
// arrived (a probe not sent) is not kept.
func (p *Page) Write(r *record.Record) {
	if r.Arrive.IsZero() || r.Outcome == record.NotSent {
		return
	}
	p.mu.Lock()
	p.ring[p.next] = r
	p.next = (p.next + 1) % len(p.ring)
	p.n = min(p.n+1, len(p.ring))
	p.seq++
	p.mu.Unlock()
}

// last returns the newest n records of tenant (every record for ""),
// oldest first, the sequence number of the newest record kept, and the
// tenant labels among the records kept, sorted.
func (p *Page) last(n int, tenant string) ([]*record.Record, uint64, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*record.Record
	seen := map[string]bool{}
	for i := range p.n {
		r := p.ring[(p.next-1-i+2*len(p.ring))%len(p.ring)]
		if r.Tenant != "" {
			seen[r.Tenant] = true
		}
		if len(out) < n && (tenant == "" || r.Tenant == tenant) {
			out = append(out, r)
		}
	}
	slices.Reverse(out)
	tenants := make([]string, 0, len(seen))
	for t := range seen {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	return out, p.seq, tenants
}

// Data is the /live/data document.
type Data struct {
	Generated time.Time `json:"generated"`
	// Seq counts the records kept ever; a poll with since=Seq gets no
	// records back (Unchanged).
	Seq       uint64 `json:"seq"`
	Unchanged bool   `json:"unchanged,omitempty"`
	// Capacity is how many records the page keeps (Options.Requests).
	Capacity         int           `json:"capacity"`
	StallThresholdMS float64       `json:"stall_threshold_ms"`
	Synthetic        string        `json:"synthetic,omitempty"`
	Trend            *slo.TrendDoc `json:"trend,omitempty"`
	// Tenants are the tenant labels among the records kept (docs/slo.md,
	// per tenant), for the page's filter; absent when tenants are off.
	Tenants []string `json:"tenants,omitempty"`
	// Records are the newest finished requests, oldest first, each as
	// its record line (docs/records.md): never a prompt or an answer.
	// Written last (serveData); empty when Unchanged.
	Records []json.RawMessage `json:"records,omitempty"`
}

// ServeHTTP serves GET /live (the page), /live/static/* (its files) and
// /live/data (its data; query: n, the records wanted, 1 to the
// capacity, since, the Seq of the caller's last poll, and tenant, a
// tenant label: only that tenant's records).
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch path := r.URL.Path; {
	case path == "/live" || path == "/live/":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		b, _ := static.ReadFile("static/live.html")
		w.Write(b)
	case path == "/live/data":
		p.serveData(w, r)
	default:
		w.Header().Set("Cache-Control", "no-cache")
		p.static.ServeHTTP(w, r)
	}
}

func (p *Page) serveData(w http.ResponseWriter, r *http.Request) {
	select {
	case p.polls <- struct{}{}:
		defer func() { <-p.polls }()
	default:
		p.counted.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "2")
		http.Error(w, "busy: too many polls of /live/data at once", http.StatusServiceUnavailable)
		return
	}
	q := r.URL.Query()
	n := len(p.ring)
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > len(p.ring) {
			p.counted.WithLabelValues("bad_request").Inc()
			http.Error(w, "n: a count of records from 1 to "+strconv.Itoa(len(p.ring)), http.StatusBadRequest)
			return
		}
		n = v
	}
	var since uint64
	hasSince := false
	if s := q.Get("since"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			p.counted.WithLabelValues("bad_request").Inc()
			http.Error(w, "since: the seq of a previous poll", http.StatusBadRequest)
			return
		}
		since, hasSince = v, true
	}
	recs, seq, tenants := p.last(n, q.Get("tenant"))
	d := Data{Generated: p.o.Clock().UTC(), Seq: seq, Capacity: len(p.ring), StallThresholdMS: float64(p.o.StallThreshold) / 1e6,
		Synthetic: p.o.Synthetic, Tenants: tenants, Unchanged: hasSince && since == seq}
	if p.o.Trend != nil {
		t := p.o.Trend.Doc()
		d.Trend = &t
	}
	// The document is written in two parts: everything but the records
	// through encoding/json, then the records as their own encoder
	// wrote them (encoding/json would check and compact each again,
	// doubling a poll's cost).
	d.Records = nil
	head, err := json.Marshal(d)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var lines [][]byte
	size := len(head) + 16
	if hasSince && since == seq {
		p.counted.WithLabelValues("unchanged").Inc()
	} else {
		p.counted.WithLabelValues("served").Inc()
		for _, rec := range recs {
			b, _ := rec.MarshalJSON() // never fails
			lines = append(lines, b)
			size += len(b) + 1
		}
	}
	out := append(make([]byte, 0, size), head[:len(head)-1]...)
	out = append(out, `,"records":[`...)
	for i, b := range lines {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	out = append(out, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(out)
}
