package cause

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
)

// BenchmarkAttribute is the attribution's cost per request at its end,
// with the registry full (DefaultRequests arrivals, one in eight long,
// half of them still in flight): a request on time, a slow first token,
// and a slow first token with four stalls. baseline/record_json writes
// the same record's JSON line, a cost every request already pays, so
// that docs/performance.md can state the ratio on any machine.
func BenchmarkAttribute(b *testing.B) {
	a := New(Options{SLO: sloTTFT(time.Second), MaxRunning: 64, Engine: &fakeEngine{}})
	for i := range DefaultRequests {
		r := record.New(1)
		r.ID, r.Arrive = fmt.Sprintf("r-%d", i), at(-DefaultRequests*10+i*10)
		size := int64(800)
		if i%8 == 0 {
			size = 40000
		}
		tr := a.Begin(r, size)
		tr.Sent(r.Arrive)
		tr.First(r.Arrive.Add(300 * time.Millisecond))
		if i%2 == 0 {
			r.Terminal = r.Arrive.Add(2 * time.Second)
			tr.End(r)
		}
	}
	mk := func(first int, stalls int) *record.Record {
		r := record.New(256)
		r.ID, r.Arrive, r.Stream, r.Outcome = "bench", at(0), true, record.Success
		r.SLO = []record.Verdict{{Name: "chat"}}
		t := first
		for i := range 200 {
			r.AddToken(at(t), 1, true)
			t += 20
			if i%40 == 20 && stalls > 0 {
				t += 800
				stalls--
			}
		}
		r.Terminal = at(t)
		return r
	}
	for _, c := range []struct {
		name          string
		first, stalls int
	}{{"on_time", 300, 0}, {"slow_ttft", 2500, 0}, {"slow_ttft_4_stalls", 2500, 4}} {
		r := mk(c.first, c.stalls)
		self := &entry{id: r.ID, arrive: r.Arrive, size: 800}
		self.sent.Store(1)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				a.attribute(r, self)
			}
			if c.first > 1000 && len(r.Causes) != 1+c.stalls {
				b.Fatalf("%d causes, want %d", len(r.Causes), 1+c.stalls)
			}
		})
	}
	b.Run("baseline/record_json", func(b *testing.B) {
		r := mk(2500, 4)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.MarshalJSON(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
