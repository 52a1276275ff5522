package slo

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// forecasted builds a book and its scorecard on a fake clock: one SLO
// (target 0.9, window 1h), unit load buckets up to 30, the forecast's
// window 5 min (a sample every 10 s) and the given horizon.
func forecasted(reg prometheus.Registerer, horizon time.Duration) (*Scorecard, *time.Time) {
	cfg := Config{Objectives: []Objective{{Name: "chat", Target: 0.9, Window: time.Hour, Thresholds: Thresholds{TTFT: 500 * ms}}}}
	book := NewBook(cfg, nil)
	now := time.Unix(10_000, 0)
	book.clock = func() time.Time { return now }
	var b []float64
	for i := 1; i <= 30; i++ {
		b = append(b, float64(i))
	}
	c := config.Capacity{LoadBuckets: b, ForecastWindow: 5 * time.Minute, ForecastHorizon: horizon}
	sc := NewScorecard(book, NewLoadBuckets(c), config.Cost{}, false, reg)
	sc.SetForecast(c)
	return sc, &now
}

// finished counts a request that finished now (lasting life) at load,
// qualified or not.
func finished(sc *Scorecard, now time.Time, load float64, qualified bool, life time.Duration) {
	r := record.New(0)
	r.Arrive, r.Terminal = now.Add(-life), now
	r.Load, r.LoadBucket = load, sc.buckets.Label(sc.buckets.Index(load))
	r.SLO = []record.Verdict{{Name: "chat", Qualified: qualified}}
	sc.Add(r)
}

// history proves the curve: 30 good requests at load 4.5 (bucket 5
// meets 0.9: lower bound 0.917) and 30 bad ones at 15.5 (bucket 16 is
// missed), so the breach load is 15 (bucket 16's lower bound).
// They finish 10 minutes before now: in the SLO's window, out of the
// forecast's.
func history(sc *Scorecard, now *time.Time) {
	t := *now
	*now = t.Add(-10 * time.Minute)
	for range 30 {
		finished(sc, *now, 4.5, true, 0)
		finished(sc, *now, 15.5, false, 0)
	}
	*now = t
}

func forecastOf(sc *Scorecard, now time.Time) *Forecast {
	return sc.Page(now).SLOs[0].Scorecard.Forecast
}

