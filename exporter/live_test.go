package exporter

import (
	"math"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// countSum returns the count and sum of the histogram name, over all its
// series.
func countSum(t *testing.T, m *Metrics, name string) (uint64, float64) {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var (
		n   uint64
		sum float64
	)
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				n += s.GetHistogram().GetSampleCount()
				sum += s.GetHistogram().GetSampleSum()
			}
		}
	}
	return n, sum
}

// A request's live ITL and forward-delay observations reach the shared
// histograms flushEvery at a time while it runs, and all of them at its
// end (Done): the count and the sum are those observed, the last partial
// array included; two requests hold theirs apart.
func TestLiveObservationsFlushedWhole(t *testing.T) {
	const (
		itl = "tokentap_inter_token_latency_seconds"
		fwd = "tokentap_forward_delay_seconds"
	)
	m := New(Config{})
	k := record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}
	a, b := m.Begin(k), m.Begin(k)
	var gapSum, fwdSum float64
	for i := range 37 {
		d := time.Duration(i+1) * time.Millisecond
		a.Gap(d)
		gapSum += d.Seconds()
		if i < 21 {
			a.ForwardDelay(d / 10)
			fwdSum += (d / 10).Seconds()
		}
		if i < 5 {
			b.Gap(time.Second)
		}
	}
	if n, _ := countSum(t, m, itl); n != 2*flushEvery {
		t.Errorf("ITL count %d while running, want %d (two full arrays of a)", n, 2*flushEvery)
	}
	if n, _ := countSum(t, m, fwd); n != flushEvery {
		t.Errorf("forward delay count %d while running, want %d", n, flushEvery)
	}
	a.Done()
	if n, sum := countSum(t, m, itl); n != 37 || math.Abs(sum-gapSum) > 1e-9 {
		t.Errorf("ITL count %d sum %v after a's end, want 37 and %v", n, sum, gapSum)
	}
	if n, sum := countSum(t, m, fwd); n != 21 || math.Abs(sum-fwdSum) > 1e-9 {
		t.Errorf("forward delay count %d sum %v after a's end, want 21 and %v", n, sum, fwdSum)
	}
	b.Done()
	if n, sum := countSum(t, m, itl); n != 42 || math.Abs(sum-gapSum-5) > 1e-9 {
		t.Errorf("ITL count %d sum %v after b's end, want 42 and %v", n, sum, gapSum+5)
	}
}

// Holding and flushing allocate nothing once the ITL series is resolved.
func TestLiveObservationsZeroAllocs(t *testing.T) {
	m := New(Config{})
	q := m.Begin(record.Key{API: stream.NameChat, Model: "m", Traffic: "live"})
	for range flushEvery {
		q.Gap(time.Millisecond)
	}
	if n := testing.AllocsPerRun(100, func() {
		for range flushEvery + 1 {
			q.Gap(time.Millisecond)
			q.ForwardDelay(time.Microsecond)
		}
	}); n != 0 {
		t.Errorf("%v allocations per %d events", n, flushEvery+1)
	}
}
