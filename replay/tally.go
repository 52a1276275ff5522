package replay

import (
	"math"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/workload"
)

// hist is a latency histogram of bounded size: buckets 1% wide from 1 µs
// to about 3 hours, so a quantile reads at most 1% above the true value
// whatever the number of requests. The zero value is empty.
type hist struct {
	counts []uint32
	n      int64
	max    time.Duration
}

const (
	histGrowth  = 1.01
	histBuckets = 2200 // 1 µs × 1.01^2200 ≈ 3.2 h
)

func (h *hist) add(d time.Duration) {
	if h.counts == nil {
		h.counts = make([]uint32, histBuckets+1)
	}
	i := 0
	if us := float64(d) / float64(time.Microsecond); us > 1 {
		i = min(int(math.Ceil(math.Log(us)/math.Log(histGrowth))), histBuckets)
	}
	h.counts[i]++
	h.n++
	h.max = max(h.max, d)
}

// quantile returns the upper bound of the bucket holding the q-quantile
// (never above the largest value added); ok false when empty.
func (h *hist) quantile(q float64) (time.Duration, bool) {
	if h.n == 0 {
		return 0, false
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen int64
	for i, c := range h.counts {
		seen += int64(c)
		if seen >= rank {
			up := time.Duration(math.Pow(histGrowth, float64(i)) * float64(time.Microsecond))
			return min(up, h.max), true
		}
	}
	return h.max, true
}

// sloTally counts one SLO's verdicts: in all, and per bucket (of load,
// or of arrival rate).
type sloTally struct {
	offered, qualified, goodTokens int64
	// production: the trace's own verdicts on the requests replayed
	// (tokentap captures): met of judged.
	prodJudged, prodMet int64
}

// tally is what one step of a replay measured. Touched once per
// request, under the run's lock; never per token.
type tally struct {
	rate                   float64
	scheduled, sent        int64
	notSent                map[string]int64 // by reason
	answered               int64            // outcome success
	failed                 map[string]int64 // by outcome (error, rejected, timeout, cancelled, no_answer) and error type
	lengthChecked          int64            // answered with an output_length and a known count
	lengthMismatch         int64            // of those, output tokens ≠ output_length
	lengthUnknown          int64            // answered with no output token count
	lag                    hist
	ttft, tpot, itl, e2e   hist
	prodTTFT, prodTPOT     hist
	prodE2E                hist
	outputTokens           int64
	first, last            time.Time // first send, last end
	slo                    []sloTally
	firstLine, lastLine    int64
	stoppedBy              string // "duration", "shutdown", "error" or "" (the trace's end)
	traceFirst, traceLast  int64  // the trace's timestamps (ms) of the first and last line scheduled
	scheduledSpan          time.Duration
	lengthMismatchExamples []int64 // up to 5 lines
}

func newTally(rate float64, slos int) *tally {
	return &tally{rate: rate, notSent: map[string]int64{}, failed: map[string]int64{}, slo: make([]sloTally, slos)}
}

// prod counts the trace's own latencies and verdicts of a request.
func (t *tally) prod(m *workload.Meta, names []string) {
	if m == nil {
		return
	}
	add := func(h *hist, ms *float64) {
		if ms != nil && *ms >= 0 {
			h.add(time.Duration(*ms * float64(time.Millisecond)))
		}
	}
	add(&t.prodTTFT, m.TTFTMs)
	add(&t.prodTPOT, m.TPOTMs)
	add(&t.prodE2E, m.E2EMs)
	for i, n := range names {
		if v, ok := m.SLO[n]; ok {
			t.slo[i].prodJudged++
			if v == "met" {
				t.slo[i].prodMet++
			}
		}
	}
}

// done counts a finished record: its outcome, latencies and verdicts.
func (t *tally) done(r *record.Record, want int64, names []string, buckets func(string) int, perBucket func(slo, bucket int, qualified bool, tokens int64)) {
	t.last = maxTime(t.last, r.Terminal)
	if r.Outcome == record.Success {
		t.answered++
		switch {
		case r.OutputTokens < 0:
			t.lengthUnknown++
		case want >= 0:
			t.lengthChecked++
			if r.OutputTokens != want {
				t.lengthMismatch++
				if len(t.lengthMismatchExamples) < 5 {
					t.lengthMismatchExamples = append(t.lengthMismatchExamples, r.Replay.Line)
				}
			}
		}
	} else {
		k := string(r.Outcome)
		if r.ErrorType != "" {
			k += "/" + r.ErrorType
		}
		t.failed[k]++
	}
	if r.OutputTokens > 0 {
		t.outputTokens += r.OutputTokens
	}
	if r.Stream {
		if d, ok := r.TTFT(); ok {
			t.ttft.add(d)
		}
		r.Gaps(t.itl.add)
	}
	if d, ok := r.TPOT(); ok {
		t.tpot.add(d)
	}
	if d, ok := r.E2E(); ok {
		t.e2e.add(d)
	}
	b := buckets(r.LoadBucket)
	for _, v := range r.SLO {
		if v.Excluded {
			continue
		}
		for i, n := range names {
			if n != v.Name {
				continue
			}
			tokens := int64(0)
			if v.Qualified && r.OutputTokens > 0 {
				tokens = r.OutputTokens
			}
			s := &t.slo[i]
			s.offered++
			if v.Qualified {
				s.qualified++
				s.goodTokens += tokens
			}
			if b >= 0 {
				perBucket(i, b, v.Qualified, tokens)
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
