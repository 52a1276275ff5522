package slo

import (
	"math"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
)

// The trend counts each record in the interval it finished in, and each
// point holds only its interval: TTFT p50/p99 and ITL p99 from the
// scorecard's log buckets (within 5% above), attainment with its Wilson
// bound and goodput per SLO, in-flight and queue as sampled.
func TestTrendPoints(t *testing.T) {
	now := time.Unix(10_000, 0)
	inflight, queue := int64(3), 7.0
	cfg := Config{Objectives: []Objective{{Name: "chat", Target: 0.9}}}
	tr := NewTrend(cfg, TrendOptions{Resolution: 2 * time.Second, Clock: func() time.Time { return now },
		InFlight: func() int64 { return inflight }, Queue: func() (float64, bool) { return queue, true }})
	verdict := func(r *record.Record, ok bool) *record.Record {
		r.SLO = []record.Verdict{{Name: "chat", Qualified: ok}}
		return r
	}
	// Interval 1: 4 requests, TTFT 100 ms, gaps of 10 ms, 3 qualified of 4 tokens.
	for i := range 4 {
		tr.Add(verdict(rec(record.Success, 4, 100, 110, 120, 130), i < 3))
	}
	tr.Sample()
	// Interval 2 (2 s later): one request, TTFT 300 ms, a 500 ms gap.
	now = now.Add(2 * time.Second)
	inflight = 1
	tr.Add(verdict(rec(record.Success, 2, 300, 800), true))
	tr.Sample()
	// An interval older than the span is gone.
	d := tr.Doc()
	if len(d.Points) != 2 || d.ResolutionSeconds != 2 || d.SpanSeconds != 900 {
		t.Fatalf("%d points at %v s over %v s, want 2 at 2 s over 900 s", len(d.Points), d.ResolutionSeconds, d.SpanSeconds)
	}
	near := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got < want || *got > want*1.05 {
			t.Errorf("%s = %v, want within [%v, %v]", name, got, want, want*1.05)
		}
	}
	p := d.Points[0]
	if p.Requests != 4 || !p.Start.Equal(time.Unix(10_000, 0)) {
		t.Errorf("point 0: %d requests from %v", p.Requests, p.Start)
	}
	near("ttft p50", p.TTFTP50, 0.1)
	near("ttft p99", p.TTFTP99, 0.1)
	near("itl p99", p.ITLP99, 0.01)
	s := p.SLOs[0]
	if s.Offered != 4 || s.Qualified != 3 || *s.Attainment != 0.75 || s.GoodputTokensRate != 6 {
		t.Errorf("point 0 SLO: %+v, want 4 offered, 3 qualified, 0.75, 12 tokens / 2 s = 6 tok/s", s)
	}
	if want := WilsonLower(3, 4, Z95); math.Abs(s.AttainmentLower95-want) > 1e-12 {
		t.Errorf("lower bound %v, want %v", s.AttainmentLower95, want)
	}
	if *p.InFlight != 3 || *p.EngineQueue != 7 {
		t.Errorf("point 0: in flight %v, queue %v", *p.InFlight, *p.EngineQueue)
	}
	p = d.Points[1]
	near("ttft p50 (2)", p.TTFTP50, 0.3)
	near("itl p99 (2)", p.ITLP99, 0.5)
	if *p.InFlight != 1 || p.SLOs[0].Offered != 1 {
		t.Errorf("point 1: in flight %v, offered %d", *p.InFlight, p.SLOs[0].Offered)
	}
	now = now.Add(TrendSpan)
	if d := tr.Doc(); len(d.Points) != 0 {
		t.Errorf("%d points 15 minutes later, want 0", len(d.Points))
	}
}

// Resolutions out of bounds are clamped; 0 means 5 s.
func TestTrendResolution(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{{0, 5 * time.Second}, {time.Millisecond, time.Second}, {time.Minute, 10 * time.Second}, {3 * time.Second, 3 * time.Second}} {
		if got := NewTrend(Config{}, TrendOptions{Resolution: c.in}).Resolution(); got != c.want {
			t.Errorf("resolution %v: %v, want %v", c.in, got, c.want)
		}
	}
}

// BenchmarkTrendAdd is the trend's cost per finished request: a
// streamed record of 64 token events judged against one SLO.
func BenchmarkTrendAdd(b *testing.B) {
	at := make([]int, 64)
	for i := range at {
		at[i] = 100 + 20*i
	}
	r := rec(record.Success, 64, at...)
	r.SLO = []record.Verdict{{Name: "chat", Qualified: true}}
	tr := NewTrend(Config{Objectives: []Objective{{Name: "chat", Target: 0.9}}}, TrendOptions{})
	b.ReportAllocs()
	for b.Loop() {
		tr.Add(r)
	}
}
