package engine

import (
	"math"
	"sort"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Stall causes (record.StallCause), in the order they are preferred.
const (
	CausePreemption  = "preemption"
	CauseKVCacheFull = "kv_cache_full"
	CauseQueueSpike  = "queue_spike"
)

// KVFull is the KV cache usage at or above which a stall is put down to a
// full cache.
const KVFull = 0.95

// maxSamples bounds the history: 8192 scrapes, 11 hours at 5 s, 14
// minutes at 100 ms (the shortest interval); a request older than the
// history is counted from its oldest sample.
const maxSamples = 8192

// sample is one scrape's state; NaN where the engine exports nothing.
type sample struct {
	t                    time.Time
	preempt              float64 // the followed preemption counter
	running, waiting, kv float64
}

type history struct{ s []sample }

func (h *history) add(x sample) {
	if n := len(h.s); n > 0 && x.t.Before(h.s[n-1].t) {
		x.t = h.s[n-1].t // monotonic order, whatever the clock did
	}
	if len(h.s) >= maxSamples {
		h.s = append(h.s[:0], h.s[maxSamples/4:]...)
	}
	h.s = append(h.s, x)
}

// before returns the index of the last sample taken at or before t, or 0
// when every sample is later.
func (h *history) before(t time.Time) int {
	i := sort.Search(len(h.s), func(i int) bool { return h.s[i].t.After(t) })
	return max(i-1, 0)
}

// after returns the index of the first sample taken at or after t, or
// the last sample when none is yet.
func (h *history) after(t time.Time) int {
	i := sort.Search(len(h.s), func(i int) bool { return !h.s[i].t.Before(t) })
	return min(i, len(h.s)-1)
}

// PreemptionsBetween returns how far the engine's preemption counter
// advanced between the last scrape at or before t0 and the first scrape
// at or after t1 (or the latest scrape, when none is yet): the smallest
// scrape-bounded window known that contains [t0, t1]. ok is false when
// there is no sample, or the engine exports no preemption counter.
//
// The count is the engine's, for all its sequences: the preemptions that
// happened while the window was open, not those of one request. Its
// precision is the scrape interval at each end.
func (s *Scraper) PreemptionsBetween(t0, t1 time.Time) (n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hist.preemptions(t0, t1)
}

func (h *history) preemptions(t0, t1 time.Time) (int, bool) {
	if len(h.s) == 0 {
		return 0, false
	}
	a, b := h.s[h.before(t0)], h.s[h.after(t1)]
	if math.IsNaN(a.preempt) || math.IsNaN(b.preempt) {
		return 0, false
	}
	return int(math.Max(0, math.Round(b.preempt-a.preempt))), true
}

// Signals returns what the engine did while the request ran: the
// preemptions during its life (-1 when unknown: no scrape yet, or an
// engine without a preemption counter) and the cause of its stalls, the
// gaps between token events above stallThreshold: "preemption" when the
// preemption counter advanced across a stall, else "kv_cache_full" when
// the KV cache was at or above 95% around it, else "queue_spike" when the
// waiting queue grew across it, else "" (also when there is no stall).
// It is called once, when the request ends; it attributes with the
// scrapes made so far (docs/engine-signals.md says why it does not wait
// for the next one).
func (s *Scraper) Signals(rec *record.Record, stallThreshold time.Duration) (preemptions int, cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &s.hist
	preemptions = -1
	if len(h.s) == 0 || rec.Arrive.IsZero() {
		return -1, ""
	}
	end := rec.Terminal
	if end.IsZero() {
		end = time.Now()
	}
	if n, ok := h.preemptions(rec.Arrive, end); ok {
		preemptions = n
	}
	if stallThreshold <= 0 {
		return preemptions, ""
	}
	best := 0 // 3 preemption, 2 kv_cache_full, 1 queue_spike
	for i := 1; i < len(rec.TokenAt) && best < 3; i++ {
		if rec.TokenAt[i]-rec.TokenAt[i-1] <= stallThreshold {
			continue
		}
		best = max(best, h.stallCause(rec.Arrive.Add(rec.TokenAt[i-1]), rec.Arrive.Add(rec.TokenAt[i])))
	}
	return preemptions, [...]string{"", CauseQueueSpike, CauseKVCacheFull, CausePreemption}[best]
}

// stallCause judges one stall [from, to] against the samples from the
// last one at or before from to the first one at or after to.
func (h *history) stallCause(from, to time.Time) int {
	a, b := h.before(from), h.after(to)
	if n, ok := h.preemptions(from, to); ok && n > 0 {
		return 3
	}
	for i := a; i <= b; i++ {
		if h.s[i].kv >= KVFull {
			return 2
		}
	}
	for i := a + 1; i <= b; i++ {
		if w := h.s[i].waiting; w > 0 && w > h.s[a].waiting {
			return 1
		}
	}
	return 0
}

// Waiting returns the engine's waiting queue as last scraped, and
// whether it is known: false before the first scrape, or when the engine
// exports no queue.
func (s *Scraper) Waiting() (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.hist.s) == 0 {
		return 0, false
	}
	w := s.hist.s[len(s.hist.s)-1].waiting
	return w, !math.IsNaN(w)
}

