// Package slo judges every finished request against the declared service
// level objectives (MEASUREMENT.md §5 and §6): a verdict per request,
// counters from which Prometheus computes attainment and goodput for any
// set of sidecars, request classes, smoothness (stalls, fluidity), the
// Wilson bound, and this instance's own sliding-window view for /slo.
package slo

import (
	"fmt"
	"math"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Threshold names, a bounded set used as the "threshold" label. The
// outcome names (error, rejected, timeout, cancelled) are reasons too.
const (
	TTFT         = "ttft"
	TTFOT        = "ttfot"
	TPOT         = "tpot"
	E2E          = "e2e"
	MaxITL       = "max_itl"
	Fluidity     = "fluidity"
	OutputTokens = "output_tokens"
)

// Reasons lists every failure reason, thresholds then outcomes.
var Reasons = []string{TTFT, TTFOT, TPOT, E2E, MaxITL, Fluidity, OutputTokens,
	string(record.Error), string(record.Rejected), string(record.Timeout), string(record.Cancelled)}

// Thresholds are an SLO's limits. A zero field is not part of the SLO.
type Thresholds struct {
	TTFT            time.Duration `yaml:"ttft"`
	TTFOT           time.Duration `yaml:"ttfot"`
	TPOT            time.Duration `yaml:"tpot"`
	E2E             time.Duration `yaml:"e2e"`
	MaxITL          time.Duration `yaml:"max_itl"`
	Fluidity        float64       `yaml:"fluidity"`          // minimum score in (0,1]
	MinOutputTokens int64         `yaml:"min_output_tokens"` // minimum count
}

// FluiditySchedule is the deadline schedule of the fluidity score: the
// first token is due Deadline after arrival, each next one Cadence later.
type FluiditySchedule struct {
	Deadline time.Duration `yaml:"deadline"`
	Cadence  time.Duration `yaml:"cadence"`
}

// Scope selects the requests an SLO applies to. An empty list matches all.
type Scope struct {
	Models        []string `yaml:"models"`
	APIs          []string `yaml:"apis"`    // chat, completions, other
	Traffic       []string `yaml:"traffic"` // live, canary; empty means live only
	PromptClasses []string `yaml:"prompt_classes"`
	OutputClasses []string `yaml:"output_classes"`
}

// Objective is one declared SLO.
type Objective struct {
	Name       string           `yaml:"name"`
	Target     float64          `yaml:"target"` // attainment target, e.g. 0.95
	Window     time.Duration    `yaml:"window"` // /slo sliding window; 0 means 1h
	Scope      Scope            `yaml:"scope"`
	Thresholds Thresholds       `yaml:"thresholds"`
	Fluidity   FluiditySchedule `yaml:"fluidity"`
	// CountCancelled keeps client cancellations in the denominator as
	// failures (the default, nil). false excludes them, and they are
	// counted in tokentap_slo_excluded_total instead: never dropped.
	CountCancelled *bool `yaml:"count_cancelled"`
}

// Class is one request class: requests with a token count up to Max
// (inclusive); Max 0 means no upper bound (the last class).
type Class struct {
	Name string `yaml:"name"`
	Max  int64  `yaml:"max"`
}

// Config is the slo section of the sidecar's configuration.
type Config struct {
	Objectives []Objective `yaml:"objectives"`
	// StallThreshold: a gap between token events above it is a stall.
	// Zero means 1s.
	StallThreshold time.Duration `yaml:"stall_threshold"`
	// PromptClasses and OutputClasses bucket requests by input and output
	// tokens, in increasing Max; empty means DefaultPromptClasses and
	// DefaultOutputClasses.
	PromptClasses []Class `yaml:"prompt_classes"`
	OutputClasses []Class `yaml:"output_classes"`
}

// Default classes: short chat turns, RAG-sized prompts, long contexts.
var (
	DefaultPromptClasses = []Class{{"short", 512}, {"medium", 4096}, {"long", 0}}
	DefaultOutputClasses = []Class{{"short", 128}, {"medium", 1024}, {"long", 0}}
)

// ClassUnknown labels a request whose token count is unknown.
const ClassUnknown = "unknown"

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.StallThreshold <= 0 {
		c.StallThreshold = time.Second
	}
	if len(c.PromptClasses) == 0 {
		c.PromptClasses = DefaultPromptClasses
	}
	if len(c.OutputClasses) == 0 {
		c.OutputClasses = DefaultOutputClasses
	}
	for i := range c.Objectives {
		if c.Objectives[i].Window <= 0 {
			c.Objectives[i].Window = time.Hour
		}
		if len(c.Objectives[i].Scope.Traffic) == 0 {
			c.Objectives[i].Scope.Traffic = []string{"live"}
		}
	}
	return c
}

