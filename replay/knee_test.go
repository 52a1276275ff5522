package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/slo"
)

// The knee in arrival rate that the simulator's batching model implies
// (simengine/engine.go), derived as pipeline/knee_test.go derives the
// knee in load, with these parameters: a decode step takes
// DecodeBase + DecodePerSeq × R for R running sequences, and the step
// that admits a request also pays its prefill, PrefillBase +
// PrefillPerToken × prompt tokens; MaxBatch is above every load offered,
// so nobody waits for a slot; no jitter, stalls, errors or EOS; every
// request asks for n tokens (ignore_eos). At a steady L requests in
// flight, a request's TPOT is the mean step over its decode,
//
//	step(L) = DecodeBase + DecodePerSeq·L + prefill·L/n
//
// (L/n admissions a step), and it is in flight for about (n + ½) steps,
// so the arrival rate that keeps L in flight is λ(L) = L / ((n + ½)·step(L)).
// The SLO (TPOT ≤ limit) breaks at the L* where step(L*) = limit, that
// is at the arrival rate λ* = λ(L*). The expected knee is the highest
// step of the series at or below λ*; the test accepts one step either
// way, as the acceptance says.
func kneeParams() (config.Simulator, time.Duration, int64) {
	sim := config.Simulator{MaxBatch: 64, MaxQueue: 256, PrefillBase: time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
		DecodeBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond, MaxTokens: 32, KVCapacityTokens: 1 << 20, Seed: 7}
	return sim, 21 * time.Millisecond, 32
}

func expectedRateKnee(sim config.Simulator, limit time.Duration, n, promptTokens int64) float64 {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	prefill := ms(sim.PrefillBase) + ms(sim.PrefillPerToken)*float64(promptTokens)
	perL := ms(sim.DecodePerSeq) + prefill/float64(n)
	lStar := (ms(limit) - ms(sim.DecodeBase)) / perL
	step := ms(sim.DecodeBase) + perL*lStar
	return lStar / ((float64(n) + 0.5) * step / 1000)
}

// A stepped replay (--rates 1,2,4,8) of a Poisson trace at 2.5
// requests/s against the simulator, on a fake clock (testing/synctest:
// the simulator's steps and the arrivals are exact), finds the knee in
// arrival rate within one step of the one the parameters imply.
func TestSteppedReplayFindsTheKnee(t *testing.T) {
	sim, limit, n := kneeParams()
	const base, requests = 2.5, 100
	rng := rand.New(rand.NewPCG(22, 1))
	var b strings.Builder
	ts := 0.0
	for range requests {
		// 14 tokens: 10 of text after the chat template's 4, as the simulator counts them
		b.WriteString(traceLine(int64(ts), 14, n, nil, nil))
		ts += rng.ExpFloat64() / base * 1000
	}
	rates := []float64{1, 2, 4, 8}
	lambda := expectedRateKnee(sim, limit, n, 10)
	want := -1
	for i, r := range rates {
		if r*base <= lambda {
			want = i
		}
	}
	t.Logf("the parameters imply the knee at %.1f requests/s: step ×%g (%.1f/s)", lambda, rates[want], rates[want]*base)
	var rep *Report
	synctest.Test(t, func(t *testing.T) {
		_, h := simulator(t, sim)
		r := New(Options{Open: openString(b.String()), Target: mustURL("http://sim.test"), Transport: inProcess{h}, Model: "sim",
			Stream: true, IgnoreEOS: true, Rates: rates, NoSpin: true,
			SLO: config.SLO{Objectives: []config.Objective{{Name: "tpot", Target: 0.9, Thresholds: config.Thresholds{TPOT: limit}}}}})
		var err error
		rep, err = r.Run(t.Context())
		if err != nil {
			t.Fatal(err)
		}
	})
	var out strings.Builder
	rep.Print(&out)
	t.Logf("report:\n%s", out.String())
	if len(rep.Steps) != 4 || len(rep.RateKnees) != 1 {
		t.Fatalf("%d steps, %d rate knees", len(rep.Steps), len(rep.RateKnees))
	}
	for _, s := range rep.Steps {
		if s.Scheduled != requests || s.Sent != requests || s.Answered != requests || s.LengthMismatch != 0 || s.LengthChecked != requests {
			t.Errorf("step ×%g: %s", s.Rate, describe(s))
		}
	}
	if math.Abs(rep.BaseRate/base-1) > 0.2 {
		t.Errorf("base rate %v, want about %v", rep.BaseRate, base)
	}
	k := rep.RateKnees[0].Knee
	got := -1
	for i, r := range rates {
		if k.State == slo.KneeEstimate && k.Bucket == fmt.Sprint(r) {
			got = i
		}
	}
	if got < 0 || got < want-1 || got > want+1 {
		t.Fatalf("knee %+v, want ×%g within one step", k, rates[want])
	}
}
