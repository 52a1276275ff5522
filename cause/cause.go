// Package cause says why a request was slow: a cause for every slow
// first token and every stall (docs/measurement.md §6b, "Why slow"),
// attributed when the request ends, off the token path.
//
// An Attributor keeps a bounded registry of the recent requests'
// prefill windows: each request's arrival, prompt size and, once they
// happen, its first token and its end. Begin adds a request at arrival
// (one lock, once per request), First stamps its first token (one atomic
// store, once per request), End stamps its end and attributes its slow
// events from the registry, the record and the engine's scrapes. Nothing
// is done per token event.
//
// The rules, in the order they are tried (each with its evidence and
// limits in docs/measurement.md §6b):
//
//	first token (TTFT over its SLO's threshold, or over slo.slow_ttft):
//	  connection          the upstream's set-up phases explain the excess
//	  queue               the engine reported waiting requests at arrival,
//	                      or the requests in flight were at engine.max_running
//	  long_prefill_ahead  an earlier request with a long prompt was still
//	                      before its first token at this one's arrival
//	stall (a gap over slo.stall_threshold):
//	  preemption          the engine's preemption counter advanced across it
//	  prefill_interference a long prompt's prefill window overlaps it
//	both:
//	  unexplained         nothing above holds
package cause

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// The slow events (record.Cause.What).
const (
	TTFT  = "ttft"
	Stall = "stall"
)

// The causes (record.Cause.Cause): a bounded set, safe as a label.
const (
	Connection          = "connection"
	Queue               = "queue"
	LongPrefillAhead    = "long_prefill_ahead"
	PrefillInterference = "prefill_interference"
	Preemption          = "preemption"
	Unexplained         = "unexplained"
)

// Pairs are every (event, cause) pair an event can be given, in the
// order the metric's series are created: a first token is never put
// down to a preemption or an interfering prefill (it has not decoded
// yet), a stall never to the connection, a queue or a prompt ahead.
var Pairs = [...]struct{ What, Cause string }{
	{TTFT, Connection}, {TTFT, Queue}, {TTFT, LongPrefillAhead}, {TTFT, Unexplained},
	{Stall, Preemption}, {Stall, PrefillInterference}, {Stall, Unexplained},
}

// The rule's constants (docs/measurement.md §6b).
const (
	// DefaultRequests is the registry's size when Options.Requests is
	// 0: the last 1024 arrivals.
	DefaultRequests = 1024
	// LongFactor: a prompt is long when its size is at least LongFactor
	// times the median of the registry's arrivals...
	LongFactor = 4
	// LongMinBytes: ...and at least this many bytes (about 500 tokens):
	// a prompt that short stalls no engine, whatever the median.
	LongMinBytes = 2048
)

// Engine is what the engine scraper (engine.Scraper) knows of the
// engine around a request.
type Engine interface {
	// PreemptionsDuring returns how far the engine's preemption counter
	// advanced during the stall [from, to] (at scrape resolution); ok
	// false when unknown.
	PreemptionsDuring(from, to time.Time) (n int, ok bool)
	// WaitingBetween calls fn with the engine's waiting queue at every
	// scrape from the last one at or before from to the last one before
	// to, in order; never when the engine exports no queue.
	WaitingBetween(from, to time.Time, fn func(at time.Time, waiting float64))
}

// Options configure an Attributor. The zero value attributes stalls
// over 1s and first tokens over no threshold (none is slow), with no
// engine and no declared capacity.
type Options struct {
	// SLO gives the thresholds: each objective's ttft, slow_ttft for a
	// request no objective with a ttft holds, and the stall threshold.
	SLO config.SLO
	// MaxRunning is the engine's declared capacity, its max running
	// sequences (engine.max_running); 0: unknown, the queue rule then
	// rests on the engine's waiting gauge alone.
	MaxRunning int
	// Engine is the engine scraper; nil: none (no queue gauge, no
	// preemptions).
	Engine Engine
	// Requests bounds the registry (0: DefaultRequests).
	Requests int
}

// Attributor attributes slow events. Its methods are safe for
// concurrent use.
type Attributor struct {
	o    Options
	ttft map[string]time.Duration // objective → its ttft threshold, when it has one

	mu       sync.Mutex
	ring     []*entry // the last len(ring) arrivals, oldest overwritten
	next     int      // the slot the next arrival takes
	arrivals int      // arrivals counted since the start
	median   int64    // the registry's median prompt size (scan), as of medianAt arrivals
	medianAt int
	sizes    []int64 // scan's scratch
}

