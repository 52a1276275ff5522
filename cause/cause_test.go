package cause

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// t0 is the scripted clock's zero: every instant below is t0 plus an
// offset, no wall clock read.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// req is one scripted request: its arrival, first token and end in ms,
// its prompt's bytes, and its token events after the first (ms).
type req struct {
	id                 string
	arrive, first, end int
	bytes              int64
	tokens             []int // token event instants after the first, ms
	slo                string
	connWait           time.Duration
	noFirstToken       bool
}

func (q req) record() *record.Record {
	r := record.New(8)
	r.ID, r.Arrive, r.Stream, r.Outcome = q.id, at(q.arrive), true, record.Success
	if !q.noFirstToken {
		r.AddToken(at(q.first), 1, true)
		for _, t := range q.tokens {
			r.AddToken(at(t), 1, true)
		}
	}
	r.Terminal = at(q.end)
	if q.slo != "" {
		r.SLO = []record.Verdict{{Name: q.slo}}
	}
	if q.connWait > 0 {
		r.Upstream.Asked = true
		r.Upstream.Set(record.UpConnWait, q.connWait)
	}
	return r
}

// fakeEngine is a scripted engine scraper: preemptions at the given
// instants, the waiting queue at scrapes every 100 ms from t0 − 1 s,
// queue[i] requests waiting within window i, none outside.
type fakeEngine struct {
	preempt []time.Time
	queue   []window
}

type window struct {
	from, to time.Time
	n        float64
}

func (f *fakeEngine) PreemptionsDuring(a, b time.Time) (int, bool) {
	n := 0
	for _, p := range f.preempt {
		if !p.Before(a) && !p.After(b) {
			n++
		}
	}
	return n, true
}

func (f *fakeEngine) WaitingBetween(from, to time.Time, fn func(time.Time, float64)) {
	for t := at(-1000); t.Before(to); t = t.Add(100 * time.Millisecond) {
		if t.Add(100 * time.Millisecond).After(from) {
			n := 0.0
			for _, w := range f.queue {
				if !t.Before(w.from) && t.Before(w.to) {
					n = w.n
				}
			}
			fn(t, n)
		}
	}
}

