package slo

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/cause"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/internal/page"
	"github.com/tokentap/tokentap/record"
)

// The scorecard (docs/cost.md): for each SLO, over the same window as
// its row on /slo, what a useful token costs, the energy it takes, the
// latency tail, the attainment with its bound and the knee. Cost and
// energy are the replica's (its whole price, the energy of every
// request); goodput is the SLO's. Each figure is defined in
// docs/cost.md, and the page links each one to its definition.

// DocsURL is where the page's definition links point.
var DocsURL = "https://github.com/tokentap/tokentap/blob/main/docs/cost.md"

// Card is one SLO's scorecard. A null figure has no denominator yet (no
// goodput, no price declared, no energy measured).
type Card struct {
	// SpanSeconds is the time the figures cover: the span of the SLO's
	// row (from the first request counted to now). The rates and the
	// cost divide by it floored at 1 s (rateSpan), as the row's rates do.
	SpanSeconds float64 `json:"span_seconds"`
	// The declared prices (config cost section); null when not declared.
	Currency          string   `json:"currency,omitempty"`
	PricePerHour      *float64 `json:"price_per_hour"`
	EnergyPricePerKWh *float64 `json:"energy_price_per_kwh"`
	// Goodput: output tokens of the SLO's qualified requests per second;
	// output: output tokens of every live request per second.
	GoodputTokensRate float64 `json:"goodput_tokens_per_second"`
	OutputTokensRate  float64 `json:"output_tokens_per_second"`
	// The replica's cost over the span per million goodput (or live
	// output) tokens.
	CostPerMillionGoodputTokens *float64 `json:"cost_per_million_goodput_tokens"`
	CostPerMillionOutputTokens  *float64 `json:"cost_per_million_output_tokens"`
	// Energy is on or off. The joules attributed to every request that
	// finished in the span (total, and above the idle baseline) per live
	// output token, and the energy share of the cost: those joules at the
	// declared kWh price per million goodput (or output) tokens.
	Energy                            string   `json:"energy"`
	JoulesPerOutputToken              *float64 `json:"joules_per_output_token"`
	DynamicJoulesPerOutputToken       *float64 `json:"dynamic_joules_per_output_token"`
	EnergyCostPerMillionGoodputTokens *float64 `json:"energy_cost_per_million_goodput_tokens"`
	EnergyCostPerMillionOutputTokens  *float64 `json:"energy_cost_per_million_output_tokens"`
	// TTFT p99 (request-weighted) and ITL p99 (gap-weighted) of the
	// SLO's requests, from log buckets 5% wide: at most 5% above the
	// exact percentile.
	TTFTP99Seconds *float64 `json:"ttft_p99_seconds"`
	ITLP99Seconds  *float64 `json:"itl_p99_seconds"`
	// The SLO's attainment and its one-sided 95% Wilson bounds (as in
	// its row), and the verdict.
	Target            float64  `json:"target"`
	Attainment        *float64 `json:"attainment"`
	AttainmentLower95 float64  `json:"attainment_lower95"`
	AttainmentUpper95 float64  `json:"attainment_upper95"`
	Verdict           string   `json:"verdict"`
	// MissedByCause counts the SLO's missed requests by why they were
	// slow (docs/measurement.md §6b): a missed request once under each
	// (event, cause) pair its record has, and under Cause "none" when it
	// has none (an error, a slow TPOT with no stall...). Only the pairs
	// with a request are listed, in cause.Pairs' order, "none" last.
	MissedByCause []CauseCount `json:"missed_by_cause"`
	// Knee is the safe-capacity estimate; Curve the attainment and
	// goodput by load bucket it is read from (buckets with requests).
	Knee  Knee        `json:"knee"`
	Curve []LoadPoint `json:"curve"`
	// Forecast is the breach forecast read off the knee and the load's
	// trend (forecast.go).
	Forecast *Forecast `json:"breach_forecast"`
	// Plot is the curve as an inline SVG (HTML only).
	Plot template.HTML `json:"-"`
}

