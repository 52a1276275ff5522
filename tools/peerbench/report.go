package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// summary is a cell's figures (µs, s, MiB).
type summary struct {
	evs, errs       float64
	p50, p99        float64 // per-event delay, µs
	cpu             float64 // s in the window
	cpuPerEv        float64 // µs per event
	rss             float64 // MiB at the end of the window
	side, sidePerEv float64 // telemetry receivers' CPU, s and µs per event
	hasEvents       bool
	// refP99 is the p99 delay of the reference streams run beside the
	// cell's (load.RefStreams), µs; hasRef says there were some.
	refP99 float64
	hasRef bool
}

func summarize(c cell, window time.Duration) summary {
	s := summary{evs: float64(c.res.Events) / window.Seconds(), errs: float64(c.res.Errors),
		p50: us(c.res.P(.5)), p99: us(c.res.P(.99)), cpu: c.cpu.Seconds(), rss: float64(c.rssKiB) / 1024,
		side: c.side.Seconds(), hasEvents: c.res.Events > 0}
	if len(c.res.RefDelays) > 0 {
		s.refP99, s.hasRef = us(c.res.quantile(c.res.RefDelays, .99)), true
	}
	if c.res.Events > 0 {
		s.cpuPerEv = float64(c.cpu.Nanoseconds()) / 1e3 / float64(c.res.Events)
		s.sidePerEv = float64(c.side.Nanoseconds()) / 1e3 / float64(c.res.Events)
	}
	return s
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianCell stands for the per-figure medians of runs (printTable).
func medianCell(runs []cell) cell { return cell{medianOf: runs} }

func printTable(w io.Writer, title string, targets []*target, cells []cell, window time.Duration) {
	sums := make([]summary, len(cells))
	for i, c := range cells {
		if c.medianOf != nil {
			sums[i] = medianSummary(c.medianOf, window)
		} else {
			sums[i] = summarize(c, window)
		}
	}
	direct := -1
	for i, t := range targets {
		if t.name == "direct" {
			direct = i
		}
	}
	fmt.Fprintf(w, "\n%s\n\n", title)
	fmt.Fprintln(w, "| path | events/s | errors | p50 delay µs | p99 µs | added p50 µs | added p99 µs | CPU s | CPU µs/event | RSS MiB |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for i, t := range targets {
		s := sums[i]
		added50, added99 := "–", "–"
		if direct >= 0 && i != direct && s.hasEvents {
			added50 = fmt.Sprintf("%.0f", s.p50-sums[direct].p50)
			added99 = fmt.Sprintf("%.0f", s.p99-sums[direct].p99)
		}
		cpu, per, rss := "–", "–", "–"
		if t.launch != nil {
			cpu, per, rss = fmt.Sprintf("%.2f", s.cpu), fmt.Sprintf("%.1f", s.cpuPerEv), fmt.Sprintf("%.1f", s.rss)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s |\n",
			t.name, s.evs, s.errs, s.p50, s.p99, added50, added99, cpu, per, rss)
	}
	for i, t := range targets {
		if c := cells[i]; c.medianOf == nil && c.res.WarmErrors > 0 {
			fmt.Fprintf(w, "\n(%s: %d failed streams in the warm-up, not counted)\n", t.name, c.res.WarmErrors)
		}
	}
	for i, t := range targets {
		if c := cells[i]; c.polled {
			p := c.polls
			fmt.Fprintf(w, "\n(%s's live page, polled as a browser: %d answers of /live/data (%d unchanged), %d busy, %d errors, %.0f KiB read)\n",
				t.name, p.Polls, p.Unchanged, p.Busy, p.Errors, float64(p.Bytes)/1024)
		}
	}
	for i, t := range targets {
		if t.name == "tokentap" && sums[i].side > 0 {
			fmt.Fprintf(w, "\n(telemetry receivers, not counted above: %.2f s CPU, %.1f µs/event during tokentap's window)\n", sums[i].side, sums[i].sidePerEv)
		}
	}
}

func medianSummary(runs []cell, window time.Duration) summary {
	var ss []summary
	for _, c := range runs {
		ss = append(ss, summarize(c, window))
	}
	field := func(get func(summary) float64) float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, get(s))
		}
		return median(xs)
	}
	return summary{
		evs:       field(func(s summary) float64 { return s.evs }),
		errs:      field(func(s summary) float64 { return s.errs }),
		p50:       field(func(s summary) float64 { return s.p50 }),
		p99:       field(func(s summary) float64 { return s.p99 }),
		cpu:       field(func(s summary) float64 { return s.cpu }),
		cpuPerEv:  field(func(s summary) float64 { return s.cpuPerEv }),
		rss:       field(func(s summary) float64 { return s.rss }),
		side:      field(func(s summary) float64 { return s.side }),
		sidePerEv: field(func(s summary) float64 { return s.sidePerEv }),
		hasEvents: true,
	}
}

