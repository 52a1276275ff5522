// Package slo judges every finished request against the declared service
// level objectives (docs/measurement.md §5 and §6): a verdict per request,
// counters from which Prometheus computes attainment and goodput for any
// set of sidecars, request classes, smoothness (stalls, fluidity), the
// Wilson bound, and this instance's own sliding-window view for /slo.
package slo

import (
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/structure"
)

// Threshold names, a bounded set used as the "threshold" label. The
// outcome names (error, rejected, timeout, cancelled, no_answer) are
// reasons too.
const (
	TTFT         = "ttft"
	TTFOT        = "ttfot"
	TPOT         = "tpot"
	E2E          = "e2e"
	MaxITL       = "max_itl"
	Fluidity     = "fluidity"
	OutputTokens = "output_tokens"
)

// The section types live in package config (config is a leaf: it
// imports no feature package); these names keep this package's code and
// tests short.
type (
	Config           = config.SLO
	Objective        = config.Objective
	Thresholds       = config.Thresholds
	Scope            = config.Scope
	Class            = config.Class
	FluiditySchedule = config.FluiditySchedule
)

// ClassUnknown labels a request whose token count is unknown.
const ClassUnknown = config.ClassUnknown

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

func inScope(o *Objective, r *record.Record, promptClass, outputClass string) bool {
	s := &o.Scope
	return contains(s.Models, r.Model) && contains(s.APIs, string(r.API)) && contains(s.Traffic, r.Traffic) &&
		contains(s.PromptClasses, promptClass) && contains(s.OutputClasses, outputClass)
}

func countCancelled(o *Objective) bool { return o.CountCancelled == nil || *o.CountCancelled }

// Evaluate returns the verdict of objective o on a finished record, or ok
// false when the request is out of its scope. It reads the record's
// classes as they are set (Judge.Judge computes them first); it writes
// nothing.
func Evaluate(o *Objective, r *record.Record) (v record.Verdict, ok bool) {
	return evaluate(o, r, r.PromptClass, r.OutputClass)
}

func evaluate(o *Objective, r *record.Record, promptClass, outputClass string) (v record.Verdict, ok bool) {
	if !inScope(o, r, promptClass, outputClass) {
		return v, false
	}
	v.Name = o.Name
	if r.Outcome != record.Success {
		if r.Outcome == record.Cancelled && !countCancelled(o) {
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
	d, ok1 = r.MaxITL() // the worst choice's for n > 1, as TPOT is
	dur(MaxITL, t.MaxITL, d, ok1 && streamed)
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
	if o.Structure == config.StructureRequired {
		switch r.Structure {
		case "fail":
			v.Failed = append(v.Failed, r.StructureFailed...)
		case "unchecked":
			v.NotApplicable = append(v.NotApplicable, Structure)
		}
	}
	v.Qualified = len(v.Failed) == 0
	return v, true
}

// Structure names the structure checks in a verdict's not_applicable
// list when the answer could not be checked (record.Record.Structure
// "unchecked"); the checks that failed are named by their own names
// (package structure) in its failed list.
const Structure = "structure"

// FastInvalid reports whether a verdict failed on structure checks
// alone (structure.FastInvalid): a success on time whose answer does not
// hold (docs/slo.md, "Structure").
func FastInvalid(v *record.Verdict) bool {
	return !v.Qualified && !v.Excluded && structure.FastInvalid(v.Failed)
}