// CauseCount is how many of an SLO's missed requests had a slow event
// (What: ttft, stall) put down to Cause.
type CauseCount struct {
	What     string `json:"what,omitempty"`
	Cause    string `json:"cause"`
	Requests int64  `json:"requests"`
}

// Scorecard keeps, per SLO, the sliding-window sums the cards need
// beyond the Book's counts, serves /slo with the cards, and exports the
// knee and the breach forecast as gauges. Add is called once per finished request, never per
// token.
type Scorecard struct {
	book    *Book
	buckets LoadBuckets
	index   map[string]int // bucket label → index
	cost    config.Cost
	energy  bool
	windows []*cardWindow // parallel to book.cfg.Objectives
	// synthetic is shown on /slo (SetSynthetic); "" shows nothing.
	synthetic string
	// prefix returns the prefix reuse section (SetPrefixReuse); nil:
	// none.
	prefix func(time.Time) *PrefixReuse
	// The breach forecast (SetForecast): the load trends, parallel to
	// windows, and the horizon.
	trends  []*loadTrend
	horizon time.Duration
}

// SetSynthetic makes /slo say, as a warning, what on it is made up (the
// built-in simulator's numbers, a demo SLO or price). Call it before
// serving; "" (the default) says nothing.
func (sc *Scorecard) SetSynthetic(s string) { sc.synthetic = s }

// NewScorecard returns the scorecard of book's SLOs with the load
// buckets the load meter labels with, the declared prices, and whether
// energy is measured; it registers the knee gauges on reg (nil: none).
func NewScorecard(book *Book, buckets LoadBuckets, cost config.Cost, energyOn bool, reg prometheus.Registerer) *Scorecard {
	sc := &Scorecard{book: book, buckets: buckets, index: map[string]int{}, cost: cost, energy: energyOn}
	for i := 0; i < buckets.Len(); i++ {
		sc.index[buckets.Label(i)] = i
	}
	for _, o := range book.cfg.Objectives {
		sc.windows = append(sc.windows, newCardWindow(o.Window, 60, buckets.Len()))
	}
	sc.SetForecast(config.Capacity{})
	if reg != nil {
		reg.MustRegister(kneeCollector{sc})
	}
	return sc
}

// Add counts a finished record.
func (sc *Scorecard) Add(r *record.Record) {
	now := sc.book.clock()
	bucket, hasLoad := sc.index[r.LoadBucket]
	if !hasLoad {
		bucket = -1
	}
	for i, o := range sc.book.cfg.Objectives {
		var v *record.Verdict
		for k := range r.SLO {
			if r.SLO[k].Name == o.Name && !r.SLO[k].Excluded {
				v = &r.SLO[k]
			}
		}
		sc.windows[i].add(now, r, v, bucket)
		if v != nil && hasLoad {
			sc.trends[i].add(now, r.Load, requestLife(r))
		}
	}
}

// Fill sets the scorecard of every SLO of p, computed at now.
func (sc *Scorecard) Fill(p *Page, now time.Time) {
	for i := range p.SLOs {
		for k, o := range sc.book.cfg.Objectives {
			if o.Name == p.SLOs[i].Name {
				p.SLOs[i].Scorecard = sc.card(k, now, &p.SLOs[i])
			}
		}
	}
}

// Page returns the /slo document with the scorecards.
func (sc *Scorecard) Page(now time.Time) Page {
	p := sc.book.Status(now)
	p.Synthetic = sc.synthetic
	sc.Fill(&p, now)
	if sc.prefix != nil {
		p.PrefixReuse = sc.prefix(now)
	}
	return p
}

// ServeHTTP serves /slo with the scorecards: HTML, or JSON for
// ?format=json or an Accept header that prefers it.
func (sc *Scorecard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	page.Serve(w, r, sc.Page(sc.book.clock()), pageHTML)
}