// run scripts the requests through an attributor in event order (each
// one begins, gets its first token, ends, when its instant comes) and
// returns the records by id.
func run(t *testing.T, o Options, reqs ...req) map[string]*record.Record {
	t.Helper()
	a := New(o)
	type ev struct {
		ms   int
		kind int // 0 begin, 1 first, 2 end
		i    int
	}
	var evs []ev
	for i, q := range reqs {
		evs = append(evs, ev{q.arrive, 0, i}, ev{q.end, 2, i})
		if !q.noFirstToken {
			evs = append(evs, ev{q.first, 1, i})
		}
	}
	// stable order: by instant, then begin < first < end
	for i := 1; i < len(evs); i++ {
		for j := i; j > 0 && (evs[j].ms < evs[j-1].ms || evs[j].ms == evs[j-1].ms && evs[j].kind < evs[j-1].kind); j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
	recs := map[string]*record.Record{}
	tracked := map[int]Tracked{}
	for _, q := range reqs {
		recs[q.id] = q.record()
	}
	for _, e := range evs {
		q := reqs[e.i]
		switch e.kind {
		case 0: // written upstream at once: reached the engine at arrival
			tracked[e.i] = a.Begin(recs[q.id], q.bytes)
			tracked[e.i].Sent(at(q.arrive))
		case 1:
			tracked[e.i].First(at(q.first))
		case 2:
			tracked[e.i].End(recs[q.id])
		}
	}
	return recs
}

func causes(r *record.Record) string {
	var s []string
	for _, c := range r.Causes {
		x := c.What + ":" + c.Cause
		if c.Ref != "" {
			x += "→" + c.Ref
		}
		s = append(s, fmt.Sprintf("%s/%.0f", x, c.Ms))
	}
	return strings.Join(s, " ")
}

func sloTTFT(d time.Duration) config.SLO {
	return config.SLO{StallThreshold: 500 * time.Millisecond,
		Objectives: []config.Objective{{Name: "chat", Target: 0.9, Thresholds: config.Thresholds{TTFT: d}}}}
}

// short prompts that set the median: 200 bytes each.
func background(n int) []req {
	var rs []req
	for i := range n {
		rs = append(rs, req{id: fmt.Sprintf("bg%d", i), arrive: -10000 + i, first: -9900 + i, end: -9800 + i, bytes: 200})
	}
	return rs
}

func TestNothingSlowNoCauses(t *testing.T) {
	recs := run(t, Options{SLO: sloTTFT(time.Second)}, req{id: "a", arrive: 0, first: 900, end: 1000, bytes: 100, slo: "chat", tokens: []int{950}})
	if c := recs["a"].Causes; c != nil {
		t.Fatalf("causes %v for a request on time with no stall", causes(recs["a"]))
	}
}

func TestTTFTThresholds(t *testing.T) {
	// The SLO's ttft judges a request in its scope; slow_ttft one that
	// no objective with a ttft holds; neither: never slow.
	cfg := sloTTFT(time.Second)
	cfg.SlowTTFT = 3 * time.Second
	recs := run(t, Options{SLO: cfg},
		req{id: "in", arrive: 0, first: 2000, end: 2100, bytes: 100, slo: "chat"},
		req{id: "out", arrive: 0, first: 2000, end: 2100, bytes: 100},
		req{id: "out-slow", arrive: 0, first: 3500, end: 3600, bytes: 100})
	if got := causes(recs["in"]); got != "ttft:unexplained/2000" {
		t.Errorf("in the SLO's scope: %q", got)
	}
	if got := causes(recs["out"]); got != "" {
		t.Errorf("out of scope under slow_ttft: %q", got)
	}
	if got := causes(recs["out-slow"]); got != "ttft:unexplained/3500" {
		t.Errorf("out of scope over slow_ttft: %q", got)
	}
	recs = run(t, Options{}, req{id: "none", arrive: 0, first: 9000, end: 9100, bytes: 100})
	if got := causes(recs["none"]); got != "" {
		t.Errorf("no threshold at all: %q", got)
	}
}

func TestConnection(t *testing.T) {
	// 1.8 s of a 2.5 s first token went to the connection: 1.5 s over.
	recs := run(t, Options{SLO: sloTTFT(time.Second)},
		req{id: "a", arrive: 0, first: 2500, end: 2600, bytes: 100, slo: "chat", connWait: 1800 * time.Millisecond})
	if got := causes(recs["a"]); got != "ttft:connection/1800" {
		t.Fatalf("got %q", got)
	}
	// 0.3 s of set-up does not explain half of 1.5 s over.
	recs = run(t, Options{SLO: sloTTFT(time.Second)},
		req{id: "a", arrive: 0, first: 2500, end: 2600, bytes: 100, slo: "chat", connWait: 300 * time.Millisecond})
	if got := causes(recs["a"]); got != "ttft:unexplained/2500" {
		t.Fatalf("got %q", got)
	}
}

func TestQueueAtCapacity(t *testing.T) {
	// Two sequences at most: x and y run when a arrives; y ends at 1700
	// and frees a sequence: 1.7 s of a's 2 s wait, pointing to y.
	reqs := append(background(8),
		req{id: "x", arrive: -500, first: -400, end: 3000, bytes: 200},
		req{id: "y", arrive: -300, first: -200, end: 1700, bytes: 200},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
	recs := run(t, Options{SLO: sloTTFT(time.Second), MaxRunning: 2}, reqs...)
	if got := causes(recs["a"]); got != "ttft:queue→y/1700" {
		t.Fatalf("got %q", got)
	}
	// With room for three, the same requests in flight are no queue.
	recs = run(t, Options{SLO: sloTTFT(time.Second), MaxRunning: 3}, reqs...)
	if got := causes(recs["a"]); got != "ttft:unexplained/2000" {
		t.Fatalf("room for three: got %q", got)
	}
}

func TestQueueFromTheEngineGauge(t *testing.T) {
	// One waiting from before a's arrival to 1.6 s: a waited until the
	// scrape that saw none.
	eng := &fakeEngine{queue: []window{{at(-100), at(1600), 1}}}
	recs := run(t, Options{SLO: sloTTFT(time.Second), Engine: eng},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
	if got := causes(recs["a"]); got != "ttft:queue/1600" {
		t.Fatalf("got %q", got)
	}
	// A queue drained 100 ms after arrival explains too little.
	eng.queue = []window{{at(-100), at(100), 1}}
	recs = run(t, Options{SLO: sloTTFT(time.Second), Engine: eng},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
	if got := causes(recs["a"]); got != "ttft:unexplained/2000" {
		t.Fatalf("got %q", got)
	}
	// One waiting, and b arrived after a and waits: the one waiting is b,
	// behind a, not a.
	eng.queue = []window{{at(50), at(1900), 1}}
	recs = run(t, Options{SLO: sloTTFT(time.Second), Engine: eng},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"},
		req{id: "b", arrive: 10, first: 2050, end: 2200, bytes: 200})
	if got := causes(recs["a"]); got != "ttft:unexplained/2000" {
		t.Fatalf("a queue behind a: got %q", got)
	}
}

func TestLongPrefillAhead(t *testing.T) {
	// L (40 KB, 200 times the median) arrived before a and gave its
	// first token at 1800: a waited behind it.
	reqs := append(background(20),
		req{id: "L", arrive: -200, first: 1800, end: 5000, bytes: 40000},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
	recs := run(t, Options{SLO: sloTTFT(time.Second)}, reqs...)
	if got := causes(recs["a"]); got != "ttft:long_prefill_ahead→L/1800" {
		t.Fatalf("got %q", got)
	}
	// A prompt as long as the others is not long, nor one that had its
	// first token before a arrived, nor one that arrived after a.
	for _, other := range []req{
		{id: "L", arrive: -200, first: 1800, end: 5000, bytes: 300},
		{id: "L", arrive: -200, first: -10, end: 5000, bytes: 40000},
		{id: "L", arrive: 10, first: 1800, end: 5000, bytes: 40000},
	} {
		reqs := append(background(20), other, req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
		recs := run(t, Options{SLO: sloTTFT(time.Second)}, reqs...)
		if got := causes(recs["a"]); got != "ttft:unexplained/2000" {
			t.Errorf("%+v: got %q", other, got)
		}
	}
}

func TestStallPreemption(t *testing.T) {
	eng := &fakeEngine{preempt: []time.Time{at(1200)}}
	reqs := append(background(20),
		req{id: "L", arrive: 1000, first: 1900, end: 5000, bytes: 40000}, // a long prefill too: the preemption comes first
		req{id: "a", arrive: 0, first: 100, end: 3000, bytes: 200, tokens: []int{500, 1000, 2000, 2100}})
	recs := run(t, Options{SLO: sloTTFT(time.Second), Engine: eng}, reqs...)
	if got := causes(recs["a"]); got != "stall:preemption/1000" {
		t.Fatalf("got %q", got)
	}
	if c := recs["a"].Causes[0]; !c.At.Equal(at(1000)) {
		t.Fatalf("the stall starts at %v, want %v", c.At, at(1000))
	}
}

func TestStallPrefillInterference(t *testing.T) {
	// a's gap 1000→2000 (1 s, over 0.5 s): L's prefill 1100→1950 covers
	// 850 ms of it; S's short one overlaps too but is not long.
	reqs := append(background(20),
		req{id: "L", arrive: 1100, first: 1950, end: 5000, bytes: 40000},
		req{id: "S", arrive: 1000, first: 1990, end: 2500, bytes: 200},
		req{id: "a", arrive: 0, first: 100, end: 3000, bytes: 200, tokens: []int{500, 1000, 2000, 2100}})
	recs := run(t, Options{SLO: sloTTFT(time.Second), Engine: &fakeEngine{}}, reqs...)
	if got := causes(recs["a"]); got != "stall:prefill_interference→L/850" {
		t.Fatalf("got %q", got)
	}
	// A prefill that covers under half the stall does not explain it.
	reqs = append(background(20),
		req{id: "L", arrive: 1700, first: 1950, end: 5000, bytes: 40000},
		req{id: "a", arrive: 0, first: 100, end: 3000, bytes: 200, tokens: []int{500, 1000, 2000, 2100}})
	recs = run(t, Options{SLO: sloTTFT(time.Second)}, reqs...)
	if got := causes(recs["a"]); got != "stall:unexplained/1000" {
		t.Fatalf("a quarter covered: got %q", got)
	}
}

func TestStallWhileTheLongPromptIsStillInPrefill(t *testing.T) {
	// a ends while L has not yet given its first token: L's window runs
	// to the stall's end.
	reqs := append(background(20),
		req{id: "L", arrive: 1100, first: 6000, end: 7000, bytes: 40000},
		req{id: "a", arrive: 0, first: 100, end: 2100, bytes: 200, tokens: []int{500, 1000, 2000}})
	recs := run(t, Options{SLO: sloTTFT(time.Second)}, reqs...)
	if got := causes(recs["a"]); got != "stall:prefill_interference→L/900" {
		t.Fatalf("got %q", got)
	}
}

func TestCausesBounded(t *testing.T) {
	var tokens []int
	for i := 1; i <= record.MaxCauses+10; i++ {
		tokens = append(tokens, 100+i*1000)
	}
	last := tokens[len(tokens)-1]
	recs := run(t, Options{SLO: sloTTFT(time.Second)},
		req{id: "a", arrive: 0, first: 100, end: last + 1, bytes: 200, tokens: tokens})
	r := recs["a"]
	if len(r.Causes) != record.MaxCauses || r.CausesCut != 10 {
		t.Fatalf("%d causes, %d cut; want %d and 10", len(r.Causes), r.CausesCut, record.MaxCauses)
	}
}

func TestRegistryBounded(t *testing.T) {
	a := New(Options{Requests: 4})
	for i := range 10 {
		r := record.New(1)
		r.ID, r.Arrive = fmt.Sprint(i), at(i)
		a.Begin(r, 100)
	}
	n := 0
	for _, e := range a.ring {
		if e != nil {
			n++
		}
	}
	if n != 4 || a.ring[(a.next+3)%4].id != "9" {
		t.Fatalf("registry holds %d, newest %q", n, a.ring[(a.next+3)%4].id)
	}
	if tr := a.Begin(record.New(1), 0); tr != nil {
		t.Fatal("a request with no prompt was tracked")
	}
}

func TestPrecedence(t *testing.T) {
	// The engine's queue during a long prefill ahead is that prefill's:
	// long_prefill_ahead, naming it.
	eng := &fakeEngine{queue: []window{{at(-100), at(1900), 1}}}
	reqs := append(background(20),
		req{id: "L", arrive: -200, first: 1800, end: 5000, bytes: 40000},
		req{id: "a", arrive: 0, first: 2000, end: 2100, bytes: 200, slo: "chat"})
	recs := run(t, Options{SLO: sloTTFT(time.Second), Engine: eng}, reqs...)
	if got := causes(recs["a"]); got != "ttft:long_prefill_ahead→L/1800" {
		t.Errorf("long prefill and the engine's queue: got %q", got)
	}
	// A connection that explains more than the engine's cause wins.
	reqs[len(reqs)-1] = req{id: "a", arrive: 0, first: 4000, end: 4100, bytes: 200, slo: "chat", connWait: 2200 * time.Millisecond}
	recs = run(t, Options{SLO: sloTTFT(time.Second), Engine: eng}, reqs...)
	if got := causes(recs["a"]); got != "ttft:connection/2200" {
		t.Errorf("a 2.2 s connection against a 1.8 s prefill ahead: got %q", got)
	}
}