// entry is one request in the registry. id, arrive and size never
// change; first and end are stamped once each, atomically.
type entry struct {
	id     string
	arrive time.Time
	size   int64        // the prompt's size in body bytes
	sent   atomic.Int64 // when it was written to the engine, from arrive, +1; 0: not yet
	first  atomic.Int64 // the first token's offset from arrive, +1; 0: none yet
	end    atomic.Int64 // the end's offset from arrive, +1; 0: running
	// resumed holds when each of its stalls put down to a preemption
	// ended (its recompute done), set once at its end; nil before.
	resumed atomic.Pointer[[]time.Time]
}

func stamp(v *atomic.Int64, arrive, t time.Time) {
	v.CompareAndSwap(0, int64(max(t.Sub(arrive), 0))+1)
}

func (e *entry) at(v *atomic.Int64) (time.Time, bool) {
	n := v.Load()
	if n == 0 {
		return time.Time{}, false
	}
	return e.arrive.Add(time.Duration(n - 1)), true
}

// New returns an attributor; o.SLO must be valid (its zero fields take
// their defaults).
func New(o Options) *Attributor {
	o.SLO = o.SLO.WithDefaults()
	if o.Requests <= 0 {
		o.Requests = DefaultRequests
	}
	a := &Attributor{o: o, ttft: map[string]time.Duration{}, ring: make([]*entry, o.Requests)}
	for _, ob := range o.SLO.Objectives {
		if ob.Thresholds.TTFT > 0 {
			a.ttft[ob.Name] = ob.Thresholds.TTFT
		}
	}
	return a
}

// Tracked is one request in the registry: Sent when it was written to
// the engine, First at its first token, End once it has ended. (An
// alias: pipeline.CauseEntry is the same type.)
type Tracked = interface {
	Sent(t time.Time)
	First(t time.Time)
	End(rec *record.Record)
}

// Begin adds a request to the registry at its arrival: rec has its id
// and arrival set; promptBytes is its prompt's size in request body
// bytes (0 or negative: a request that occupies no sequence, not
// tracked: nil).
func (a *Attributor) Begin(rec *record.Record, promptBytes int64) Tracked {
	if promptBytes <= 0 {
		return nil
	}
	e := &entry{id: rec.ID, arrive: rec.Arrive, size: promptBytes}
	a.mu.Lock()
	a.ring[a.next] = e
	a.next = (a.next + 1) % len(a.ring)
	a.arrivals++
	a.mu.Unlock()
	return &tracked{a: a, e: e}
}

type tracked struct {
	a *Attributor
	e *entry
}

// Sent stamps when the request was written to the engine (once; later
// calls do nothing): the engine had it from then.
func (t *tracked) Sent(at time.Time) { stamp(&t.e.sent, t.e.arrive, at) }

// First stamps the request's first token (once; later calls do
// nothing).
func (t *tracked) First(at time.Time) { stamp(&t.e.first, t.e.arrive, at) }

// End stamps the request's end and sets rec.Causes and rec.CausesCut:
// rec is finished and judged (its verdicts and stall count set).
func (t *tracked) End(rec *record.Record) {
	end := rec.Terminal
	if end.IsZero() {
		end = rec.LastToken
	}
	if end.IsZero() {
		end = rec.Arrive
	}
	stamp(&t.e.end, t.e.arrive, end)
	if !rec.FirstToken.IsZero() {
		stamp(&t.e.first, t.e.arrive, rec.FirstToken)
	}
	t.a.attribute(rec, t.e)
	var resumed []time.Time
	for _, c := range rec.Causes {
		if c.What == Stall && c.Cause == Preemption && c.Ref == "" {
			resumed = append(resumed, c.At.Add(time.Duration(c.Ms*float64(time.Millisecond))))
		}
	}
	if resumed != nil {
		t.e.resumed.Store(&resumed)
	}
}

// view is a long-prompt request of the registry as one attribution
// sees it.
type view struct {
	id           string
	arrive       time.Time // when the engine had it (reached)
	size         int64
	first, end   time.Time
	hasFirst, up bool // up: still running when looked at
}