func (sc *Scorecard) card(i int, now time.Time, st *Status) *Card {
	t := sc.windows[i].totals(now)
	c := &Card{SpanSeconds: st.SpanSeconds, Energy: "off", Target: st.Target, Attainment: st.Attainment,
		AttainmentLower95: st.AttainmentLower95, AttainmentUpper95: st.AttainmentUpper95, Verdict: st.Verdict}
	if c.SpanSeconds <= 0 {
		c.SpanSeconds = t.span.Seconds()
	}
	// The rates and the cost divide by the span floored as the row's are.
	span := rateSpan(c.SpanSeconds)
	c.GoodputTokensRate = float64(t.goodTokens) / span
	c.OutputTokensRate = float64(t.liveTokens) / span
	per := func(num, den float64) *float64 {
		if den <= 0 {
			return nil
		}
		v := num / den * 1e6
		return &v
	}
	if sc.cost.Declared() {
		c.Currency = sc.cost.Currency
	}
	if h := sc.cost.Hourly(); h > 0 {
		c.PricePerHour = &h
		cost := h / 3600 * span
		c.CostPerMillionGoodputTokens = per(cost, float64(t.goodTokens))
		c.CostPerMillionOutputTokens = per(cost, float64(t.liveTokens))
	}
	if p := sc.cost.EnergyPerKWh; p > 0 {
		c.EnergyPricePerKWh = &p
	}
	if sc.energy {
		c.Energy = "on"
		if t.liveTokens > 0 && t.energyRequests > 0 {
			j, d := t.energyJ/float64(t.liveTokens), t.energyDynJ/float64(t.liveTokens)
			c.JoulesPerOutputToken, c.DynamicJoulesPerOutputToken = &j, &d
			if p := sc.cost.EnergyPerKWh; p > 0 {
				cost := t.energyJ / 3.6e6 * p
				c.EnergyCostPerMillionGoodputTokens = per(cost, float64(t.goodTokens))
				c.EnergyCostPerMillionOutputTokens = per(cost, float64(t.liveTokens))
			}
		}
	}
	for k, p := range cause.Pairs {
		if n := t.missedBy[k]; n > 0 {
			c.MissedByCause = append(c.MissedByCause, CauseCount{What: p.What, Cause: p.Cause, Requests: n})
		}
	}
	if t.missedNone > 0 {
		c.MissedByCause = append(c.MissedByCause, CauseCount{Cause: "none", Requests: t.missedNone})
	}
	c.TTFTP99Seconds = t.ttft.quantile(0.99)
	c.ITLP99Seconds = t.itl.quantile(0.99)
	c.Curve = Curve(sc.buckets, t.offered, t.qualified, t.good, span, st.Target)
	c.Knee = EstimateKnee(c.Curve)
	c.Plot = plotCurve(c.Curve, st.Target, c.Knee)
	c.Forecast = sc.trends[i].forecast(now, c.Knee, c.Curve, sc.horizon)
	return c
}

// cardWindow is one SLO's sliding window of the sums a card needs.
type cardWindow struct {
	buckets int
	w       sliding[cardSums]
}

type cardSums struct {
	// Every record: live output tokens, and attributed energy.
	liveTokens         int64
	energyJ, energyDyn float64
	energyRequests     int64
	// The SLO's records (in scope, not excluded).
	goodTokens               int64
	offered, qualified, good []int64 // per load bucket
	ttft, itl                latHist
	// The SLO's missed requests by cause (Card.MissedByCause).
	missedBy   [len(cause.Pairs)]int64
	missedNone int64
}

func newCardWindow(d time.Duration, n, buckets int) *cardWindow {
	w := &cardWindow{buckets: buckets}
	w.w.init(d, n)
	return w
}

