package slo

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/record"
)

// Judge wraps the next record.Observer: when a request ends it sets the
// record's classes, stall count and SLO verdicts, counts them, and then
// hands the record on. Per-event calls pass straight through.
//
// A Judge with no objectives still classifies requests and counts stalls.
type Judge struct {
	cfg     Config
	next    record.Observer
	clock   func() time.Time
	windows []*Window // parallel to cfg.Objectives

	offered, qualified, qualTokens *prometheus.CounterVec
	failures, excluded             *prometheus.CounterVec
	target                         *prometheus.GaugeVec
	fluidity                       *prometheus.HistogramVec
}

// Label names of the SLO and class metrics.
const (
	LabelSLO       = "slo"
	LabelThreshold = "threshold"
)

var fluidityBuckets = []float64{0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995, 1}

// NewJudge registers its metrics on reg and wraps next. cfg must be
// valid; its zero fields take their defaults.
func NewJudge(cfg Config, reg prometheus.Registerer, next record.Observer) *Judge {
	cfg = cfg.WithDefaults()
	if next == nil {
		next = record.Nop{}
	}
	j := &Judge{cfg: cfg, next: next, clock: time.Now}
	slo := []string{LabelSLO}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	hist := func(name, help string, b []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b,
			NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 160, NativeHistogramMinResetDuration: time.Hour}, labels)
	}
	j.offered = counter("tokentap_slo_requests_total", "Requests offered to each SLO: every request in its scope that arrived, errors, rejections, timeouts and (unless the SLO excludes them) cancellations included. The attainment denominator.", slo...)
	j.qualified = counter("tokentap_slo_qualified_requests_total", "Requests that qualified: outcome success and every applicable threshold met. The attainment numerator.", slo...)
	j.qualTokens = counter("tokentap_slo_qualified_output_tokens_total", "Output tokens of qualified requests: rate() of it is token goodput.", slo...)
	j.failures = counter("tokentap_slo_failures_total", "Offered requests that did not qualify, by reason: each failed threshold (ttft, ttfot, tpot, e2e, max_itl, fluidity, output_tokens) or the outcome (error, rejected, timeout, cancelled). A request failing two thresholds counts under both.", LabelSLO, LabelThreshold)
	j.excluded = counter("tokentap_slo_excluded_total", "Requests in scope left out of the denominator by the SLO's declared options (reason=cancelled when count_cancelled is false).", LabelSLO, "reason")
	j.target = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_slo_target", Help: "The declared attainment target of each SLO (the shipped alert rules read it)."}, slo)
	j.fluidity = hist("tokentap_fluidity_ratio", "Per-request deadline-based fluidity score (MEASUREMENT.md §6) under each SLO's schedule; streamed requests with tokens, in scope.", fluidityBuckets, slo...)
	reg.MustRegister(j.offered, j.qualified, j.qualTokens, j.failures, j.excluded, j.target, j.fluidity)
	for _, o := range cfg.Objectives {
		j.target.WithLabelValues(o.Name).Set(o.Target)
		j.offered.WithLabelValues(o.Name)
		j.qualified.WithLabelValues(o.Name)
		j.qualTokens.WithLabelValues(o.Name)
		j.windows = append(j.windows, NewWindow(o.Window, 60))
	}
	return j
}

// Config returns the effective configuration.
func (j *Judge) Config() Config { return j.cfg }

// Begin implements record.Observer.
func (j *Judge) Begin(k record.Key) record.Observation {
	return &judged{Observation: j.next.Begin(k), j: j}
}

type judged struct {
	record.Observation
	j *Judge
}

// End judges the record, counts the verdicts, then hands it on.
func (q *judged) End(r *record.Record) {
	q.j.judge(r)
	q.Observation.End(r)
}

func (j *Judge) judge(r *record.Record) {
	r.PromptClass = classify(r.InputTokens, j.cfg.PromptClasses)
	r.OutputClass = classify(r.OutputTokens, j.cfg.OutputClasses)
	r.Stalls = countStalls(r, j.cfg.StallThreshold)
	now := j.clock()
	for i := range j.cfg.Objectives {
		o := &j.cfg.Objectives[i]
		v, ok := o.Judge(r)
		if !ok {
			continue
		}
		r.SLO = append(r.SLO, v)
		if v.Excluded {
			j.excluded.WithLabelValues(o.Name, string(record.Cancelled)).Inc()
			continue
		}
		j.offered.WithLabelValues(o.Name).Inc()
		tokens := int64(0)
		if v.Qualified {
			j.qualified.WithLabelValues(o.Name).Inc()
			if r.OutputTokens > 0 {
				tokens = r.OutputTokens
				j.qualTokens.WithLabelValues(o.Name).Add(float64(tokens))
			}
		}
		for _, f := range v.Failed {
			j.failures.WithLabelValues(o.Name, f).Inc()
		}
		if v.Fluidity != nil {
			j.fluidity.WithLabelValues(o.Name).Observe(*v.Fluidity)
		}
		j.windows[i].Add(now, v, tokens)
	}
}

// Window is a sliding window of verdict counts, in slots: the view of one
// instance, for the /slo page. Safe for concurrent use; touched once per
// request, never per token.
type Window struct {
	mu    sync.Mutex
	slot  time.Duration
	slots []slotCounts
}

type slotCounts struct {
	start              time.Time
	offered, qualified int64
	tokens             int64
	failures           map[string]int64
}

// NewWindow returns a window of length d in n slots.
func NewWindow(d time.Duration, n int) *Window {
	return &Window{slot: d / time.Duration(n), slots: make([]slotCounts, n)}
}

// Add counts a verdict at time now.
func (w *Window) Add(now time.Time, v record.Verdict, qualifiedTokens int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := now.Truncate(w.slot)
	s := &w.slots[int(start.UnixNano()/int64(w.slot))%len(w.slots)]
	if !s.start.Equal(start) {
		*s = slotCounts{start: start}
	}
	s.offered++
	if v.Qualified {
		s.qualified++
		s.tokens += qualifiedTokens
	}
	for _, f := range v.Failed {
		if s.failures == nil {
			s.failures = map[string]int64{}
		}
		s.failures[f]++
	}
}

// Totals sums the slots within the window ending at now; span is the
// time the sum covers.
func (w *Window) Totals(now time.Time) (offered, qualified, tokens int64, failures map[string]int64, span time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	failures = map[string]int64{}
	length := w.slot * time.Duration(len(w.slots))
	oldest := now
	for _, s := range w.slots {
		if s.start.IsZero() || now.Sub(s.start) >= length {
			continue
		}
		offered += s.offered
		qualified += s.qualified
		tokens += s.tokens
		for k, v := range s.failures {
			failures[k] += v
		}
		if s.start.Before(oldest) {
			oldest = s.start
		}
	}
	return offered, qualified, tokens, failures, now.Sub(oldest)
}
