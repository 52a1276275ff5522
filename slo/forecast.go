package slo

import (
	"fmt"
	"html/template"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// The breach forecast (docs/measurement.md, the breach forecast): when
// will the load reach the first load bucket where the SLO is proven
// missed? Two measured things and one straight line:
//
//   - the breach bucket: from the live knee (knee.go), the lowest load
//     bucket above the knee (or, with no knee, the lowest bucket) whose
//     attainment upper bound (one-sided 95% Wilson, at least
//     KneeMinRequests requests) is below the target: Knee.Missed. Its
//     lower bound is the breach load;
//   - the load's trend: the SLO's finished requests are grouped, in the
//     order they finish, into samples of at least one resolution
//     (window ÷ 30) and at least Forecast.MinRequests requests (10, or
//     2 / (1 − target) when more); each sample is the point (the mean
//     midpoint of its requests' lives, the target-quantile of the loads
//     they ran under). Least squares fits a line to the samples of the
//     last window, with the standard errors of its level now and of its
//     slope;
//   - the forecast: the time until the line reaches the breach load.
//
// Why the target-quantile of the requests' loads and not the mean load:
// a request's load is the time-weighted mean in flight over its own life
// (knee.go), and at a steady mean load L the requests' loads spread
// around it (for Poisson arrivals their variance is about 2L/3). The SLO
// is missed once more than 1 − target of the requests run where it
// fails, which happens when the target-quantile of their loads, not
// their mean, enters the breach bucket; at a mean load of 10 a fifth of
// the requests run above 12.
//
// Nothing is made up: without a proven-missed bucket, without
// ForecastMinSamples samples spanning half the window, or without a rise
// proven at 95% (slope minus Z95 standard errors above 0) there is no
// forecast, and beyond the horizon neither.

// Forecast states.
const (
	// ForecastInHorizon: the fitted load reaches the breach load within
	// the horizon, in Seconds.
	ForecastInHorizon = "forecast"
	// ForecastReached: the fitted load is at or past the breach load
	// now: Seconds is 0.
	ForecastReached = "reached"
	// ForecastBeyondHorizon: it would reach it later than the horizon.
	ForecastBeyondHorizon = "beyond_horizon"
	// ForecastNotRising: the fit does not prove the load rising.
	ForecastNotRising = "not_rising"
	// ForecastNotEnoughEvidence: no bucket is proven missed, or too few
	// samples for a fit.
	ForecastNotEnoughEvidence = "not_enough_evidence"
)

// ForecastMinSamples is the fewest samples a fit needs; they must also
// span at least half the window.
const ForecastMinSamples = 10

const (
	// forecastSamplesPerWindow sets the resolution: window ÷ it.
	forecastSamplesPerWindow = 30
	// forecastReservoir bounds the loads one sample keeps (a uniform
	// reservoir past it), so memory does not grow with the request rate.
	forecastReservoir = 4096
	// forecastMinRequests is the fewest requests a sample takes; a
	// target above 0.8 takes 2 / (1 − target) (20 for 0.9, 200 for 0.99),
	// so that the sample's target-quantile is not its largest load.
	forecastMinRequests = 10
)

// Forecast is one SLO's breach forecast, as /slo shows it. A null figure
// was not computed: no fit (too few samples), or no time for the state.
type Forecast struct {
	State string `json:"state"`
	// Seconds is the time until the fitted load reaches the breach load
	// (set for ForecastInHorizon, 0 for ForecastReached); Earliest and
	// Latest are the same with the level now and the slope each at its
	// one-sided 95% bound, towards and away from the breach (Latest is
	// null when the slope's bound is not above 0).
	Seconds         *float64 `json:"seconds"`
	EarliestSeconds *float64 `json:"earliest_seconds"`
	LatestSeconds   *float64 `json:"latest_seconds"`
	// The knee's bucket (empty without a knee) and the breach bucket:
	// the first proven missed; BreachLoad is its lower bound.
	KneeBucket   string   `json:"knee_bucket,omitempty"`
	BreachBucket string   `json:"breach_bucket,omitempty"`
	BreachLoad   *float64 `json:"breach_load"`
	// The trend: the quantile of the requests' loads each sample takes
	// (the SLO's target), the fitted level now with its standard error,
	// the slope (load per second) with its standard error, and the
	// residuals' standard deviation.
	Quantile    float64  `json:"load_quantile"`
	Load        *float64 `json:"load_now"`
	LoadStdErr  *float64 `json:"load_now_stderr"`
	Slope       *float64 `json:"slope_per_second"`
	SlopeStdErr *float64 `json:"slope_stderr"`
	ResidualSD  *float64 `json:"residual_sd"`
	// The evidence: samples fitted, their requests, the time from the
	// oldest to the newest, and the fewest requests a sample takes.
	Samples     int     `json:"samples"`
	Requests    int64   `json:"requests"`
	SpanSeconds float64 `json:"span_seconds"`
	MinRequests int64   `json:"min_requests_per_sample"`
	// The declared window and horizon (capacity.forecast_window,
	// capacity.forecast_horizon).
	WindowSeconds  float64 `json:"window_seconds"`
	HorizonSeconds float64 `json:"horizon_seconds"`
	// Reason says, in words, why there is no forecast or what it is.
	Reason string `json:"reason"`
}

// Exported reports whether the forecast is a number for
// tokentap_slo_breach_forecast_seconds.
func (f *Forecast) Exported() bool {
	return f != nil && f.Seconds != nil && (f.State == ForecastInHorizon || f.State == ForecastReached)
}

// loadTrend is one SLO's samples of the load its requests ran under.
// Safe for concurrent use; touched once per finished request.
type loadTrend struct {
	q      float64
	minN   int64
	res    time.Duration
	window time.Duration

	mu      sync.Mutex
	open    trendAcc
	samples []loadSample // closed, oldest first
	rng     *rand.Rand
}

// trendAcc is the open sample.
type trendAcc struct {
	start time.Time // its first request's finish; zero: empty
	n     int64
	mid   float64   // Σ (request's midpoint − start), seconds
	loads []float64 // a uniform reservoir of at most forecastReservoir
}

type loadSample struct {
	at   time.Time // the mean midpoint of its requests
	load float64   // the q-quantile of their loads
	n    int64
}

func newLoadTrend(target float64, window time.Duration) *loadTrend {
	minN := int64(forecastMinRequests)
	if target < 1 {
		minN = max(minN, int64(math.Ceil(2/(1-target)-1e-9)))
	}
	minN = min(minN, forecastReservoir)
	return &loadTrend{q: target, minN: minN, window: window, res: window / forecastSamplesPerWindow,
		rng: rand.New(rand.NewPCG(1, 2))}
}

// add counts a request of duration d that finished at now with its load.
func (t *loadTrend) add(now time.Time, load float64, d time.Duration) {
	if math.IsNaN(load) || math.IsInf(load, 0) || load < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll(now)
	a := &t.open
	if a.n == 0 {
		a.start = now
	}
	a.n++
	a.mid += now.Add(-d / 2).Sub(a.start).Seconds()
	if len(a.loads) < forecastReservoir {
		a.loads = append(a.loads, load)
	} else if j := t.rng.Int64N(a.n); j < forecastReservoir {
		a.loads[j] = load
	}
}

// roll closes the open sample once it has its time and its requests,
// drops it when it is older than the window without them (the traffic
// was too sparse), and drops closed samples older than the window. t.mu
// is held.
func (t *loadTrend) roll(now time.Time) {
	a := &t.open
	if a.n > 0 {
		age := now.Sub(a.start)
		switch {
		case age >= t.res && a.n >= t.minN:
			slices.Sort(a.loads)
			k := min(max(int(math.Ceil(t.q*float64(len(a.loads))))-1, 0), len(a.loads)-1)
			t.samples = append(t.samples, loadSample{
				at:   a.start.Add(time.Duration(a.mid / float64(a.n) * float64(time.Second))),
				load: a.loads[k], n: a.n})
			*a = trendAcc{loads: a.loads[:0]}
		case age >= t.window:
			*a = trendAcc{loads: a.loads[:0]}
		}
	}
	cut := now.Add(-t.window)
	i := 0
	for i < len(t.samples) && t.samples[i].at.Before(cut) {
		i++
	}
	if i > 0 {
		t.samples = append(t.samples[:0], t.samples[i:]...)
	}
}

// trendFit is a least-squares line through the samples, x in seconds
// from now.
type trendFit struct {
	n                     int
	requests              int64
	span                  float64
	level, levelSE        float64 // at now
	slope, slopeSE, resSD float64
}

// fit fits the samples of the window ending at now; ok is false with
// fewer than ForecastMinSamples or a span under half the window.
func (t *loadTrend) fit(now time.Time) (f trendFit, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll(now)
	f.n = len(t.samples)
	for _, s := range t.samples {
		f.requests += s.n
	}
	if f.n == 0 {
		return f, false
	}
	f.span = t.samples[f.n-1].at.Sub(t.samples[0].at).Seconds()
	if f.n < ForecastMinSamples || f.span < t.window.Seconds()/2 {
		return f, false
	}
	var mx, my float64
	for _, s := range t.samples {
		mx += s.at.Sub(now).Seconds()
		my += s.load
	}
	n := float64(f.n)
	mx, my = mx/n, my/n
	var sxx, sxy float64
	for _, s := range t.samples {
		dx := s.at.Sub(now).Seconds() - mx
		sxx += dx * dx
		sxy += dx * (s.load - my)
	}
	f.slope = sxy / sxx
	f.level = my - f.slope*mx
	var rss float64
	for _, s := range t.samples {
		r := s.load - (f.level + f.slope*s.at.Sub(now).Seconds())
		rss += r * r
	}
	f.resSD = math.Sqrt(rss / (n - 2))
	f.slopeSE = f.resSD / math.Sqrt(sxx)
	f.levelSE = f.resSD * math.Sqrt(1/n+mx*mx/sxx)
	return f, true
}

// forecast returns the breach forecast at now from the knee read off
// curve and the trend, with horizon.
func (t *loadTrend) forecast(now time.Time, knee Knee, curve []LoadPoint, horizon time.Duration) *Forecast {
	fc := &Forecast{State: ForecastNotEnoughEvidence, Quantile: t.q, MinRequests: t.minN,
		WindowSeconds: t.window.Seconds(), HorizonSeconds: horizon.Seconds()}
	if knee.State == KneeEstimate {
		fc.KneeBucket = knee.Bucket
	}
	var breach *float64
	for _, p := range curve {
		if knee.Missed != "" && p.Bucket == knee.Missed {
			fc.BreachBucket = p.Bucket
			b := p.From
			breach, fc.BreachLoad = &b, &b
		}
	}
	f, ok := t.fit(now)
	fc.Samples, fc.Requests, fc.SpanSeconds = f.n, f.requests, f.span
	if ok {
		level, levelSE, slope, slopeSE, res := f.level, f.levelSE, f.slope, f.slopeSE, f.resSD
		fc.Load, fc.LoadStdErr, fc.Slope, fc.SlopeStdErr, fc.ResidualSD = &level, &levelSE, &slope, &slopeSE, &res
	}
	pctile := fmt.Sprintf("p%s", fmtSig(t.q*100))
	switch {
	case breach == nil:
		fc.Reason = "no load bucket is proven to miss the target yet: nothing to forecast"
	case !ok:
		fc.Reason = fmt.Sprintf("%d samples of at least %d requests spanning %s s; the fit needs %d spanning at least %s s (half the window)",
			f.n, t.minN, fmtSig(f.span), ForecastMinSamples, fmtSig(t.window.Seconds()/2))
	case f.level >= *breach:
		fc.State = ForecastReached
		zero := 0.0
		fc.Seconds, fc.EarliestSeconds, fc.LatestSeconds = &zero, &zero, &zero
		fc.Reason = fmt.Sprintf("the %s load (%s) is in the breach bucket now (from %s)", pctile, fmtSig(f.level), fmtSig(*breach))
	case f.slope-Z95*f.slopeSE <= 0:
		fc.State = ForecastNotRising
		fc.Reason = fmt.Sprintf("the %s load is not proven rising: slope %s ± %s per second", pctile, fmtSig(f.slope), fmtSig(f.slopeSE))
	default:
		s := (*breach - f.level) / f.slope
		early := math.Max(0, (*breach-(f.level+Z95*f.levelSE))/(f.slope+Z95*f.slopeSE))
		late := math.Max(0, (*breach-(f.level-Z95*f.levelSE))/(f.slope-Z95*f.slopeSE))
		fc.EarliestSeconds, fc.LatestSeconds = &early, &late
		if s > horizon.Seconds() {
			fc.State = ForecastBeyondHorizon
			fc.Reason = fmt.Sprintf("the %s load would reach the breach load %s in %s s, beyond the horizon", pctile, fmtSig(*breach), fmtSig(s))
			break
		}
		fc.State, fc.Seconds = ForecastInHorizon, &s
		fc.Reason = fmt.Sprintf("the %s load, %s now and rising %s per second, reaches the breach load %s in %s s", pctile, fmtSig(f.level), fmtSig(f.slope), fmtSig(*breach), fmtSig(s))
	}
	return fc
}

// SetForecast sets the breach forecast's window and horizon from the
// capacity section (zero fields: the defaults) and starts its trends
// afresh. NewScorecard starts with the defaults; call it before serving.
func (sc *Scorecard) SetForecast(c config.Capacity) {
	c = c.WithDefaults()
	sc.horizon = c.ForecastHorizon
	sc.trends = nil
	for _, o := range sc.book.cfg.Objectives {
		sc.trends = append(sc.trends, newLoadTrend(o.Target, c.ForecastWindow))
	}
}

// The forecast row of a scorecard (a template associated with pageHTML,
// called by the scorecards template with a *Forecast).
var _ = template.Must(pageHTML.New("forecast").Funcs(template.FuncMap{
	"fsig":  fmtSig,
	"fpct":  func(q float64) float64 { return q * 100 },
	"fdocs": func() string { return DocsURL + "#the-breach-forecast" },
}).Parse(`{{with .}}<tr><td class="l"><a href="{{fdocs}}">breach forecast</a></td><td>{{if eq .State "forecast"}}in {{fsig (deref .Seconds)}} s{{else if eq .State "reached"}}now{{else if eq .State "beyond_horizon"}}none within {{fsig .HorizonSeconds}} s{{else if eq .State "not_rising"}}none: load not rising{{else}}not enough evidence{{end}}</td><td class="l">{{.Reason}}.{{if .BreachBucket}} Breach bucket {{.BreachBucket}} (first proven missed{{if .KneeBucket}}, above the knee {{.KneeBucket}}{{end}}).{{end}}{{if .Slope}} Trend of the p{{fsig (fpct .Quantile)}} load over {{fsig .SpanSeconds}} s: {{.Samples}} samples, {{.Requests}} requests; now {{fsig (deref .Load)}} ± {{fsig (deref .LoadStdErr)}}, slope {{fsig (deref .Slope)}} ± {{fsig (deref .SlopeStdErr)}} /s, residual sd {{fsig (deref .ResidualSD)}}.{{end}}{{if and .EarliestSeconds .LatestSeconds (eq .State "forecast")}} Range with the fit's errors: {{fsig (deref .EarliestSeconds)}} – {{fsig (deref .LatestSeconds)}} s.{{end}} Window {{fsig .WindowSeconds}} s, horizon {{fsig .HorizonSeconds}} s.</td></tr>{{end}}`))

// requestLife is a record's duration, arrival to its end (0 when
// either is unknown).
func requestLife(r *record.Record) time.Duration {
	if r.Arrive.IsZero() || r.Terminal.IsZero() || r.Terminal.Before(r.Arrive) {
		return 0
	}
	return r.Terminal.Sub(r.Arrive)
}