func (w *cardWindow) add(now time.Time, r *record.Record, v *record.Verdict, bucket int) {
	w.w.add(now, func(s *cardSums) {
		if r.Traffic == "live" && r.OutputTokens > 0 {
			s.liveTokens += r.OutputTokens
		}
		if r.EnergySource != "" && r.EnergySource != "none" {
			s.energyJ += r.EnergyJ
			s.energyDyn += r.EnergyDynamicJ
			s.energyRequests++
		}
		if v == nil {
			return
		}
		tokens := int64(0)
		if v.Qualified && r.OutputTokens > 0 {
			tokens = r.OutputTokens
		}
		s.goodTokens += tokens
		if !v.Qualified {
			s.missed(r)
		}
		if bucket >= 0 {
			if s.offered == nil {
				s.offered, s.qualified, s.good = make([]int64, w.buckets), make([]int64, w.buckets), make([]int64, w.buckets)
			}
			s.offered[bucket]++
			if v.Qualified {
				s.qualified[bucket]++
				s.good[bucket] += tokens
			}
		}
		if r.Stream {
			if d, ok := r.TTFT(); ok {
				s.ttft.add(d.Seconds())
			}
			r.Gaps(func(g time.Duration) { s.itl.add(g.Seconds()) })
		}
	})
}

// missed counts a missed request under each (event, cause) pair of its
// causes, once each; under none when it has none.
func (s *cardSums) missed(r *record.Record) {
	var seen [len(cause.Pairs)]bool
	for _, c := range r.Causes {
		for k, p := range cause.Pairs {
			if p.What == c.What && p.Cause == c.Cause && !seen[k] {
				seen[k] = true
				s.missedBy[k]++
			}
		}
	}
	if len(r.Causes) == 0 {
		s.missedNone++
	}
}

type cardTotals struct {
	missedBy                 [len(cause.Pairs)]int64
	missedNone               int64
	span                     time.Duration
	liveTokens, goodTokens   int64
	energyJ, energyDynJ      float64
	energyRequests           int64
	offered, qualified, good []int64
	ttft, itl                latHist
}

func (w *cardWindow) totals(now time.Time) cardTotals {
	t := cardTotals{offered: make([]int64, w.buckets), qualified: make([]int64, w.buckets), good: make([]int64, w.buckets)}
	t.span = w.w.sum(now, func(s *cardSums) {
		t.liveTokens += s.liveTokens
		t.goodTokens += s.goodTokens
		t.energyJ += s.energyJ
		t.energyDynJ += s.energyDyn
		t.energyRequests += s.energyRequests
		for k := range s.offered {
			t.offered[k] += s.offered[k]
			t.qualified[k] += s.qualified[k]
			t.good[k] += s.good[k]
		}
		t.ttft.merge(&s.ttft)
		t.itl.merge(&s.itl)
		for k := range s.missedBy {
			t.missedBy[k] += s.missedBy[k]
		}
		t.missedNone += s.missedNone
	})
	return t
}

// latHist is a sparse histogram of durations in log buckets 5% wide:
// bucket i holds values in (latBase·1.05^(i−1), latBase·1.05^i]. The zero
// value is empty.
//
// A window keeps one per slot and per figure (60 slots of a card, 180 of
// the trend), and they fill for as long as the window is long: an hour.
// So the buckets are one sorted slice of packed words, 8 bytes each
// (about 10 with the slice's spare room), where a map held them in about
// 37 (TestCardWindowHistogramsAreSmall): with maps, the soak's heap grew
// by about 1 MiB an hour until the SLO's 1-hour window was full
// (docs/performance.md, "An hour at 500 streams").
type latHist struct {
	n int64
	// cells are the non-empty buckets, ascending, each index<<latShift | count.
	cells []uint64
}

const (
	latBase  = 1e-6 // seconds
	latRatio = 1.05
	latShift = 48 // a count takes the low 48 bits, the index the 16 above
)

var logLatRatio = math.Log(latRatio)

func latIndex(sec float64) int16 {
	if sec <= latBase {
		return 0
	}
	return int16(min(math.Ceil(math.Log(sec/latBase)/logLatRatio), math.MaxInt16))
}

