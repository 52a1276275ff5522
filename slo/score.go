package slo

import (
	"math"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Z95 is the one-sided 95% normal quantile used by every Wilson bound we
// report (docs/measurement.md §5).
const Z95 = 1.6448536269514722

// WilsonLower is the one-sided Wilson score lower bound for k successes in
// n trials at quantile z:
//
//	(p̂ + z²/2n − z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n),  p̂ = k/n.
//
// It is 0 for n = 0 (no evidence proves nothing) and n/(n+z²) for k = n.
func WilsonLower(k, n, z float64) float64 {
	if n <= 0 {
		return 0
	}
	p := k / n
	z2 := z * z
	l := (p + z2/(2*n) - z*math.Sqrt(p*(1-p)/n+z2/(4*n*n))) / (1 + z2/n)
	return math.Max(0, l)
}

// WilsonUpper is the matching upper bound: 1 − WilsonLower(n−k, n, z).
func WilsonUpper(k, n, z float64) float64 {
	if n <= 0 {
		return 1
	}
	return 1 - WilsonLower(n-k, n, z)
}

// FluidityScore is the deadline-based fluidity of docs/measurement.md §6, in
// the spirit of Etalon (arXiv 2407.07000). Token i is due at D + i·c after
// arrival. A token that arrives after its deadline counts one miss for
// every deadline it overshoots (its own and each later one that passed
// before it came), and the schedule restarts from its arrival: the next
// token is due one cadence after it. Every deadline that passed counts in
// the denominator, so the score is 1 − misses/deadlines in [0,1].
//
// Tokens are counted one by one: an event known to carry k tokens gives k
// tokens arriving at once, each with its own deadline; when per-event
// counts are unknown, each token-bearing event counts as one token.
//
// A response with several choices (record.Choices) is scored per choice,
// each on its own schedule, and the score is the worst choice's.
func FluidityScore(r *record.Record, s FluiditySchedule) float64 {
	if len(r.TokenAt) == 0 || s.Cadence <= 0 {
		return 1
	}
	if r.Choices == nil {
		return fluidity(r, s, -1)
	}
	worst := 1.0
	for slot := range r.Choices {
		worst = min(worst, fluidity(r, s, slot))
	}
	return worst
}

// fluidity scores the token events of the choice at slot in r.Choices
// (every event for slot -1); 1 when it has none.
func fluidity(r *record.Record, s FluiditySchedule, slot int) float64 {
	due := s.Deadline
	var misses, deadlines int64
	per := r.PerEventKnown()
	for i, t := range r.TokenAt {
		if slot >= 0 && (i >= len(r.EventChoice) || int(r.EventChoice[i]) != slot) {
			continue
		}
		k := 1
		if per {
			k = int(r.TokensPerEvent[i])
		}
		for ; k > 0; k-- {
			deadlines++
			if t > due {
				over := int64((t-due-1)/s.Cadence) + 1 // deadlines due, due+c, … before t
				misses += over
				deadlines += over - 1
				due = t + s.Cadence
			} else {
				due += s.Cadence
			}
		}
	}
	if deadlines == 0 {
		return 1
	}
	return 1 - float64(misses)/float64(deadlines)
}

// countStalls counts gaps between token events above threshold (between
// events of the same choice, with several choices: record.Gaps).
func countStalls(r *record.Record, threshold time.Duration) int {
	n := 0
	r.Gaps(func(g time.Duration) {
		if g > threshold {
			n++
		}
	})
	return n
}