// printRatios prints the goals' ratios, each computed within a run and
// then the median over runs.
func printRatios(w io.Writer, streams int, targets []*target, cells [][][]cell, si int, window time.Duration) {
	idx := map[string]int{}
	for i, t := range targets {
		idx[t.name] = i
	}
	tt, ok := idx["tokentap"]
	if !ok {
		return
	}
	type ratio struct {
		name string
		f    func(s []summary) (float64, bool)
		// parts, when set, gives the ratio's numerator and denominator,
		// for the ratio of their medians too: a run whose denominator
		// is not positive (nginx added nothing over direct at p99, in
		// the noise) has no ratio of its own.
		parts func(s []summary) (num, den float64, ok bool)
	}
	get := func(s []summary, name string) (summary, bool) {
		i, ok := idx[name]
		if !ok || !s[i].hasEvents {
			return summary{}, false
		}
		return s[i], true
	}
	added := func(s []summary, name string, p99 bool) (float64, bool) {
		d, ok1 := get(s, "direct")
		x, ok2 := get(s, name)
		if !ok1 || !ok2 {
			return 0, false
		}
		if p99 {
			return x.p99 - d.p99, true
		}
		return x.p50 - d.p50, true
	}
	div := func(a, b float64, ok bool) (float64, bool) {
		if !ok || b <= 0 {
			return 0, false
		}
		return a / b, true
	}
	ratios := []ratio{
		{name: "CPU per event, tokentap / bare Go (goal ≤ 1.1)", f: func(s []summary) (float64, bool) {
			b, ok := get(s, "bare")
			return div(s[tt].cpuPerEv, b.cpuPerEv, ok)
		}},
		{name: "CPU per event, tokentap-nethttp / bare Go (net/http's path, --event-loop=false)", f: func(s []summary) (float64, bool) {
			b, ok1 := get(s, "bare")
			e, ok2 := get(s, "tokentap-nethttp")
			return div(e.cpuPerEv, b.cpuPerEv, ok1 && ok2)
		}},
		{name: "CPU per event, event loop / bare Go (the next I/O path, relay alone)", f: func(s []summary) (float64, bool) {
			b, ok1 := get(s, "bare")
			l, ok2 := get(s, "loop")
			return div(l.cpuPerEv, b.cpuPerEv, ok1 && ok2)
		}},
		{name: "CPU per event, tokentap / nginx (moonshot ≤ 1)", f: func(s []summary) (float64, bool) {
			n, ok := get(s, "nginx")
			return div(s[tt].cpuPerEv, n.cpuPerEv, ok)
		}},
		{name: "added p50 delay, tokentap / nginx (goal ≤ 1)", parts: func(s []summary) (float64, float64, bool) {
			a, ok1 := added(s, "tokentap", false)
			n, ok2 := added(s, "nginx", false)
			return a, n, ok1 && ok2
		}},
		{name: "added p99 delay, tokentap / nginx (goal ≤ 1)", parts: func(s []summary) (float64, float64, bool) {
			a, ok1 := added(s, "tokentap", true)
			n, ok2 := added(s, "nginx", true)
			return a, n, ok1 && ok2
		}},
		{name: "OTLP's cost, tokentap − tokentap-nootlp, CPU µs per event", f: func(s []summary) (float64, bool) {
			n, ok := get(s, "tokentap-nootlp")
			return s[tt].cpuPerEv - n.cpuPerEv, ok
		}},
		{name: "CPU per event, tokentap / tokentap-base", f: func(s []summary) (float64, bool) {
			b, ok := get(s, "tokentap-base")
			return div(s[tt].cpuPerEv, b.cpuPerEv, ok)
		}},
	}
	fmt.Fprintf(w, "\nratios at %d streams (per run; median)\n\n", streams)
	for _, r := range ratios {
		if r.parts != nil {
			parts := r.parts
			r.f = func(s []summary) (float64, bool) {
				a, b, ok := parts(s)
				return div(a, b, ok)
			}
		}
		var vals, nums, dens []float64
		var strs []string
		for run := range cells {
			var ss []summary
			for _, c := range cells[run][si] {
				ss = append(ss, summarize(c, window))
			}
			if v, ok := r.f(ss); ok {
				vals = append(vals, v)
				strs = append(strs, fmt.Sprintf("%.2f", v))
			}
			if r.parts != nil {
				if a, b, ok := r.parts(ss); ok {
					nums, dens = append(nums, a), append(dens, b)
				}
			}
		}
		line := ""
		if len(vals) > 0 {
			line = fmt.Sprintf("%s; median %.2f", strings.Join(strs, ", "), median(vals))
		}
		if len(nums) > 0 {
			if line != "" {
				line += "; "
			}
			line += fmt.Sprintf("medians %.0f / %.0f µs", median(nums), median(dens))
			if d := median(dens); d > 0 {
				line += fmt.Sprintf(" = %.2f", median(nums)/d)
			}
		}
		if line != "" {
			fmt.Fprintf(w, "- %s: %s\n", r.name, line)
		}
	}
}

func printMemory(w io.Writer, streams int, interval time.Duration, rows []memRow) {
	fmt.Fprintf(w, "\nmemory: %d streams in flight (events %s apart), fresh processes\n\n", streams, interval)
	fmt.Fprintln(w, "| path | events/s | errors | idle RSS MiB | peak RSS MiB | KiB per stream (peak − idle) | KiB per stream (peak) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		win := r.res.Window.Seconds()
		if win <= 0 {
			win = 1
		}
		fmt.Fprintf(w, "| %s | %.0f | %d | %.1f | %.1f | %.1f | %.1f |\n", r.name, float64(r.res.Events)/win, r.res.Errors,
			float64(r.idle)/1024, float64(r.peak)/1024, float64(r.peak-r.idle)/float64(streams), float64(r.peak)/float64(streams))
	}
}