func (h *latHist) add(sec float64) {
	k := uint64(latIndex(sec)) << latShift
	// k has a count of 0 and every cell one of at least 1, so k's place
	// is the one of its bucket's cell when there is one.
	i, _ := slices.BinarySearch(h.cells, k)
	if i < len(h.cells) && h.cells[i]>>latShift == k>>latShift {
		h.cells[i]++
	} else {
		h.cells = slices.Insert(h.cells, i, k|1)
	}
	h.n++
}

func (h *latHist) merge(o *latHist) {
	if len(o.cells) == 0 {
		return
	}
	out := make([]uint64, 0, len(h.cells)+len(o.cells))
	a, b := h.cells, o.cells
	for len(a) > 0 && len(b) > 0 {
		switch ka, kb := a[0]>>latShift, b[0]>>latShift; {
		case ka < kb:
			out, a = append(out, a[0]), a[1:]
		case kb < ka:
			out, b = append(out, b[0]), b[1:]
		default:
			out, a, b = append(out, a[0]+b[0]&(1<<latShift-1)), a[1:], b[1:]
		}
	}
	h.cells = append(append(out, a...), b...)
	h.n += o.n
}

// quantile returns the upper edge of the bucket holding the q-quantile
// (nearest rank), or nil when empty.
func (h *latHist) quantile(q float64) *float64 {
	if h.n == 0 {
		return nil
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	var cum int64
	for _, c := range h.cells {
		cum += int64(c & (1<<latShift - 1))
		if cum >= rank {
			v := latBase * math.Pow(latRatio, float64(c>>latShift))
			return &v
		}
	}
	return nil
}

// kneeCollector exports each SLO's knee over its window (this
// instance's view) and its breach forecast (forecast.go), and the load
// buckets' bounds, which let PromQL turn the load label back into a
// number (the knee rules).
type kneeCollector struct{ sc *Scorecard }

var (
	kneeLoadDesc = prometheus.NewDesc("tokentap_slo_knee_load",
		"This instance's knee estimate per SLO over the SLO's /slo window: the upper bound of the highest load bucket whose attainment lower bound (one-sided 95% Wilson) meets the target, with at least 20 requests. Absent when there is not enough evidence. +Inf: the open last bucket meets.",
		[]string{LabelSLO}, nil)
	kneeEvidenceDesc = prometheus.NewDesc("tokentap_slo_knee_evidence_requests",
		"Requests offered to the SLO in the knee's load bucket over the SLO's /slo window (present with tokentap_slo_knee_load).",
		[]string{LabelSLO}, nil)
	breachForecastDesc = prometheus.NewDesc("tokentap_slo_breach_forecast_seconds",
		"This instance's breach forecast per SLO: the seconds until the load (the SLO's target-quantile of the loads its requests ran under, fitted by least squares over capacity.forecast_window) reaches the first load bucket proven to miss the target; 0: it is there now. Absent without a proven-missed bucket, without enough samples, without a rise proven at 95%, or beyond capacity.forecast_horizon.",
		[]string{LabelSLO}, nil)
	loadBoundDesc = prometheus.NewDesc("tokentap_slo_load_bucket_bound",
		"The upper bound of each load bucket, by its load label: the knee rules read it to turn the label into a number.",
		[]string{"load"}, nil)
)

func (k kneeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- kneeLoadDesc
	ch <- kneeEvidenceDesc
	ch <- loadBoundDesc
	ch <- breachForecastDesc
}

func (k kneeCollector) Collect(ch chan<- prometheus.Metric) {
	sc := k.sc
	for i := 0; i < sc.buckets.Len(); i++ {
		ch <- prometheus.MustNewConstMetric(loadBoundDesc, prometheus.GaugeValue, sc.buckets.Upper(i), sc.buckets.Label(i))
	}
	now := sc.book.clock()
	for i, o := range sc.book.cfg.Objectives {
		t := sc.windows[i].totals(now)
		curve := Curve(sc.buckets, t.offered, t.qualified, t.good, rateSpan(t.span.Seconds()), o.Target)
		knee := EstimateKnee(curve)
		if fc := sc.trends[i].forecast(now, knee, curve, sc.horizon); fc.Exported() {
			ch <- prometheus.MustNewConstMetric(breachForecastDesc, prometheus.GaugeValue, *fc.Seconds, o.Name)
		}
		if knee.State != KneeEstimate {
			continue
		}
		load := math.Inf(1)
		if knee.Load != nil {
			load = *knee.Load
		}
		ch <- prometheus.MustNewConstMetric(kneeLoadDesc, prometheus.GaugeValue, load, o.Name)
		ch <- prometheus.MustNewConstMetric(kneeEvidenceDesc, prometheus.GaugeValue, float64(knee.Evidence), o.Name)
	}
}

// plotCurve draws the attainment-vs-load curve as a small inline SVG:
// per bucket with requests, goodput as a pale bar (scaled to the
// highest, on the full height), the attainment as a dot with its 95%
// Wilson interval, the target as a dashed line and the knee as a green
// line at its bucket's upper bound.
func plotCurve(pts []LoadPoint, target float64, knee Knee) template.HTML {
	if len(pts) == 0 {
		return ""
	}
	const w, h, ml, mr, mt, mb = 560.0, 220.0, 44.0, 10.0, 12.0, 34.0
	pw, ph := w-ml-mr, h-mt-mb
	slot := pw / float64(len(pts))
	// The attainment axis runs from just under the lowest bound or the
	// target (a multiple of 10%) to 100%.
	lo := target
	for _, p := range pts {
		lo = math.Min(lo, p.AttainmentLower95)
	}
	lo = math.Max(0, math.Floor((lo-0.05)*10)/10)
	y := func(a float64) float64 { return mt + (1-a)/(1-lo)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="10" role="img" aria-label="attainment against load">`, w, h, w, h)
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#999"/>`, ml, mt, pw, ph)
	for _, a := range []float64{lo, (lo + 1) / 2, 1} {
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#eee"/><text x="%g" y="%.1f" text-anchor="end">%.0f%%</text>`, ml, y(a), ml+pw, y(a), ml-4, y(a)+3, a*100)
	}
	maxGood := 0.0
	for _, p := range pts {
		maxGood = math.Max(maxGood, p.GoodputTokensRate)
	}
	for i, p := range pts {
		x := ml + slot*(float64(i)+0.5)
		if maxGood > 0 && p.GoodputTokensRate > 0 {
			bh := p.GoodputTokensRate / maxGood * ph
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#dde8f5"><title>goodput %.4g tok/s</title></rect>`, x-slot*0.3, mt+ph-bh, slot*0.6, bh, p.GoodputTokensRate)
		}
		color := map[string]string{"meets": "#070", "missed": "#b00"}[p.State]
		if color == "" {
			color = "#777"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`, x, y(p.AttainmentUpper95), x, y(p.AttainmentLower95), color)
		if p.Attainment != nil {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>load %s: %d/%d, lower bound %.2f%%</title></circle>`,
				x, y(*p.Attainment), color, html.EscapeString(bucketRange(p)), p.Qualified, p.Offered, p.AttainmentLower95*100)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`, x, mt+ph+12, html.EscapeString(p.Bucket))
		if knee.State == KneeEstimate && p.Bucket == knee.Bucket {
			kx := ml + slot*float64(i+1)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#070" stroke-dasharray="2,2"/><text x="%.1f" y="%g" fill="#070">knee</text>`, kx, mt, kx, mt+ph, kx+2, mt+10)
		}
	}
	fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#b00" stroke-dasharray="5,3"/><text x="%g" y="%.1f" fill="#b00" text-anchor="end">target</text>`, ml, y(target), ml+pw, y(target), ml+pw-2, y(target)-3)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">load bucket (upper bound: requests in flight, time-weighted)</text></svg>`, ml+pw/2, h-4)
	return template.HTML(b.String()) // numbers and escaped labels only
}

