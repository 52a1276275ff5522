package slo

import (
	"math"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
)

// promRate is Prometheus' rate() over [now-window, now] of a counter
// scraped every scrape, its samples given by count(t): extrapolatedRate
// of promql/functions.go (the extrapolation to the range's ends, limited
// to 1.1 average sample intervals, and to where the counter would have
// been zero).
func promRate(count func(time.Time) float64, start, now time.Time, window, scrape time.Duration) float64 {
	var ts []time.Time
	for t := start; !t.After(now); t = t.Add(scrape) {
		if t.After(now.Add(-window)) {
			ts = append(ts, t)
		}
	}
	if len(ts) < 2 {
		return math.NaN()
	}
	first, last := count(ts[0]), count(ts[len(ts)-1])
	rangeStart, rangeEnd := now.Add(-window), now
	sampled := ts[len(ts)-1].Sub(ts[0]).Seconds()
	avg := sampled / float64(len(ts)-1)
	toStart := ts[0].Sub(rangeStart).Seconds()
	toEnd := rangeEnd.Sub(ts[len(ts)-1]).Seconds()
	result := last - first
	if result > 0 && first >= 0 {
		if toZero := sampled * (first / result); toZero < toStart {
			toStart = toZero
		}
	}
	threshold := avg * 1.1
	interval := sampled
	if toStart < threshold {
		interval += toStart
	} else {
		interval += avg / 2
	}
	if toEnd < threshold {
		interval += toEnd
	} else {
		interval += avg / 2
	}
	return result * (interval / sampled) / window.Seconds()
}

// A steady workload: the page's goodput matches Prometheus' rate() over
// the same window within 5% once the window is full, and the true rate
// (not a slot-rounded one) while it fills.
func TestWindowGoodputMatchesRate(t *testing.T) {
	cases := []struct {
		name           string
		window         time.Duration
		every          time.Duration // one qualified request every
		tokens         int64
		run            time.Duration // how long the workload has run
		prometheusFull bool          // compare with rate(): the window is full
	}{
		{"the issue's case: 160 in 19.9 s, 1 h window", time.Hour, 124375 * time.Microsecond, 16, 19900 * time.Millisecond, false},
		{"5 min into a 1 h window", time.Hour, 250 * time.Millisecond, 10, 5 * time.Minute, false},
		{"2 h of 8/s, 1 h window", time.Hour, 125 * time.Millisecond, 16, 2 * time.Hour, true},
		{"1 h of 3/s, 5 min window", 5 * time.Minute, time.Second / 3, 7, time.Hour, true},
		{"an odd start within a slot", 10 * time.Minute, 700 * time.Millisecond, 5, 47*time.Minute + 13*time.Second, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Date(2026, 11, 30, 10, 0, 37, 0, time.UTC) // not on a slot boundary
			w := NewWindow(c.window, 60)
			n := int64(0)
			var now time.Time
			for at := start; !at.After(start.Add(c.run)); at = at.Add(c.every) {
				w.Add(at, record.Verdict{Qualified: true}, c.tokens)
				n++
				now = at
			}
			now = now.Add(c.every / 2) // the page is read between two requests
			off, qual, tok, _, span := w.Totals(now)
			if off != qual {
				t.Fatalf("offered %d qualified %d", off, qual)
			}
			page := float64(qual) / math.Max(span.Seconds(), 1)
			pageTok := float64(tok) / math.Max(span.Seconds(), 1)
			truth := float64(time.Second) / float64(c.every)
			if math.Abs(page/truth-1) > 0.05 || math.Abs(pageTok/(truth*float64(c.tokens))-1) > 0.05 {
				t.Errorf("goodput %.3f/s (%.1f tok/s) over %v, true rate %.3f/s", page, pageTok, span, truth)
			}
			if c.prometheusFull {
				count := func(at time.Time) float64 {
					if at.Before(start) {
						return 0
					}
					return float64(at.Sub(start)/c.every + 1)
				}
				prom := promRate(count, start.Add(-45*time.Second), now, c.window, 15*time.Second)
				if math.Abs(page/prom-1) > 0.05 {
					t.Errorf("goodput %.3f/s, Prometheus rate() %.3f/s: more than 5%% apart", page, prom)
				}
			}
			if !c.prometheusFull && math.Abs(float64(qual)-float64(n)) > 0 {
				t.Errorf("counted %d of %d requests while the window fills", qual, n)
			}
		})
	}
}

// The page's span starts at the first request counted, not at the start
// of its slot.
func TestWindowSpanStartsAtFirstVerdict(t *testing.T) {
	w := NewWindow(time.Hour, 60) // 1 min slots
	t0 := time.Date(2026, 1, 1, 0, 0, 50, 0, time.UTC)
	w.Add(t0, record.Verdict{Qualified: true}, 1)
	w.Add(t0.Add(5*time.Second), record.Verdict{Qualified: true}, 1)
	_, _, _, _, span := w.Totals(t0.Add(10 * time.Second))
	if span != 10*time.Second {
		t.Fatalf("span %v, want 10s (from the first verdict), not from the slot's start", span)
	}
}
