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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
)

// The breach forecast against a ramp on the simulator (issue 35,
// acceptance: the forecast made a third of the way up predicts the first
// proven breach within ±20% of when it happens).
//
// The simulator's model (simengine/engine.go) with rampSim: a decode
// step of 40 ms + 0.1 ms per running sequence (±1% jitter), a prefill of
// 10 µs per admission (paid by the admitting step), a batch of 256 that
// never fills, no stalls, errors or EOS; every request asks for 16
// tokens. Its TPOT is the mean of its last 15 steps, about
// 40 ms + 0.1 ms × R̄ (R̄ the running sequences it decoded beside), so
// the SLO (TPOT ≤ 44 ms, target 0.9) breaks at a load of about 40: the
// knee. A request lives about 16 steps, T ≈ 16 × (40 + 0.1 L) ms, so the
// arrival rate that keeps L in flight is λ = L / T: 56/s at the knee,
// 103/s at twice the knee.
//
// The scenario, on a fake clock (testing/synctest):
//
//   - a busy minute about the knee (Poisson arrivals, 61/s, L ≈ 44)
//     proves the curve: the buckets below 40 meet the target, those
//     above are proven missed, as a replica's window holds its last busy
//     spell;
//   - a quiet minute;
//   - the ramp: arrivals at a rate rising steadily from 0 to twice the
//     knee's (103/s).
//
// A third of the way up the test reads the forecast from /slo's card
// (and the gauge); the truth is the instant the breach is first proven:
// the first finished request after which the attainment of the ramp's
// requests that finished in the last truth window is proven below the
// target (its one-sided 95% Wilson upper bound under 0.9, with at least
// 20 requests), as an attainment alert on that window would see it. The
// error is the forecast's lead against the true lead (the time from the
// forecast to the breach).
//
// Two ramps:
//
//   - paced (the acceptance): one arrival each time the rate's integral
//     grows by 1, as a load generator's ramping arrival rate sends them,
//     over 300 s; the forecast's window 1 min, the truth's 10 s. Within
//     ±20%.
//   - Poisson: the same rate with exponential gaps, over 900 s; the
//     forecast's window 3 min, the truth's 1 min. The requests' loads
//     spread (about 2L/3 in variance) and bursts hit every running
//     sequence at once, so the bucket proven missed still holds good
//     requests and the truth comes later than the p90 load's crossing:
//     the forecast comes early (14% to 42% early over seeds 1-4, late
//     in none). The test holds it within −50% and +20%.
func rampSim(seed uint64) config.Simulator {
	return config.Simulator{MaxBatch: 256, MaxQueue: 256, PrefillBase: 10 * time.Microsecond, Jitter: 0.01,
		DecodeBase: 40 * time.Millisecond, DecodePerSeq: 100 * time.Microsecond, MaxTokens: 16, KVCapacityTokens: 1 << 22, Seed: seed}
}

const (
	rampMaxRate = 103.0 // arrivals/s that hold twice the knee's load (80)
	rampBusy    = 61.0  // arrivals/s of the busy minute (L ≈ 44)
	rampQuiet   = time.Minute
)

type rampCase struct {
	name        string
	poisson     bool
	seed        uint64
	span        time.Duration // of the ramp
	window      time.Duration // capacity.forecast_window
	truthWindow time.Duration
	early, late float64 // the error bounds, relative to the true lead
}

var rampCases = []rampCase{
	{name: "paced", seed: 1, span: 300 * time.Second, window: time.Minute, truthWindow: 10 * time.Second, early: -0.2, late: 0.2},
	{name: "poisson", poisson: true, seed: 2, span: 900 * time.Second, window: 3 * time.Minute, truthWindow: time.Minute, early: -0.5, late: 0.2},
}

// rampBuckets are every even load up to 24, then every load up to 44:
// 32 buckets, unit ones where the knee lies.
func rampBuckets() []float64 {
	var b []float64
	for i := 2; i <= 24; i += 2 {
		b = append(b, float64(i))
	}
	for i := 25; i <= 44; i++ {
		b = append(b, float64(i))
	}
	return b
}

func TestBreachForecastOnARamp(t *testing.T) {
	for _, c := range rampCases {
		t.Run(c.name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { rampRun(t, c) }) })
	}
}

