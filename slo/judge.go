package slo

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/internal/page"
	"github.com/tokentap/tokentap/record"
)

// Judge judges finished records. Its Verdict is a pure function of the
// record and the configuration: it counts nothing; Apply (the pipeline's
// stage 3) copies it into the record, and the metric backends count it
// (docs/measurement.md §5).
//
// A Judge with no objectives still classifies requests and counts stalls.
type Judge struct {
	cfg Config
}

// NewJudge returns a judge for cfg, which must be valid; its zero fields
// take their defaults.
func NewJudge(cfg Config) *Judge { return &Judge{cfg: cfg.WithDefaults()} }

// Config returns the effective configuration.
func (j *Judge) Config() Config { return j.cfg }

// StallThreshold returns the gap above which a gap is a stall.
func (j *Judge) StallThreshold() time.Duration { return j.cfg.StallThreshold }

// Apply writes r's verdict into it: its classes, stalls and SLO
// verdicts.
func (j *Judge) Apply(r *record.Record) {
	v := j.Judge(r)
	r.PromptClass, r.OutputClass, r.Stalls, r.SLO = v.PromptClass, v.OutputClass, v.Stalls, v.SLO
}

// Verdict is everything judging one record gives.
type Verdict struct {
	// PromptClass and OutputClass are the request classes by input and
	// output tokens ("unknown" when the count is unknown).
	PromptClass, OutputClass string
	// Stalls counts gaps above the stall threshold.
	Stalls int
	// SLO holds one verdict per objective whose scope the request is in.
	SLO []record.Verdict
}

// Judge returns the verdict on a finished record; it does not modify r.
func (j *Judge) Judge(r *record.Record) Verdict {
	v := Verdict{
		PromptClass: classify(r.InputTokens, j.cfg.PromptClasses),
		OutputClass: classify(r.OutputTokens, j.cfg.OutputClasses),
		Stalls:      countStalls(r, j.cfg.StallThreshold),
	}
	for i := range j.cfg.Objectives {
		if ov, ok := evaluate(&j.cfg.Objectives[i], r, v.PromptClass, v.OutputClass); ok {
			v.SLO = append(v.SLO, ov)
		}
	}
	return v
}

// Book is this instance's own view of its SLOs: a sliding window of
// verdict counts per objective, served as /slo, and the declared targets
// as gauges (the shipped alert rules read them). Add is called once per
// request, never per token.
type Book struct {
	cfg     Config
	clock   func() time.Time
	windows []*Window // parallel to cfg.Objectives

	// tenants holds, parallel to cfg.Objectives, a window per tenant
	// label (docs/slo.md, per tenant): as many as the label has values,
	// max_tenants + 2 at most. Empty while no record has a tenant.
	mu      sync.Mutex
	tenants []map[string]*Window
}

// NewBook registers the target gauges on reg (nil: none) and returns an
// empty book for cfg's objectives (cfg must be valid).
func NewBook(cfg Config, reg prometheus.Registerer) *Book {
	cfg = cfg.WithDefaults()
	b := &Book{cfg: cfg, clock: time.Now}
	target := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_slo_target",
		Help: "The declared attainment target of each SLO (the shipped alert rules read it)."}, []string{LabelSLO})
	for _, o := range cfg.Objectives {
		target.WithLabelValues(o.Name).Set(o.Target)
		b.windows = append(b.windows, NewWindow(o.Window, 60))
		b.tenants = append(b.tenants, map[string]*Window{})
	}
	if reg != nil {
		reg.MustRegister(target)
	}
	return b
}

// LabelSLO names the SLO label of the metrics this package registers.
const LabelSLO = "slo"

// Add counts a finished record's verdicts (those not excluded).
func (b *Book) Add(r *record.Record) {
	now := b.clock()
	for _, v := range r.SLO {
		if v.Excluded {
			continue
		}
		for i := range b.cfg.Objectives {
			if b.cfg.Objectives[i].Name != v.Name {
				continue
			}
			tokens := int64(0)
			if v.Qualified && r.OutputTokens > 0 {
				tokens = r.OutputTokens
			}
			b.windows[i].Add(now, v, tokens)
			if r.Tenant != "" {
				b.tenantWindow(i, r.Tenant).Add(now, v, tokens)
			}
		}
	}
}

// tenantWindow returns objective i's window of tenant label t, made on
// first use.
func (b *Book) tenantWindow(i int, t string) *Window {
	b.mu.Lock()
	defer b.mu.Unlock()
	w, ok := b.tenants[i][t]
	if !ok {
		w = NewWindow(b.cfg.Objectives[i].Window, 60)
		b.tenants[i][t] = w
	}
	return w
}

// tenantWindows returns objective i's tenant labels and their windows,
// by label.
func (b *Book) tenantWindows(i int) (names []string, ws []*Window) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for t := range b.tenants[i] {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		ws = append(ws, b.tenants[i][t])
	}
	return names, ws
}

// ServeHTTP serves /slo: HTML for browsers, JSON for ?format=json or an
// Accept header that prefers application/json.
func (b *Book) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	page.Serve(w, r, b.Status(b.clock()), pageHTML)
}

// Window is a sliding window of verdict counts, in slots: the view of one
// instance, for the /slo page. Safe for concurrent use; touched once per
// request, never per token.
type Window struct{ w sliding[verdictCounts] }

type verdictCounts struct {
	offered, qualified int64
	tokens             int64
	fastInvalid        int64 // failed on structure checks alone (FastInvalid)
	failures           map[string]int64
}

// NewWindow returns a window of length d in n slots.
func NewWindow(d time.Duration, n int) *Window {
	w := &Window{}
	w.w.init(d, n)
	return w
}

// Add counts a verdict at time now.
func (w *Window) Add(now time.Time, v record.Verdict, qualifiedTokens int64) {
	w.w.add(now, func(s *verdictCounts) {
		s.offered++
		if v.Qualified {
			s.qualified++
			s.tokens += qualifiedTokens
		}
		if FastInvalid(&v) {
			s.fastInvalid++
		}
		for _, f := range v.Failed {
			if s.failures == nil {
				s.failures = map[string]int64{}
			}
			s.failures[f]++
		}
	})
}

// Totals sums the slots within the window ending at now; span is the
// time the sum covers: from the first verdict counted to now.
func (w *Window) Totals(now time.Time) (offered, qualified, tokens int64, failures map[string]int64, span time.Duration) {
	failures = map[string]int64{}
	span = w.w.sum(now, func(s *verdictCounts) {
		offered += s.offered
		qualified += s.qualified
		tokens += s.tokens
		for k, v := range s.failures {
			failures[k] += v
		}
	})
	return offered, qualified, tokens, failures, span
}

// FastInvalid is the number of verdicts within the window ending at now
// that failed on structure checks alone (FastInvalid): fast answers that
// do not hold.
func (w *Window) FastInvalid(now time.Time) int64 {
	var n int64
	w.w.sum(now, func(s *verdictCounts) { n += s.fastInvalid })
	return n
}
