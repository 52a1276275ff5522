package config

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// APIs are the values of a record's api field, as stream describes them
// (stream.APIs).
var APIs = func() []string {
	var as []string
	for _, a := range stream.APIs() {
		as = append(as, string(a.Name))
	}
	return as
}()

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
	APIs          []string `yaml:"apis"`    // the record's api values (APIs)
	Traffic       []string `yaml:"traffic"` // live, canary, replay; empty means live only (tokentap replay judges replay as live: docs/capture.md)
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
	// Structure "required" makes a request whose answer fails a
	// structure check (tool-call arguments, JSON output: docs/slo.md,
	// "Structure") not qualified, the checks named in its verdict's
	// failed list. "" (the zero value) does not look at structure.
	Structure string `yaml:"structure"`
}

// StructureRequired is the value of Objective.Structure that makes the
// structure checks part of the SLO.
const StructureRequired = "required"

// StructureChecks reports whether some objective requires the
// structure checks: only then does the proxy run them.
func (c SLO) StructureChecks() bool {
	for _, o := range c.Objectives {
		if o.Structure == StructureRequired {
			return true
		}
	}
	return false
}

// Class is one request class: requests with a token count up to Max
// (inclusive); Max 0 means no upper bound (the last class).
type Class struct {
	Name string `yaml:"name"`
	Max  int64  `yaml:"max"`
}

// SLO is the slo section: the declared objectives, the request classes
// and the stall threshold (docs/slo.md).
//
// The zero value declares no objective; WithDefaults gives the stall
// threshold and the classes their defaults.
type SLO struct {
	Objectives []Objective `yaml:"objectives"`
	// StallThreshold: a gap between token events above it is a stall.
	// Zero means 1s.
	StallThreshold time.Duration `yaml:"stall_threshold"`
	// SlowTTFT is the first token's threshold for the slow-request
	// causes (docs/measurement.md §6b) of a request that no objective
	// with a ttft threshold judges; zero: such a first token is never
	// slow.
	SlowTTFT time.Duration `yaml:"slow_ttft"`
	// PromptClasses and OutputClasses bucket requests by input and output
	// tokens, in increasing Max; empty means DefaultPromptClasses and
	// DefaultOutputClasses.
	PromptClasses []Class `yaml:"prompt_classes"`
	OutputClasses []Class `yaml:"output_classes"`
}

// DefaultPromptClasses returns the default prompt classes: short chat
// turns, RAG-sized prompts, long contexts. Each call returns a new slice.
func DefaultPromptClasses() []Class {
	return []Class{{"short", 512}, {"medium", 4096}, {"long", 0}}
}

// DefaultOutputClasses returns the default output classes. Each call
// returns a new slice.
func DefaultOutputClasses() []Class {
	return []Class{{"short", 128}, {"medium", 1024}, {"long", 0}}
}

// ClassUnknown labels a request whose token count is unknown.
const ClassUnknown = "unknown"

// WithDefaults fills the zero fields.
func (c SLO) WithDefaults() SLO {
	if c.StallThreshold <= 0 {
		c.StallThreshold = time.Second
	}
	if len(c.PromptClasses) == 0 {
		c.PromptClasses = DefaultPromptClasses()
	}
	if len(c.OutputClasses) == 0 {
		c.OutputClasses = DefaultOutputClasses()
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

// MaxSLOs bounds slo.objectives. Every SLO costs on every request: a
// verdict in each record (about 70 bytes), its share of the
// end-of-request work, its series on /metrics (counters by threshold,
// model and load bucket) and its rows on /slo. 10,000 SLOs held each
// response's last bytes 2.2-2.8 s, made records of 690 KB and /metrics
// of 70,000 series; 64 keeps those to a few kilobytes per record and
// microseconds per request, and is more objectives than a dashboard can
// show (the probes' cap is 16, the classes' 8).
const MaxSLOs = 64

// MaxScopeValues bounds each list of an SLO's scope: they are matched
// against every request.
const MaxScopeValues = 100

// Validate returns one error per problem, naming the SLO and the field.
// Past MaxSLOs, it says so once and checks only the first MaxSLOs.
func (c SLO) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	objectives := c.Objectives
	if len(objectives) > MaxSLOs {
		bad("slo.objectives: at most %d SLOs, got %d (each one costs on every request: records, /metrics, /slo)", MaxSLOs, len(objectives))
		objectives = objectives[:MaxSLOs]
	}
	seen := map[string]bool{}
	for i, o := range objectives {
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
		}{{"ttft", t.TTFT}, {"ttfot", t.TTFOT}, {"tpot", t.TPOT}, {"e2e", t.E2E}, {"max_itl", t.MaxITL}} {
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
		if o.Structure != "" && o.Structure != StructureRequired {
			bad("slo %s: structure must be %q or absent, got %q", name, StructureRequired, o.Structure)
		}
		if t.MinOutputTokens < 0 {
			bad("slo %s: thresholds.min_output_tokens must not be negative", name)
		}
		if t == (Thresholds{}) {
			bad("slo %s: thresholds: at least one is required", name)
		}
		for _, l := range []struct {
			n string
			v []string
		}{{"models", o.Scope.Models}, {"apis", o.Scope.APIs}, {"traffic", o.Scope.Traffic},
			{"prompt_classes", o.Scope.PromptClasses}, {"output_classes", o.Scope.OutputClasses}} {
			if len(l.v) > MaxScopeValues {
				bad("slo %s: scope.%s: at most %d values, got %d", name, l.n, MaxScopeValues, len(l.v))
			}
		}
		for _, a := range o.Scope.APIs {
			if !slices.Contains(APIs, a) {
				bad("slo %s: scope.apis: unknown api %q", name, a)
			}
		}
		for _, tr := range o.Scope.Traffic {
			if tr != "live" && tr != "canary" && tr != "replay" {
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
	if c.SlowTTFT < 0 {
		bad("slo.slow_ttft must not be negative")
	}
	if c.StallThreshold < 0 {
		bad("slo.stall_threshold must not be negative")
	}
	return errs
}