func rampRun(t *testing.T, c rampCase) {
	eng := simengine.NewEngine(rampSim(c.seed))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go eng.Run(ctx)
	srv := simengine.NewServer(eng)
	cfg := slo.Config{Objectives: []slo.Objective{{Name: "tpot", Target: 0.9, Window: time.Hour, Thresholds: slo.Thresholds{TPOT: 44 * time.Millisecond}}}}
	capacity := config.Capacity{LoadBuckets: rampBuckets(), ForecastWindow: c.window, ForecastHorizon: 30 * time.Minute}
	book := slo.NewBook(cfg, nil)
	load := slo.NewLoadMeter(slo.NewLoadBuckets(capacity))
	reg := prometheus.NewRegistry()
	sc := slo.NewScorecard(book, load.Buckets(), config.Cost{}, false, reg)
	sc.SetForecast(capacity)

	// The ramp's finished requests, for the truth.
	type done struct {
		at        time.Time
		qualified bool
	}
	var (
		mu       sync.Mutex
		finished []done
		ramping  bool
	)
	sink := sinkFunc(func(r *record.Record) {
		mu.Lock()
		defer mu.Unlock()
		if ramping && len(r.SLO) == 1 {
			finished = append(finished, done{r.Terminal, r.SLO[0].Qualified})
		}
	})
	p := pipeline.New(pipeline.Options{Judge: slo.NewJudge(cfg), Load: load, Book: book, Scorecard: sc, Sinks: []record.Sink{sink}})
	body := `{"model":"sim","prompt":"` + strings.Repeat("x", 38) + `","stream":true,"max_tokens":16,"ignore_eos":true}`
	one := func() {
		rec := record.New(16)
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
	rng := rand.New(rand.NewPCG(c.seed, 3))
	var wg sync.WaitGroup

	// The busy minute, then the quiet one.
	start := time.Now()
	for time.Since(start) < time.Minute {
		time.Sleep(time.Duration(rng.ExpFloat64() / rampBusy * float64(time.Second)))
		wg.Go(one)
	}
	wg.Wait()
	time.Sleep(rampQuiet)

	// The ramp: arrivals of rate λ(t) = rampMaxRate × t / rampSpan, one
	// each time its integral Λ(t) = rampMaxRate × t² / (2 × rampSpan)
	// grows by 1 (paced), or by an exponential draw (Poisson).
	mu.Lock()
	ramping = true
	mu.Unlock()
	r0 := time.Now()
	tf := r0.Add(c.span / 3)
	var fc *slo.Forecast
	var gauge *float64
	wg.Go(func() {
		time.Sleep(time.Until(tf))
		fc = sc.Page(time.Now()).SLOs[0].Scorecard.Forecast
		gauge = gaugeOf(t, reg, "tokentap_slo_breach_forecast_seconds")
	})
	span := c.span.Seconds()
	for x := 0.0; ; {
		step := 1.0
		if c.poisson {
			step = rng.ExpFloat64()
		}
		x = math.Sqrt(x*x + 2*span*step/rampMaxRate)
		if x >= span {
			break
		}
		time.Sleep(time.Until(r0.Add(time.Duration(x * float64(time.Second)))))
		wg.Go(one)
	}
	wg.Wait()

	// The truth: the first instant the last truth window of the ramp's
	// requests proves the SLO missed.
	var breach time.Time
	for i, d := range finished {
		n, k := 0, 0
		for j := i; j >= 0 && d.at.Sub(finished[j].at) < c.truthWindow; j-- {
			n++
			if finished[j].qualified {
				k++
			}
		}
		if n >= slo.KneeMinRequests && slo.WilsonUpper(float64(k), float64(n), slo.Z95) < 0.9 {
			breach = d.at
			break
		}
	}
	if fc == nil || breach.IsZero() {
		t.Fatalf("forecast %+v, breach %v", fc, breach)
	}
	lead := breach.Sub(tf).Seconds()
	t.Logf("forecast at %.0f s into the ramp: %s (%s); breach bucket %s (load %v), knee %s; p%.0f load now %.2f ± %.2f, slope %.4f ± %.4f /s, residual sd %.2f, %d samples of %d requests",
		tf.Sub(r0).Seconds(), fc.State, fc.Reason, fc.BreachBucket, deref(fc.BreachLoad), fc.KneeBucket, fc.Quantile*100,
		deref(fc.Load), deref(fc.LoadStdErr), deref(fc.Slope), deref(fc.SlopeStdErr), deref(fc.ResidualSD), fc.Samples, fc.Requests)
	if fc.State != slo.ForecastInHorizon {
		t.Fatalf("state %s, want a forecast", fc.State)
	}
	t.Logf("breach first proven %.1f s into the ramp: %.1f s after the forecast, which said %.1f s (range %.1f – %.1f s): %+.1f%%",
		breach.Sub(r0).Seconds(), lead, *fc.Seconds, *fc.EarliestSeconds, *fc.LatestSeconds, (*fc.Seconds-lead)/lead*100)
	if e := (*fc.Seconds - lead) / lead; e < c.early || e > c.late {
		t.Errorf("forecast %.1f s, breach %.1f s after it: %+.1f%%, beyond [%+.0f%%, %+.0f%%]", *fc.Seconds, lead, e*100, c.early*100, c.late*100)
	}
	if gauge == nil || *gauge != *fc.Seconds {
		t.Errorf("tokentap_slo_breach_forecast_seconds %v, /slo %v", deref(gauge), *fc.Seconds)
	}
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

// gaugeOf reads the one series of a gauge, nil when absent.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) *float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Error(err)
		return nil
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			v := mf.GetMetric()[0].GetGauge().GetValue()
			return &v
		}
	}
	return nil
}