// A load rising exactly 0.01 per second, 10 requests a second: the fit
// finds the slope exactly, and the forecast is the time the line takes to
// the breach load, to the millisecond.
//
// Each 10 s sample holds 100 requests at loads rising 0.001 apart; its
// p90 (nearest rank, the 90th) is the load 8.9 s after its start and its
// time the mean of its requests' midpoints, 4.95 s after its start. So
// the fitted line is the true one plus 0.01 × (8.9 − 4.95) = 0.0395, and
// at t = 600 s (load 8) the forecast is (15 − 8.0395) / 0.01 = 696.05 s.
func TestForecastOfAStraightRise(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	sc, now := forecasted(reg, time.Hour)
	t0 := *now
	history(sc, now)
	for i := range 6000 { // 600 s
		*now = t0.Add(time.Duration(i) * 100 * ms)
		finished(sc, *now, 2+0.01*float64(i)/10, true, 0)
	}
	*now = t0.Add(600 * time.Second)
	fc := forecastOf(sc, *now)
	if fc.State != ForecastInHorizon || fc.Seconds == nil || math.Abs(*fc.Seconds-696.05) > 1e-3 {
		t.Fatalf("forecast %+v (seconds %v), want 696.05 s", fc, deref(fc.Seconds))
	}
	if fc.BreachBucket != "16" || *fc.BreachLoad != 15 || fc.KneeBucket != "8" || math.Abs(*fc.Slope-0.01) > 1e-12 ||
		*fc.ResidualSD > 1e-9 || math.Abs(*fc.Load-8.0395) > 1e-9 || fc.Quantile != 0.9 || fc.MinRequests != 20 {
		t.Errorf("evidence %+v: load %v, slope %v, residual sd %v", fc, deref(fc.Load), deref(fc.Slope), deref(fc.ResidualSD))
	}
	// Samples of the last 5 minutes only: 30 of them (the last closes as
	// the forecast reads it), their midpoints 290 s apart.
	if fc.Samples != 30 || fc.Requests != 3000 || math.Abs(fc.SpanSeconds-290) > 1e-9 || fc.WindowSeconds != 300 {
		t.Errorf("samples %d, requests %d, span %v", fc.Samples, fc.Requests, fc.SpanSeconds)
	}
	// A perfect line: no range.
	if math.Abs(*fc.EarliestSeconds-*fc.Seconds) > 1e-6 || math.Abs(*fc.LatestSeconds-*fc.Seconds) > 1e-6 {
		t.Errorf("range %v – %v around %v", *fc.EarliestSeconds, *fc.LatestSeconds, *fc.Seconds)
	}
	if got := gaugeValue(t, reg, "tokentap_slo_breach_forecast_seconds"); math.Abs(got-696.05) > 1e-3 {
		t.Errorf("tokentap_slo_breach_forecast_seconds %v", got)
	}
	// The JSON carries it under the SLO's card.
	w := httptest.NewRecorder()
	sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo?format=json", nil))
	var doc struct {
		SLOs []struct {
			Scorecard struct {
				Forecast *Forecast `json:"breach_forecast"`
			} `json:"scorecard"`
		} `json:"slos"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || len(doc.SLOs) != 1 || doc.SLOs[0].Scorecard.Forecast == nil ||
		doc.SLOs[0].Scorecard.Forecast.State != ForecastInHorizon || *doc.SLOs[0].Scorecard.Forecast.Seconds != *fc.Seconds ||
		!strings.Contains(w.Body.String(), `"breach_bucket": "16"`) {
		t.Errorf("JSON: %v\n%s", err, w.Body.String())
	}
	// The page says it, with its evidence.
	html := pageBody(t, sc)
	for _, want := range []string{"breach forecast", "in 696", "Breach bucket 16", "above the knee 8", "p90 load", "30 samples, 3000 requests", DocsURL + "#the-breach-forecast"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// A noisy rise: the fit's errors are honest. Loads rise 0.02 per second
// with a deterministic zig-zag of ±1 on top; the range holds the exact
// time and the standard error is of the zig-zag's size.
func TestForecastRangeWithNoise(t *testing.T) {
	sc, now := forecasted(nil, time.Hour)
	t0 := *now
	history(sc, now)
	for i := range 3000 { // 300 s
		*now = t0.Add(time.Duration(i) * 100 * ms)
		zig := 1.0
		if (i/100)%2 == 1 { // one sample up, the next down
			zig = -1
		}
		finished(sc, *now, 2+0.02*float64(i)/10+zig, true, 0)
	}
	*now = t0.Add(300 * time.Second)
	fc := forecastOf(sc, *now)
	// The line without the zig-zag: 8.079 now (8, and 0.079 from the p90
	// within a sample), rising 0.02/s: (15 − 8.079) / 0.02 = 346 s. The
	// zig-zag tilts the fit (it starts up and ends down): 0.0193/s, 363 s.
	if fc.State != ForecastInHorizon || math.Abs(*fc.Seconds-346) > 25 {
		t.Fatalf("forecast %+v (seconds %v)", fc, deref(fc.Seconds))
	}
	if !(*fc.EarliestSeconds < 346 && *fc.LatestSeconds > 346 && *fc.ResidualSD > 0.8 && *fc.ResidualSD < 1.2) {
		t.Errorf("range %v – %v, residual sd %v", *fc.EarliestSeconds, *fc.LatestSeconds, *fc.ResidualSD)
	}
}

// No forecast, and no gauge, whenever the evidence is not there.
func TestForecastAbsent(t *testing.T) {
	rise := func(sc *Scorecard, now *time.Time, seconds int, load func(s float64) float64) {
		t0 := *now
		for i := range seconds * 10 {
			*now = t0.Add(time.Duration(i) * 100 * ms)
			finished(sc, *now, load(float64(i)/10), true, 0)
		}
		*now = t0.Add(time.Duration(seconds) * time.Second)
	}
	for _, c := range []struct {
		name, state, reason string
		history             bool
		horizon             time.Duration
		seconds             int
		load                func(s float64) float64
	}{
		{"no bucket proven missed", ForecastNotEnoughEvidence, "no load bucket is proven to miss", false, time.Hour, 300,
			func(s float64) float64 { return 2 + 0.01*s }},
		{"too few samples", ForecastNotEnoughEvidence, "the fit needs 10 spanning at least 150 s", true, time.Hour, 90,
			func(s float64) float64 { return 2 + 0.01*s }},
		{"flat", ForecastNotRising, "not proven rising", true, time.Hour, 300,
			func(float64) float64 { return 6 }},
		{"falling", ForecastNotRising, "not proven rising", true, time.Hour, 300,
			func(s float64) float64 { return 12 - 0.01*s }},
		{"beyond the horizon", ForecastBeyondHorizon, "beyond the horizon", true, 10 * time.Minute, 300,
			func(s float64) float64 { return 2 + 0.01*s }},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			sc, now := forecasted(reg, c.horizon)
			if c.history {
				history(sc, now)
			}
			rise(sc, now, c.seconds, c.load)
			fc := forecastOf(sc, *now)
			if fc.State != c.state || fc.Seconds != nil || !strings.Contains(fc.Reason, c.reason) || fc.Exported() {
				t.Fatalf("forecast %+v, want %s (%q)", fc, c.state, c.reason)
			}
			if n := testutil.CollectAndCount(sc.kneeCollectorForTest(), "tokentap_slo_breach_forecast_seconds"); n != 0 {
				t.Fatalf("%d forecast series, want none", n)
			}
		})
	}
}

// Sparse traffic: a request every 20 s never makes a sample of 20
// requests; the open one is dropped once older than the window, so the
// memory stays bounded and there is no fit.
func TestForecastSparseTraffic(t *testing.T) {
	sc, now := forecasted(nil, time.Hour)
	t0 := *now
	history(sc, now)
	for i := range 100 {
		*now = t0.Add(time.Duration(i) * 20 * time.Second)
		finished(sc, *now, 20, true, 0)
	}
	tr := sc.trends[0]
	if fc := forecastOf(sc, *now); fc.State != ForecastNotEnoughEvidence || fc.Samples != 0 || tr.open.n >= 20 {
		t.Fatalf("forecast %+v, open sample of %d", fc, tr.open.n)
	}
}

// Already in the breach bucket: 0 s, exported.
func TestForecastReached(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	sc, now := forecasted(reg, time.Hour)
	t0 := *now
	history(sc, now)
	for i := range 3000 {
		*now = t0.Add(time.Duration(i) * 100 * ms)
		finished(sc, *now, 16+float64(i%10)/10, false, 0)
	}
	fc := forecastOf(sc, *now)
	if fc.State != ForecastReached || *fc.Seconds != 0 || !fc.Exported() {
		t.Fatalf("forecast %+v", fc)
	}
	if got := gaugeValue(t, reg, "tokentap_slo_breach_forecast_seconds"); got != 0 {
		t.Errorf("gauge %v", got)
	}
	if html := pageBody(t, sc); !strings.Contains(html, "<td>now</td>") {
		t.Errorf("page lacks the reached forecast")
	}
}

// A sample's load is the target-quantile of its requests' loads (nearest
// rank), its time the mean of their midpoints; past the reservoir it
// keeps a uniform sample of 4096 loads.
func TestLoadTrendSample(t *testing.T) {
	tr := newLoadTrend(0.9, 5*time.Minute)
	t0 := time.Unix(0, 0)
	for i := 100; i >= 1; i-- { // 100 down to 1, all finishing at t0, each lasting 2 s
		tr.add(t0, float64(i), 2*time.Second)
	}
	tr.add(t0.Add(10*time.Second), 500, 0) // closes the first sample
	if len(tr.samples) != 1 || tr.samples[0].load != 90 || tr.samples[0].n != 100 || !tr.samples[0].at.Equal(t0.Add(-time.Second)) {
		t.Fatalf("samples %+v", tr.samples)
	}
	big := newLoadTrend(0.5, 5*time.Minute)
	for i := range 100_000 {
		big.add(t0, float64(i%1000), 0)
	}
	if len(big.open.loads) != forecastReservoir {
		t.Fatalf("reservoir %d", len(big.open.loads))
	}
	big.roll(t0.Add(10 * time.Second))
	if m := big.samples[0].load; m < 450 || m > 550 {
		t.Errorf("median of a uniform 0..999 from the reservoir: %v", m)
	}
	// The fewest requests per sample: 10, or 2 / (1 − target).
	for target, want := range map[float64]int64{0.5: 10, 0.8: 10, 0.9: 20, 0.95: 40, 0.99: 200, 0.999: 2000, 0.99999: 4096} {
		if got := newLoadTrend(target, time.Minute).minN; got != want {
			t.Errorf("target %v: %d requests per sample, want %d", target, got, want)
		}
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single %s", name)
	return 0
}

func pageBody(t *testing.T, sc *Scorecard) string {
	t.Helper()
	var b strings.Builder
	if err := pageHTML.Execute(&b, sc.Page(sc.book.clock())); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