// scene is what one attribution reads from the registry: the long
// prompts alive at some time in [from, to] (arrived by to, not ended
// before from), and, for the queue rule, the requests in flight at the
// arrival and the first of them to end.
type scene struct {
	long     []view
	after    []pending // the requests that arrived after from and by to, for the queue gauge's rule
	inflight int       // requests in flight at from (rec's arrival), rec aside
	freed    time.Time // the first end among them, zero when none ended
	freedID  string
	resumed  []resume // the other requests' preemption stalls that ended in [from, to]
}

// resume is when a preempted request's stall ended: its recompute done.
type resume struct {
	at time.Time
	id string
}

// pending is a request that reached the engine after the attributed
// one: when, and its first token (zero: none yet).
type pending struct{ arrive, first time.Time }

// medianEvery is how many arrivals the cached median of prompt sizes
// serves before it is computed again.
const medianEvery = 64

// scan reads the registry for an attribution of self's record, alive
// over [from, to], under the registry's lock: one pass over the ring,
// and the median of its prompt sizes, computed again every medianEvery
// arrivals.
func (a *Attributor) scan(self *entry, from, to time.Time) scene {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.arrivals-a.medianAt >= medianEvery || a.medianAt == 0 {
		a.sizes = a.sizes[:0]
		for _, e := range a.ring {
			if e != nil {
				a.sizes = append(a.sizes, e.size)
			}
		}
		slices.Sort(a.sizes)
		if len(a.sizes) > 0 {
			a.median = a.sizes[(len(a.sizes)-1)/2] // the lower median
		}
		a.medianAt = max(a.arrivals, 1)
	}
	var sc scene
	for _, e := range a.ring {
		if e == nil || e == self || e.arrive.After(to) {
			continue
		}
		end, ended := e.at(&e.end)
		if ended && end.Before(from) {
			continue
		}
		// When the engine had it: written upstream; one never written
		// (refused at the sidecar, or not yet) is not the engine's.
		at, sent := e.at(&e.sent)
		if !sent {
			continue
		}
		if at.After(from) {
			p := pending{arrive: at}
			p.first, _ = e.at(&e.first)
			sc.after = append(sc.after, p)
		}
		if at.Before(from) && (!ended || end.After(from)) {
			sc.inflight++
			if ended && (sc.freed.IsZero() || end.Before(sc.freed)) {
				sc.freed, sc.freedID = end, e.id
			}
		}
		if rs := e.resumed.Load(); rs != nil {
			for _, r := range *rs {
				if !r.Before(from) && !r.After(to) {
					sc.resumed = append(sc.resumed, resume{r, e.id})
				}
			}
		}
		if !long(e.size, a.median) {
			continue
		}
		v := view{id: e.id, arrive: at, size: e.size, end: end, up: !ended}
		v.first, v.hasFirst = e.at(&e.first)
		sc.long = append(sc.long, v)
	}
	return sc
}

// long reports whether a prompt of size bytes is long against median.
func long(size, median int64) bool { return size >= LongMinBytes && size >= LongFactor*median }

// attribute sets rec.Causes and rec.CausesCut from the registry (self
// is rec's own entry) and the engine: End's work, once per finished,
// judged record.
func (a *Attributor) attribute(rec *record.Record, self *entry) {
	rec.Causes, rec.CausesCut = nil, 0
	if !rec.Stream || rec.FirstToken.IsZero() || rec.Arrive.IsZero() {
		return
	}
	ttft := rec.FirstToken.Sub(rec.Arrive)
	th, slowFirst := a.ttftThreshold(rec)
	slowFirst = slowFirst && ttft > th
	stalls := a.stalls(rec)
	if !slowFirst && len(stalls) == 0 {
		return
	}
	end := rec.Terminal
	if end.IsZero() {
		end = rec.LastToken
	}
	sc := a.scan(self, reach(rec), end)
	if slowFirst {
		rec.Causes = append(rec.Causes, a.firstToken(rec, th, &sc))
	}
	for _, s := range stalls {
		if len(rec.Causes) >= record.MaxCauses {
			rec.CausesCut++
			continue
		}
		rec.Causes = append(rec.Causes, a.stall(s[0], s[1], &sc))
	}
}

// ttftThreshold returns the first token's threshold: the smallest ttft
// of the objectives that judged rec, else slo.slow_ttft; ok false when
// neither sets one.
func (a *Attributor) ttftThreshold(rec *record.Record) (time.Duration, bool) {
	var th time.Duration
	for i := range rec.SLO {
		if t := a.ttft[rec.SLO[i].Name]; t > 0 && (th == 0 || t < th) {
			th = t
		}
	}
	if th == 0 {
		th = a.o.SLO.SlowTTFT
	}
	return th, th > 0
}

