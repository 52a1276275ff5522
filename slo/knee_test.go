package slo

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
)

func TestLoadBuckets(t *testing.T) {
	b := NewLoadBuckets(config.Capacity{LoadBuckets: []float64{1, 2, 4, 7.5}})
	if b.Len() != 5 || b.Label(4) != "+Inf" || b.Label(3) != "7.5" || !math.IsInf(b.Upper(4), 1) || b.Lower(0) != 0 || b.Lower(2) != 2 {
		t.Fatalf("buckets %+v", b)
	}
	for load, want := range map[float64]string{0: "1", 1: "1", 1.0001: "2", 2: "2", 3.9: "4", 7.5: "7.5", 7.6: "+Inf", 1e9: "+Inf"} {
		if got := b.Label(b.Index(load)); got != want {
			t.Errorf("load %v in bucket %s, want %s", load, got, want)
		}
	}
	if d := NewLoadBuckets(config.Capacity{}); d.Len() != len(config.DefaultLoadBuckets())+1 {
		t.Errorf("default buckets: %d", d.Len())
	}
}

// The load is the time-weighted mean in flight over the request's life,
// itself included. In flight: [0,1) 1, [1,2) 2, [2,3) 3, [3,4) 2, [4,6) 1.
// A (0–6 s): (1+2+3+2+1+1)/6 = 10/6; B (1–4 s): (2+3+2)/3 = 7/3; C (2–3 s):
// 3; D, begun and ended at 5 s beside A: the count at its end, 2.
func TestLoadMeterTimeWeighted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	m := NewLoadMeter(NewLoadBuckets(config.Capacity{LoadBuckets: []float64{1, 2, 3}}))
	m.now, m.epoch = func() time.Time { return now }, t0
	at := func(s float64) { now = t0.Add(time.Duration(s * float64(time.Second))) }
	a := m.Begin()
	at(1)
	b := m.Begin()
	at(2)
	c := m.Begin()
	at(3)
	lc, bc := m.End(c)
	at(4)
	lb, bb := m.End(b)
	at(5)
	d := m.Begin()
	ld, bd := m.End(d)
	at(6)
	la, ba := m.End(a)
	for _, x := range []struct {
		name        string
		got, want   float64
		bucket, bwt string
	}{{"A", la, 10.0 / 6, ba, "2"}, {"B", lb, 7.0 / 3, bb, "3"}, {"C", lc, 3, bc, "3"}, {"D", ld, 2, bd, "2"}} {
		if math.Abs(x.got-x.want) > 1e-9 || x.bucket != x.bwt {
			t.Errorf("%s: load %v in %s, want %v in %s", x.name, x.got, x.bucket, x.want, x.bwt)
		}
	}
	if m.InFlight() != 0 {
		t.Errorf("in flight %d after every end", m.InFlight())
	}
}

// A request's begin and end on the meter allocate nothing: its mark is a
// value the pipeline keeps in its Request (an interface holding a span
// cost an allocation per request).
func TestLoadMeterBeginEndAllocs(t *testing.T) {
	m := NewLoadMeter(NewLoadBuckets(config.Capacity{}))
	if n := testing.AllocsPerRun(1000, func() {
		a := m.Begin()
		b := m.Begin()
		m.End(a)
		m.End(b)
	}); n != 0 {
		t.Errorf("%v allocations per two requests", n)
	}
}

// Concurrent requests of equal life: each sees the count it lived with.
func TestLoadMeterConcurrent(t *testing.T) {
	m := NewLoadMeter(NewLoadBuckets(config.Capacity{}))
	var wg sync.WaitGroup
	spans := make([]pipeline.LoadMark, 50)
	for i := range spans {
		spans[i] = m.Begin()
	}
	for i := range spans {
		wg.Go(func() {
			if l, _ := m.End(spans[i]); l < 1 || l > 50 {
				t.Errorf("load %v out of [1, 50]", l)
			}
		})
	}
	wg.Wait()
	if m.InFlight() != 0 {
		t.Fatal("in flight left")
	}
}

func curveOf(target float64, counts ...[2]int64) []LoadPoint {
	b := NewLoadBuckets(config.Capacity{LoadBuckets: []float64{1, 2, 4, 8, 16}})
	off, qual, good := make([]int64, b.Len()), make([]int64, b.Len()), make([]int64, b.Len())
	for i, c := range counts {
		off[i], qual[i], good[i] = c[0], c[1], 10*c[1]
	}
	return Curve(b, off, qual, good, 100, target)
}

func TestEstimateKnee(t *testing.T) {
	for _, c := range []struct {
		name   string
		counts [][2]int64
		want   Knee
	}{
		// 60/60 proves 0.957 ≥ 0.95, 100/100 0.974, 99/100 0.956; 50/100 is missed.
		{"a knee", [][2]int64{{60, 60}, {100, 100}, {100, 99}, {100, 50}, {40, 0}},
			Knee{State: KneeEstimate, Bucket: "4", Evidence: 100, Missed: "8"}},
		// Below the floor nothing counts, even 19 of 19 (0.877 < 0.95 anyway).
		{"too few", [][2]int64{{19, 19}, {5, 5}}, Knee{State: KneeNotEnoughEvidence, Evidence: 24}},
		// 200 of 200 at the open bucket: the knee is beyond the last bound.
		{"open bucket", [][2]int64{{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {200, 200}}, Knee{State: KneeEstimate, Bucket: "+Inf", Evidence: 200}},
		// Missed at every load with evidence.
		{"not met", [][2]int64{{10, 10}, {100, 80}, {100, 10}}, Knee{State: KneeNotMet, Evidence: 210, Missed: "2"}},
		// 94 of 100 against 0.95: bounds 0.888 and 0.969, proven neither way.
		{"not proven", [][2]int64{{100, 94}}, Knee{State: KneeNotEnoughEvidence, Evidence: 100}},
		// The highest meeting bucket, even above one that is not proven.
		{"highest", [][2]int64{{100, 100}, {100, 94}, {100, 100}}, Knee{State: KneeEstimate, Bucket: "4", Evidence: 100}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := EstimateKnee(curveOf(0.95, c.counts...))
			k.Load, k.Lower95 = nil, 0
			if k != c.want {
				t.Fatalf("knee %+v, want %+v", k, c.want)
			}
		})
	}
	pts := curveOf(0.95, [2]int64{60, 60}, [2]int64{0, 0}, [2]int64{25, 20})
	if len(pts) != 2 || pts[0].Bucket != "1" || pts[0].From != 0 || *pts[0].To != 1 || pts[0].State != "meets" ||
		pts[1].Bucket != "4" || pts[1].From != 2 || pts[1].GoodputTokensRate != 2 || *pts[1].Attainment != 0.8 {
		t.Fatalf("curve %+v", pts)
	}
	if k := EstimateKnee(pts); k.Load == nil || *k.Load != 1 || math.Abs(k.Lower95-60/(60+Z95*Z95)) > 1e-12 {
		t.Fatalf("knee %+v", k)
	}
}

// BenchmarkLoadMeter measures one request's begin and end on the meter.
func BenchmarkLoadMeter(b *testing.B) {
	m := NewLoadMeter(NewLoadBuckets(config.Capacity{}))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m.End(m.Begin())
	}
}
