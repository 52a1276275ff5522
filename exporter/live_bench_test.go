package exporter

import (
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// BenchmarkLiveObserve measures one token event's live observations (an
// ITL gap and a forward delay) into the Prometheus backend: one request
// alone, and 8 requests per core at once, all under the same labels, as
// streams of one model share the ITL series and every stream the
// forward-delay histogram.
func BenchmarkLiveObserve(b *testing.B) {
	m := New(Config{})
	k := record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}
	b.Run("one", func(b *testing.B) {
		q := m.Begin(k)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			q.Gap(time.Duration(i&1023) * time.Microsecond)
			q.ForwardDelay(time.Duration(i&63) * time.Microsecond)
		}
		q.Done()
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			q := m.Begin(k)
			for i := 0; pb.Next(); i++ {
				q.Gap(time.Duration(i&1023) * time.Microsecond)
				q.ForwardDelay(time.Duration(i&63) * time.Microsecond)
			}
			q.Done()
		})
	})
}