func bucketRange(p LoadPoint) string {
	if p.To == nil {
		return fmt.Sprintf("> %g", p.From)
	}
	return fmt.Sprintf("(%g, %g]", p.From, *p.To)
}

func optNum(f *float64, unit string) string {
	if f == nil {
		return "–"
	}
	return fmtSig(*f) + unit
}

// fmtSig formats a figure to 4 significant digits, without exponent
// for everyday magnitudes.
func fmtSig(f float64) string {
	if f == 0 || (math.Abs(f) >= 1e-4 && math.Abs(f) < 1e7) {
		d := max(0, 3-int(math.Floor(math.Log10(math.Abs(f)+1e-300))))
		if f == 0 {
			d = 0
		}
		return fmtFloatDigits(f, d)
	}
	return fmt.Sprintf("%.4g", f)
}

func fmtFloatDigits(f float64, d int) string {
	s := fmt.Sprintf("%.*f", d, f)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func msOf(f *float64) string {
	if f == nil {
		return "–"
	}
	return fmtSig(*f*1000) + " ms"
}

// The scorecard section of /slo, a template associated with pageHTML
// (whose body calls it, and whose functions it shares).
var _ = template.Must(pageHTML.New("scorecards").Funcs(template.FuncMap{
	"opt":     optNum,
	"ms":      msOf,
	"sig":     fmtSig,
	"docs":    func(anchor string) string { return DocsURL + "#" + anchor },
	"brange":  bucketRange,
	"kneeMin": func() int { return KneeMinRequests },
	"whyDocs": func() string { return strings.TrimSuffix(DocsURL, "cost.md") + "measurement.md#6b-why-slow-causes" },
}).Parse(`<style>td.l{text-align:left}.not_proven,.too_few{color:#777}.meets{color:#070}</style>
{{range .SLOs}}{{$s := .}}{{with .Scorecard}}
<h2>Scorecard: {{$s.Name}}</h2>
<p>Over the same window as its row: the last {{sig .SpanSeconds}} s of its {{sig $s.WindowSeconds}} s window. Cost and energy are the replica's (its whole price, the energy of every request); goodput is this SLO's. Each figure links to its definition.</p>
<table class="card"><tr><th>figure</th><th>value</th><th style="text-align:left">over</th></tr>
<tr><td class="l"><a href="{{docs "goodput"}}">goodput</a></td><td>{{sig .GoodputTokensRate}} tok/s</td><td class="l">output tokens of the requests that qualified, per second</td></tr>
<tr><td class="l"><a href="{{docs "cost-per-million-goodput-tokens"}}">cost per 1M goodput tokens</a></td><td>{{if .PricePerHour}}{{opt .CostPerMillionGoodputTokens ""}} {{.Currency}}{{else}}no price declared{{end}}</td><td class="l">the replica's price ({{if .PricePerHour}}{{sig (deref .PricePerHour)}} {{.Currency}}/h{{else}}none{{end}}) over the window ÷ goodput tokens: <b>the figure to plan with</b></td></tr>
<tr><td class="l"><a href="{{docs "cost-per-million-output-tokens"}}">cost per 1M output tokens</a></td><td>{{if .PricePerHour}}{{opt .CostPerMillionOutputTokens ""}} {{.Currency}}{{else}}no price declared{{end}}</td><td class="l">the same cost ÷ every live output token ({{sig .OutputTokensRate}} tok/s), good or not</td></tr>
<tr><td class="l"><a href="{{docs "joules-per-output-token"}}">J per output token</a></td><td>{{if eq .Energy "off"}}energy off{{else}}{{opt .JoulesPerOutputToken " J"}} total, {{opt .DynamicJoulesPerOutputToken " J"}} dynamic{{end}}</td><td class="l">energy attributed to the requests (total; above the idle baseline) ÷ live output tokens</td></tr>
<tr><td class="l"><a href="{{docs "energy-share"}}">energy share per 1M goodput tokens</a></td><td>{{if eq .Energy "off"}}energy off{{else if .EnergyPricePerKWh}}{{opt .EnergyCostPerMillionGoodputTokens ""}} {{.Currency}}{{else}}no energy price declared{{end}}</td><td class="l">that energy at {{if .EnergyPricePerKWh}}{{sig (deref .EnergyPricePerKWh)}} {{.Currency}}/kWh{{else}}the kWh price{{end}} ÷ goodput tokens{{if .EnergyCostPerMillionOutputTokens}} ({{opt .EnergyCostPerMillionOutputTokens ""}} {{.Currency}} per 1M output tokens){{end}}</td></tr>
<tr><td class="l"><a href="{{docs "ttft-p99-and-itl-p99"}}">TTFT p99</a></td><td>{{ms .TTFTP99Seconds}}</td><td class="l">this SLO's streamed requests, one value each</td></tr>
<tr><td class="l"><a href="{{docs "ttft-p99-and-itl-p99"}}">ITL p99</a></td><td>{{ms .ITLP99Seconds}}</td><td class="l">every gap between token events of this SLO's requests</td></tr>
<tr><td class="l"><a href="{{whyDocs}}">missed, by cause</a></td><td class="l">{{range .MissedByCause}}{{if .What}}{{.What}} {{end}}{{.Cause}}: {{.Requests}}<br>{{else}}–{{end}}</td><td class="l">the requests that missed this SLO, once under each cause of a slow first token or stall they had (none: no slow event, e.g. an error or a slow TPOT without a stall)</td></tr>
<tr><td class="l"><a href="{{docs "attainment-and-its-bound"}}">attainment</a></td><td>{{if .Attainment}}{{pct (deref .Attainment)}}{{else}}–{{end}} (≥ {{pct .AttainmentLower95}})</td><td class="l">qualified ÷ offered; the one-sided 95% Wilson lower bound against the target {{pct .Target}}: <span class="{{.Verdict}}">{{.Verdict}}</span></td></tr>
<tr><td class="l"><a href="{{docs "the-knee"}}">knee</a></td><td>{{with .Knee}}{{if eq .State "estimate"}}load ≤ {{.Bucket}}{{else if eq .State "not_met"}}not met at any load{{else}}not enough evidence{{end}}{{end}}</td><td class="l">{{with .Knee}}{{if eq .State "estimate"}}the highest load bucket whose lower bound meets the target: {{.Evidence}} requests, lower bound {{pct .Lower95}}{{if .Missed}}; proven below target from bucket {{.Missed}}{{end}}{{else if eq .State "not_met"}}every load bucket with evidence is below target (from bucket {{.Missed}}; {{.Evidence}} requests){{else}}no load bucket has the evidence to meet the target yet ({{.Evidence}} requests in all){{end}}{{end}}</td></tr>
{{template "forecast" .Forecast}}
</table>
<h3>Attainment against load: {{$s.Name}}</h3>
{{if .Curve}}{{.Plot}}
<table><tr><th>load (in flight)</th><th>offered</th><th>qualified</th><th>attainment</th><th>95% bounds</th><th>state</th><th>goodput tok/s</th></tr>
{{range .Curve}}<tr><td>{{brange .}}</td><td>{{.Offered}}</td><td>{{.Qualified}}</td><td>{{if .Attainment}}{{pct (deref .Attainment)}}{{end}}</td><td>{{pct .AttainmentLower95}} – {{pct .AttainmentUpper95}}</td><td class="l {{.State}}">{{.State}}</td><td>{{sig .GoodputTokensRate}}</td></tr>
{{end}}</table>{{else}}<p>No request with a measured load in the window yet.</p>{{end}}
<p>Load: the time-weighted mean number of requests in flight through this sidecar during a request's life, itself included (<a href="{{docs "load"}}">definition</a>). meets: at least {{kneeMin}} requests and the lower bound at or above target; missed: the upper bound below target; too_few: under {{kneeMin}} requests.</p>
{{end}}{{end}}`))