// PrefixHitRatio returns the engine's prefix-cache hit ratio as
// tokentap_engine_prefix_cache_hit_ratio last exported it, the engine's
// label, and the engine's metric it comes from (PrefixSource); ok is
// false before the first scrape that had it, or for an engine without
// one.
func (s *Scraper) PrefixHitRatio() (ratio float64, engine, from string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap == nil || s.kind == Unknown || !s.prefix.have {
		return 0, s.kind.Label(), "", false
	}
	return s.prefix.ratio, s.kind.Label(), PrefixSource(s.kind), true
}

// PrefixSource names the engine's metric its prefix-cache hit ratio
// comes from (docs/engine-signals.md): a ratio gauge of its own, or
// (vLLM) its hit and query counters, whose increases over a scrape
// interval are divided; "" for an engine without one.
func PrefixSource(k Kind) string {
	var hits, queries string
	for _, src := range mappings[k] {
		switch src.out {
		case sPrefixHitRatio:
			return src.from[0]
		case sPrefixHits:
			hits = src.from[0]
		case sPrefixQueries:
			queries = src.from[0]
		}
	}
	if hits != "" && queries != "" {
		return "increase(" + hits + ") / increase(" + queries + ")"
	}
	return ""
}

// WaitingBetween calls fn with the engine's waiting queue at every scrape
// from the last one at or before from to the last one before to, in
// order (none when the engine exports no queue): the evidence of a queue
// while a request waited for its first token (docs/measurement.md §6b,
// "queue").
func (s *Scraper) WaitingBetween(from, to time.Time, fn func(at time.Time, waiting float64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &s.hist
	if len(h.s) == 0 || h.s[0].t.After(from) {
		return
	}
	for i := h.before(from); i < len(h.s) && h.s[i].t.Before(to); i++ {
		if w := h.s[i].waiting; !math.IsNaN(w) {
			fn(h.s[i].t, w)
		}
	}
}

// PreemptionsDuring returns how far the engine's preemption counter
// advanced during a stall [from, to]: from the last scrape at or before
// from to the last scrape before to, so that a preemption at the stall's
// end (the step after it) is not taken for its cause; when no scrape
// falls inside the stall, to the first scrape at or after to, as
// PreemptionsBetween. ok is false when unknown (docs/measurement.md
// §6b, "preemption").
func (s *Scraper) PreemptionsDuring(from, to time.Time) (n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &s.hist
	if len(h.s) == 0 {
		return 0, false
	}
	a := h.before(from)
	b := sort.Search(len(h.s), func(i int) bool { return !h.s[i].t.Before(to) }) - 1 // the last before to
	if b <= a || !h.s[b].t.After(from) {
		return h.preemptions(from, to)
	}
	pa, pb := h.s[a].preempt, h.s[b].preempt
	if math.IsNaN(pa) || math.IsNaN(pb) {
		return 0, false
	}
	return int(math.Max(0, math.Round(pb-pa))), true
}