// stalls returns the start and end of every gap over the stall
// threshold, in time order; with several choices, the gaps of each
// choice (record.Record.Gaps).
func (a *Attributor) stalls(rec *record.Record) [][2]time.Time {
	th := a.o.SLO.StallThreshold
	var out [][2]time.Time
	add := func(from, to time.Duration) {
		if to-from > th {
			out = append(out, [2]time.Time{rec.Arrive.Add(from), rec.Arrive.Add(to)})
		}
	}
	if rec.Choices == nil {
		for i := 1; i < len(rec.TokenAt); i++ {
			add(rec.TokenAt[i-1], rec.TokenAt[i])
		}
		return out
	}
	last := map[uint8]time.Duration{}
	for i, at := range rec.TokenAt {
		if i >= len(rec.EventChoice) {
			break
		}
		c := rec.EventChoice[i]
		if c == record.UntrackedChoice {
			continue
		}
		if prev, ok := last[c]; ok {
			add(prev, at)
		}
		last[c] = at
	}
	slices.SortFunc(out, func(x, y [2]time.Time) int { return x[0].Compare(y[0]) })
	return out
}

// firstToken attributes a slow first token: TTFT over th. A cause must
// explain at least half the excess over th. Of the engine's causes a
// long prefill ahead comes before the queue: it is the more specific
// evidence (it names the request), and the engine's queue during a long
// prefill is that prefill's queue. The connection wins when it explains
// more than the engine's cause.
func (a *Attributor) firstToken(rec *record.Record, th time.Duration, sc *scene) record.Cause {
	f := rec.FirstToken
	ttft := f.Sub(rec.Arrive)
	excess := ttft - th
	explains := func(d time.Duration) bool { return d > 0 && 2*d >= excess }
	c := record.Cause{What: TTFT, Cause: Unexplained, Ms: ms(ttft)}
	var engineD time.Duration
	at := reach(rec) // the engine's causes start when the engine had the request
	if d, ref := a.longAhead(at, f, sc); explains(d) {
		c.Cause, c.Ms, c.Ref, engineD = LongPrefillAhead, ms(d), ref, d
	} else if d, ref := a.queue(at, f, sc); explains(d) {
		c.Cause, c.Ms, c.Ref, engineD = Queue, ms(d), ref, d
	}
	// The set-up is measured, not inferred: it holds when it explains
	// half the excess, or alone took longer than the whole threshold.
	if d := setup(&rec.Upstream); (explains(d) || d > th) && d > engineD {
		c.Cause, c.Ms, c.Ref = Connection, ms(d), ""
	}
	return c
}

// longAhead returns how long the long prompts ahead explain of a first
// token's wait [arrive, f]: the earlier arrivals with long prompts still
// before their first token at arrive, until the last of their first
// tokens (or f, or its end when one ended without), pointing to that one
// (ties: the longest prompt). 0 when there is none.
func (a *Attributor) longAhead(arrive, f time.Time, sc *scene) (time.Duration, string) {
	var until time.Time
	var ref string
	var refSize int64
	for i := range sc.long {
		v := &sc.long[i]
		if !v.arrive.Before(arrive) || (v.hasFirst && !v.first.After(arrive)) || (!v.hasFirst && !v.up && !v.end.After(arrive)) {
			continue
		}
		u := f
		switch {
		case v.hasFirst && v.first.Before(f):
			u = v.first
		case !v.hasFirst && !v.up && v.end.Before(f):
			u = v.end
		}
		if u.After(until) || (u.Equal(until) && v.size > refSize) {
			until, ref, refSize = u, v.id, v.size
		}
	}
	if ref == "" {
		return 0, ""
	}
	return until.Sub(arrive), ref
}

