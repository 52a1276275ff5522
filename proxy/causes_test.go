package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/tokentap/tokentap/cause"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// With the slow causes on, a token event still allocates nothing: the
// first one stamps the registry once (an atomic store), and the end
// attributes the stalls.
func TestTapZeroAllocsPerEventWithCauses(t *testing.T) {
	a := cause.New(cause.Options{SLO: config.SLO{StallThreshold: time.Nanosecond}})
	m := exporter.New(exporter.Config{})
	pipe := pipeline.New(pipeline.Options{Live: m, Prometheus: m, Causes: a})
	rec := record.New(8192)
	rec.Arrive, rec.API, rec.Stream, rec.ID = time.Now(), stream.NameChat, true, "r1"
	_, q := pipe.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}, PromptBytes: 80})
	st := &reqState{rec: rec, obs: q, clock: record.SystemClock{}}
	ev := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")
	tp := newTap(&loopReader{ev: ev}, st, bodySSE, stream.FormatOpenAI, false, 1<<20)
	p := make([]byte, 32<<10)
	for range 100 {
		tp.Read(p)
	}
	if n := testing.AllocsPerRun(1000, func() { tp.Read(p) }); n != 0 {
		t.Errorf("%.2f allocations per token event with the slow causes on", n)
	}
	rec.Outcome, rec.Terminal = record.Success, time.Now()
	q.End(rec, nil)
	// Every gap is over a 1 ns threshold: each is attributed, at most
	// MaxCauses, the rest counted.
	stalls := 0
	rec.Gaps(func(g time.Duration) {
		if g > time.Nanosecond {
			stalls++
		}
	})
	if len(rec.Causes) == 0 || len(rec.Causes)+rec.CausesCut != stalls {
		t.Errorf("%d causes and %d cut for %d stalls", len(rec.Causes), rec.CausesCut, stalls)
	}
}
