package pipeline_test

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
)

// The knee the simulator's batching model predicts (simengine/engine.go),
// with the parameters of kneeSim:
//
//	decode step = DecodeBase + DecodePerSeq × R = 10 ms + 1 ms × R, for R running sequences;
//	prefill     = PrefillBase + PrefillPerToken × prompt = 1 ms + 0.1 ms × 10 = 2 ms,
//	              paid by the step that admits the request (every running sequence feels it);
//	MaxBatch    = 32, above every load offered here: nobody queues for a slot;
//	no jitter, stalls, errors, EOS or coalescing; every request asks for n = 32 tokens.
//
// A request that arrives during a step waits for it to end, is admitted
// by the next one (its first token) and decodes n−1 = 31 more steps, so
// its TPOT is the mean of those 31 steps:
//
//	TPOT = 10 ms + 1 ms × R̄ + 2 ms × ā,
//
// R̄ the mean running sequences over its decode, ā the mean admissions
// per step. At a steady L requests in flight, each in flight for about n
// steps, ā = L/n. The SLO is TPOT ≤ 21 ms, so it holds while
// R̄ + 2·ā ≤ 11. The request's load (the time-weighted mean in flight
// over its life, itself included) counts the running sequences and the
// arrivals waiting for the current step to end, about ā/2 on average:
// load ≈ R̄ + ā/2. The SLO therefore breaks at
//
//	load* = 11 − 1.5·ā = 11 − 1.5 × 10/32 ≈ 10.5   (ā at L ≈ 10).
//
// With unit load buckets, the knee is the highest bucket entirely below
// load*: (9, 10], labelled 10. The test accepts one bucket either way.
//
// The load is stepped open-loop (Poisson arrivals, whatever the engine
// does): low (L ≈ 5), at (L ≈ 10) and past (L ≈ 15) the knee. The rate
// that keeps L in flight is L / T with T ≈ (n + ½) × step(L), step(L) ≈
// 10 ms + 1 ms × L + 2 ms × L/n: 10.1/s, 14.9/s and 17.5/s.
const expectedKnee = 10

func kneeSim() config.Simulator {
	return config.Simulator{MaxBatch: 32, MaxQueue: 64, PrefillBase: time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
		DecodeBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond, MaxTokens: 32, KVCapacityTokens: 1 << 20, Seed: 7}
}

func kneeSLO() slo.Config {
	return slo.Config{Objectives: []slo.Objective{{Name: "tpot", Target: 0.9, Thresholds: slo.Thresholds{TPOT: 21 * time.Millisecond}}}}
}

func unitBuckets() config.Capacity {
	var b []float64
	for i := 1; i <= 24; i++ {
		b = append(b, float64(i))
	}
	return config.Capacity{LoadBuckets: b}
}

// sseWriter is the simulator's client: it times every token-bearing
// event into the record as the tap would (one write is one event here:
// no coalescing).
type sseWriter struct {
	h      http.Header
	status int
	rec    *record.Record
}

func (w *sseWriter) Header() http.Header { return w.h }
func (w *sseWriter) WriteHeader(s int)   { w.status = s }
func (w *sseWriter) Flush()              {}
func (w *sseWriter) Write(b []byte) (int, error) {
	now := time.Now()
	for _, ev := range strings.Split(string(b), "\n\n") {
		switch {
		case strings.Contains(ev, `"text":`):
			w.rec.AddToken(now, 1, true)
		case strings.Contains(ev, "[DONE]"):
			w.rec.Terminal = now
		}
	}
	return len(b), nil
}

// kneeRun drives the simulator with open-loop Poisson steps (rate per
// second, requests) through the pipeline's load meter, verdict and
// scorecard, and returns the SLO's card and the Prometheus backend.
func kneeRun(t *testing.T, steps [][2]float64) (*slo.Card, *exporter.Metrics) {
	var card *slo.Card
	var metrics *exporter.Metrics
	synctest.Test(t, func(t *testing.T) {
		eng := simengine.NewEngine(kneeSim())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go eng.Run(ctx)
		srv := simengine.NewServer(eng)
		cfg := kneeSLO()
		book := slo.NewBook(cfg, nil)
		load := slo.NewLoadMeter(slo.NewLoadBuckets(unitBuckets()))
		sc := slo.NewScorecard(book, load.Buckets(), config.Cost{Currency: "EUR", PerHour: 11}, false, nil)
		metrics = exporter.New(exporter.Config{SLOs: []string{"tpot"}})
		p := pipeline.New(pipeline.Options{Judge: slo.NewJudge(cfg), Load: load, Book: book, Scorecard: sc, Prometheus: metrics})
		body := `{"model":"sim","prompt":"` + strings.Repeat("x", 38) + `","stream":true,"max_tokens":32,"ignore_eos":true}` // 10 prompt tokens
		one := func() {
			rec := record.New(32)
			rec.Arrive = time.Now()
			rec.API, rec.Model, rec.Traffic, rec.Stream = stream.NameCompletions, "sim", "live", true
			_, q := p.Begin(ctx, rec, pipeline.Start{Key: record.Key{API: rec.API, Model: rec.Model, Traffic: rec.Traffic}, PromptTokens: -1})
			w := &sseWriter{h: http.Header{}, status: 200, rec: rec}
			srv.ServeHTTP(w, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body)))
			rec.HTTPStatus, rec.OutputTokens, rec.TokenSource = w.status, int64(rec.TokenEvents()), "events"
			if w.status == 200 && !rec.Terminal.IsZero() {
				rec.Outcome, rec.FinishReason = record.Success, "length"
			} else {
				rec.Outcome, rec.Terminal = record.Error, time.Now()
			}
			q.End(rec, nil)
		}
		rng := rand.New(rand.NewPCG(16, 1))
		var wg sync.WaitGroup
		for _, st := range steps {
			for range int(st[1]) {
				time.Sleep(time.Duration(rng.ExpFloat64() / st[0] * float64(time.Second)))
				wg.Go(one)
			}
		}
		wg.Wait()
		page := sc.Page(time.Now())
		card = page.SLOs[0].Scorecard
	})
	return card, metrics
}