// Validate returns one error per problem, naming the SLO and the field.
func (c Config) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	seen := map[string]bool{}
	for i, o := range c.Objectives {
		name := o.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
			bad("slo %s: name is required", name)
		} else if seen[name] {
			bad("slo %s: name is used twice", name)
		}
		seen[name] = true
		if len(name) > 64 {
			bad("slo %s: name longer than 64 bytes", name)
		}
		if !(o.Target > 0 && o.Target < 1) {
			bad("slo %s: target must be in (0,1), got %v", name, o.Target)
		}
		if o.Window < 0 {
			bad("slo %s: window must not be negative", name)
		}
		t := o.Thresholds
		for _, d := range []struct {
			n string
			v time.Duration
		}{{TTFT, t.TTFT}, {TTFOT, t.TTFOT}, {TPOT, t.TPOT}, {E2E, t.E2E}, {MaxITL, t.MaxITL}} {
			if d.v < 0 {
				bad("slo %s: thresholds.%s must not be negative", name, d.n)
			}
		}
		if t.Fluidity < 0 || t.Fluidity > 1 || math.IsNaN(t.Fluidity) {
			bad("slo %s: thresholds.fluidity must be in [0,1], got %v", name, t.Fluidity)
		}
		if t.Fluidity > 0 && (o.Fluidity.Deadline <= 0 || o.Fluidity.Cadence <= 0) {
			bad("slo %s: thresholds.fluidity needs fluidity.deadline and fluidity.cadence", name)
		}
		if t.MinOutputTokens < 0 {
			bad("slo %s: thresholds.min_output_tokens must not be negative", name)
		}
		if t == (Thresholds{}) {
			bad("slo %s: thresholds: at least one is required", name)
		}
		for _, a := range o.Scope.APIs {
			if a != "chat" && a != "completions" && a != "other" {
				bad("slo %s: scope.apis: unknown api %q", name, a)
			}
		}
		for _, tr := range o.Scope.Traffic {
			if tr != "live" && tr != "canary" {
				bad("slo %s: scope.traffic: unknown traffic %q", name, tr)
			}
		}
		check := func(field string, names []string, classes []Class) {
			for _, n := range names {
				found := n == ClassUnknown
				for _, c := range classes {
					found = found || c.Name == n
				}
				if !found {
					bad("slo %s: scope.%s: no class named %q", name, field, n)
				}
			}
		}
		check("prompt_classes", o.Scope.PromptClasses, c.PromptClasses)
		check("output_classes", o.Scope.OutputClasses, c.OutputClasses)
	}
	for _, cl := range []struct {
		n  string
		cs []Class
	}{{"prompt_classes", c.PromptClasses}, {"output_classes", c.OutputClasses}} {
		for i, k := range cl.cs {
			if k.Name == "" || k.Name == ClassUnknown {
				bad("slo.%s[%d]: a name other than %q is required", cl.n, i, ClassUnknown)
			}
			last := i == len(cl.cs)-1
			if !last && (k.Max <= 0 || (i > 0 && k.Max <= cl.cs[i-1].Max)) {
				bad("slo.%s[%d] %s: max must be positive and increasing", cl.n, i, k.Name)
			}
		}
		if len(cl.cs) > 8 {
			bad("slo.%s: at most 8 classes (they are labels)", cl.n)
		}
	}
	if c.StallThreshold < 0 {
		bad("slo.stall_threshold must not be negative")
	}
	return errs
}

// classify returns the class of a token count (unknown for n < 0).
func classify(n int64, classes []Class) string {
	if n < 0 {
		return ClassUnknown
	}
	for _, c := range classes {
		if c.Max == 0 || n <= c.Max {
			return c.Name
		}
	}
	return classes[len(classes)-1].Name
}

func contains(list []string, v string) bool {
	if len(list) == 0 {
		return true
	}
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (o *Objective) inScope(r *record.Record) bool {
	s := &o.Scope
	return contains(s.Models, r.Model) && contains(s.APIs, string(r.API)) && contains(s.Traffic, r.Traffic) &&
		contains(s.PromptClasses, r.PromptClass) && contains(s.OutputClasses, r.OutputClass)
}

func (o *Objective) countCancelled() bool { return o.CountCancelled == nil || *o.CountCancelled }

// Judge returns the verdict of objective o on a finished record, or ok
// false when the request is out of its scope. Smoothness fields of the
// record (MaxGap, Stalls) must be set already.
func (o *Objective) Judge(r *record.Record) (v record.Verdict, ok bool) {
	if !o.inScope(r) {
		return v, false
	}
	v.Name = o.Name
	if r.Outcome != record.Success {
		if r.Outcome == record.Cancelled && !o.countCancelled() {
			v.Excluded = true
			return v, true
		}
		v.Failed = []string{string(r.Outcome)}
		return v, true
	}
	t := &o.Thresholds
	streamed := r.Stream && r.TokenEvents() > 0
	dur := func(name string, limit time.Duration, d time.Duration, defined bool) {
		if limit <= 0 {
			return
		}
		switch {
		case !defined:
			v.NotApplicable = append(v.NotApplicable, name)
		case d > limit:
			v.Failed = append(v.Failed, name)
		}
	}
	d, ok1 := r.TTFT()
	dur(TTFT, t.TTFT, d, ok1 && r.Stream)
	d, ok1 = r.TTFOT()
	dur(TTFOT, t.TTFOT, d, ok1 && r.Stream)
	d, ok1 = r.TPOT()
	dur(TPOT, t.TPOT, d, ok1 && r.Stream)
	d, ok1 = r.E2E()
	dur(E2E, t.E2E, d, ok1)
	dur(MaxITL, t.MaxITL, r.MaxGap, streamed && r.TokenEvents() >= 2)
	if t.Fluidity > 0 {
		if !streamed {
			v.NotApplicable = append(v.NotApplicable, Fluidity)
		} else {
			f := FluidityScore(r, o.Fluidity)
			v.Fluidity = &f
			if f < t.Fluidity {
				v.Failed = append(v.Failed, Fluidity)
			}
		}
	}
	if t.MinOutputTokens > 0 {
		switch {
		case r.OutputTokens < 0:
			v.NotApplicable = append(v.NotApplicable, OutputTokens)
		case r.OutputTokens < t.MinOutputTokens:
			v.Failed = append(v.Failed, OutputTokens)
		}
	}
	v.Qualified = len(v.Failed) == 0
	return v, true
}