// queue returns how long the queue explains of a first token's wait
// [arrive, f] and the request it points to: with the requests in flight
// at the declared capacity, until the first of them ended (a sequence
// freed), pointing to it; else, with the engine's gauge, from the
// arrival until the queue was seen drained, pointing to none. 0 when
// neither holds.
func (a *Attributor) queue(arrive, f time.Time, sc *scene) (time.Duration, string) {
	// At capacity, and a sequence freed before the first token: a freed
	// one after it would say the engine had room after all.
	if n := a.o.MaxRunning; n > 0 && sc.inflight >= n && !sc.freed.IsZero() && !sc.freed.After(f) {
		return sc.freed.Sub(arrive), sc.freedID
	}
	if a.o.Engine == nil {
		return 0, ""
	}
	// The gauge: this request was among the waiting at a scrape when the
	// engine reported more waiting than the requests that arrived after
	// it and were still before their first token (those behind it). It
	// waited from its arrival to the first later scrape that did not say
	// so (or its first token). With no scrape after the arrival, the one
	// before it stands: waiting then, this one waited behind them.
	var until time.Time
	var prior, inside, queued bool
	a.o.Engine.WaitingBetween(arrive, f, func(t time.Time, w float64) {
		if !t.After(arrive) {
			prior = w > 0
			return
		}
		inside = true
		if !until.IsZero() {
			return // the queue was seen left
		}
		behind := 0
		for _, p := range sc.after {
			if !p.arrive.After(t) && (p.first.IsZero() || p.first.After(t)) {
				behind++
			}
		}
		switch {
		case w > float64(behind):
			queued = true
		case queued:
			until = t
		}
	})
	if !inside && prior {
		queued, until = true, f
	}
	if !queued {
		return 0, ""
	}
	if until.IsZero() || until.After(f) {
		until = f
	}
	return until.Sub(arrive), ""
}

// stall attributes one stall [from, to].
func (a *Attributor) stall(from, to time.Time, sc *scene) record.Cause {
	gap := to.Sub(from)
	c := record.Cause{What: Stall, Cause: Unexplained, Ms: ms(gap), At: from}
	if a.o.Engine != nil {
		if n, ok := a.o.Engine.PreemptionsDuring(from, to); ok && n > 0 {
			c.Cause = Preemption
			return c
		}
	}
	// Another request's preemption stall ended during this one (within a
	// quarter of the gap after it, the same step's tokens arriving
	// apart): the engine's step recomputed it (ref: that request).
	for _, r := range sc.resumed {
		if r.at.After(from) && !r.at.After(to.Add(gap/4)) {
			c.Cause, c.Ref = Preemption, r.id
			return c
		}
	}
	vs := sc.long
	// The long prompts' prefill windows (arrival to first token, or to
	// now when none yet) that overlap the stall: their union's overlap.
	type span struct {
		from, to time.Time
		id       string
		size     int64
	}
	var spans []span
	for i := range vs {
		v := &vs[i]
		if !v.arrive.Before(to) {
			continue
		}
		end := to
		switch {
		case v.hasFirst:
			end = v.first
		case !v.up:
			end = v.end
		}
		s := span{from: maxTime(v.arrive, from), to: minTime(end, to), id: v.id, size: v.size}
		if s.to.After(s.from) {
			spans = append(spans, s)
		}
	}
	if len(spans) == 0 {
		return c
	}
	slices.SortFunc(spans, func(x, y span) int { return x.from.Compare(y.from) })
	var covered time.Duration
	var cur span
	ref, refD, refSize := "", time.Duration(-1), int64(0)
	for i, s := range spans {
		if d := s.to.Sub(s.from); d > refD || (d == refD && s.size > refSize) {
			ref, refD, refSize = s.id, d, s.size
		}
		switch {
		case i == 0:
			cur = s
		case !s.from.After(cur.to):
			cur.to = maxTime(cur.to, s.to)
		default:
			covered += cur.to.Sub(cur.from)
			cur = s
		}
	}
	covered += cur.to.Sub(cur.from)
	if 2*covered >= gap { // the prefills cover at least half the stall
		c.Cause, c.Ms, c.Ref = PrefillInterference, ms(covered), ref
	}
	return c
}

// reach is when the engine had the request: when the sidecar had
// written it upstream, else its arrival and the connection's set-up.
func reach(rec *record.Record) time.Time {
	if rec.UpstreamSent.After(rec.Arrive) {
		return rec.UpstreamSent
	}
	return rec.Arrive.Add(setup(&rec.Upstream))
}

// setup is the upstream's set-up: the wait for a connection (a new
// one's DNS, connect and TLS included), else their sum.
func setup(u *record.Upstream) time.Duration {
	if d, ok := u.Phase(record.UpConnWait); ok {
		return d
	}
	var s time.Duration
	for _, b := range [...]uint8{record.UpDNS, record.UpConnect, record.UpTLS} {
		if d, ok := u.Phase(b); ok {
			s += d
		}
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