func TestSteppedLoadFindsTheKnee(t *testing.T) {
	start := time.Now()
	card, metrics := kneeRun(t, [][2]float64{{10.1, 600}, {14.9, 900}, {17.5, 600}})
	for _, p := range card.Curve {
		t.Logf("load %-9s offered %4d qualified %4d lower95 %.3f upper95 %.3f %s", bucketRange(p), p.Offered, p.Qualified, p.AttainmentLower95, p.AttainmentUpper95, p.State)
	}
	k := card.Knee
	if k.Load != nil {
		t.Logf("knee: load ≤ %g (bucket %s, %d requests, lower bound %.4f, first missed bucket %s); expected %d; %.1f s of wall time",
			*k.Load, k.Bucket, k.Evidence, k.Lower95, k.Missed, expectedKnee, time.Since(start).Seconds())
	}
	if k.State != slo.KneeEstimate || k.Load == nil || math.Abs(*k.Load-expectedKnee) > 1 {
		t.Fatalf("knee %+v, want the bucket of load %d ± one bucket", k, expectedKnee)
	}
	if k.Evidence < slo.KneeMinRequests || k.Missed == "" {
		t.Errorf("knee %+v: want its evidence and the first bucket proven below target above it", k)
	}
	// The curve falls where the model says: the buckets well below load*
	// meet the target, those well above are proven to miss it.
	for _, p := range card.Curve {
		if p.Offered < slo.KneeMinRequests || p.To == nil {
			continue
		}
		switch {
		case *p.To <= expectedKnee-2 && p.State != "meets":
			t.Errorf("load %s: %s, want meets (below the knee)", bucketRange(p), p.State)
		case p.From >= expectedKnee+2 && p.State != "missed":
			t.Errorf("load %s: %s, want missed (past the knee)", bucketRange(p), p.State)
		}
	}
	// The cost figure: 11 EUR/h over the span, per million goodput tokens.
	if c := card.CostPerMillionGoodputTokens; c == nil || math.Abs(*c-11.0/3600*1e6/card.GoodputTokensRate)/(*c) > 1e-9 {
		t.Errorf("cost per 1M goodput tokens %v at %.1f tok/s", c, card.GoodputTokensRate)
	}
	// The same curve reaches Prometheus (and OTLP) through the mapping.
	offered := sumCounter(t, metrics, "tokentap_slo_requests_by_load_total")
	if offered != 2100 {
		t.Errorf("tokentap_slo_requests_by_load_total sums to %v, want 2100", offered)
	}
}

// Too few requests: no bucket can meet a 0.9 target with its bound.
func TestKneeNotEnoughEvidence(t *testing.T) {
	card, _ := kneeRun(t, [][2]float64{{10.1, 15}})
	if card.Knee.State != slo.KneeNotEnoughEvidence || card.Knee.Evidence != 15 {
		t.Fatalf("knee %+v with 15 requests, want not_enough_evidence", card.Knee)
	}
}

func sumCounter(t *testing.T, m *exporter.Metrics, name string) float64 {
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, x := range mf.GetMetric() {
				sum += x.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func bucketRange(p slo.LoadPoint) string {
	if p.To == nil {
		return ">" + slo.FormatLoad(p.From)
	}
	return "(" + slo.FormatLoad(p.From) + "," + slo.FormatLoad(*p.To) + "]"
}

// Stage 1 sets the load the request ran under, and the record carries
// it: A alone for 1 s, then beside B for 1 s: (1 + 2) / 2 = 1.5; B: 2.
func TestLoadInRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sunk []*record.Record
		p := pipeline.New(pipeline.Options{Load: slo.NewLoadMeter(slo.NewLoadBuckets(config.Capacity{})),
			Sinks: []record.Sink{sinkFunc(func(r *record.Record) { sunk = append(sunk, r) })}})
		begin := func() (*record.Record, *pipeline.Request) {
			rec := record.New(1)
			rec.Arrive, rec.API, rec.Traffic, rec.Outcome = time.Now(), stream.NameChat, "live", record.Success
			_, q := p.Begin(t.Context(), rec, pipeline.Start{Key: record.Key{API: rec.API, Traffic: rec.Traffic}, PromptTokens: -1})
			return rec, q
		}
		a, qa := begin()
		time.Sleep(time.Second)
		b, qb := begin()
		time.Sleep(time.Second)
		b.Terminal = time.Now()
		qb.End(b, nil)
		a.Terminal = time.Now()
		qa.End(a, nil)
		if a.Load != 1.5 || a.LoadBucket != "2" || b.Load != 2 || b.LoadBucket != "2" || len(sunk) != 2 {
			t.Fatalf("loads: A %v %q, B %v %q", a.Load, a.LoadBucket, b.Load, b.LoadBucket)
		}
		js, _ := a.MarshalJSON()
		if !strings.Contains(string(js), `"load":1.5,"load_bucket":"2"`) {
			t.Fatalf("record JSON: %s", js)
		}
	})
}
