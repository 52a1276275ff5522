//go:build cgo && nvml

package gpu

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/record"
)

// timedSource notes the instant of every sample it reads.
type timedSource struct {
	Source
	mu    sync.Mutex
	reads []time.Time
}

func (s *timedSource) Read(i int) (Reading, error) {
	s.mu.Lock()
	s.reads = append(s.reads, time.Now())
	s.mu.Unlock()
	return s.Source.Read(i)
}

func (s *timedSource) samples() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.reads...)
}

// A publisher that does not return (a stuck sink) holds up neither the
// samples nor the other records: with a queue of 2, five records ending
// in one interval are one in the stuck publisher's hands, two queued and
// the rest counted as full and published on a goroutine of their own;
// the next samples come on schedule. At shutdown Run returns only once
// every record it held has been published, the one that ended after the
// last sample included. Time is synctest's: the schedule is exact.
func TestPublishQueueFullNeverBlocksTheSampler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = time.Second
		r := newRig(t, Config{Interval: interval}, &script{energy: []uint64{0}, power: []uint32{1}})
		src := &timedSource{Source: r.s.src}
		r.s.src = src
		r.s.queueLen = 2
		release := make(chan struct{})
		var mu sync.Mutex
		published := 0
		hold := func(n int) {
			for range n {
				h := r.s.Start(1)
				h.Tokens(1)
				h.Hold(record.New(0), func() {
					<-release
					mu.Lock()
					published++
					mu.Unlock()
				})
			}
		}
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan struct{})
		t0 := time.Now()
		go func() { r.s.Run(ctx); close(ran) }()

		time.Sleep(interval / 2)
		hold(5) // handed over at t0+1s
		time.Sleep(3 * interval)
		got := src.samples()
		if len(got) != 4 {
			t.Errorf("%d samples by t0+3.5s with every publisher stuck, want 4", len(got))
		}
		for k, at := range got {
			if d := at.Sub(t0.Add(time.Duration(k) * interval)); d != 0 {
				t.Errorf("sample %d came %v late", k, d)
			}
		}
		// 5 handed over: 1 taken by the publisher (it waited on the queue),
		// 2 queued, 2 full; 3 full if the publisher had not been waiting.
		if full := testutil.ToFloat64(r.s.queueFull); full < 2 || full > 3 {
			t.Errorf("tokentap_energy_publish_queue_full_total %v, want 2 or 3", full)
		}

		hold(1) // ends after the last sample: attributed by Run's last tick
		stop()
		synctest.Wait()
		select {
		case <-ran:
			t.Error("Run returned with records not yet published")
		default:
		}
		close(release)
		<-ran
		mu.Lock()
		defer mu.Unlock()
		if published != 6 {
			t.Fatalf("%d records published when Run returned, want 6", published)
		}
	})
}
