package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeSteps serves made-up step results: p99 µs by path and streams,
// a list per key for the measurements in turn (the last one repeats).
type fakeSteps struct {
	p99   map[string][]float64
	evs   map[string]float64 // events/s by "path@streams"; default: offered
	calls []string
}

func key(path string, streams int) string { return fmt.Sprintf("%s@%d", path, streams) }

func (f *fakeSteps) measure(streams int, path string) summary {
	k := key(path, streams)
	f.calls = append(f.calls, k)
	list, ok := f.p99[k]
	if !ok {
		panic("unexpected measurement " + k)
	}
	n := 0
	for _, c := range f.calls {
		if c == k {
			n++
		}
	}
	v := list[min(n, len(list))-1]
	evs := float64(streams) * 50
	if e, ok := f.evs[k]; ok {
		evs = e
	}
	return summary{evs: evs, p99: v, hasEvents: evs > 0, cpu: 1, cpuPerEv: 10}
}

// table builds fakeSteps from lines "path: p99@100 p99@200 ...", where a
// p99 may be "a/b" (first measurement, then the recheck's) and "-" means
// the path must not be measured at that step.
func table(steps []int, lines ...string) *fakeSteps {
	f := &fakeSteps{p99: map[string][]float64{}, evs: map[string]float64{}}
	for _, l := range lines {
		name, vals, _ := strings.Cut(l, ":")
		for i, v := range strings.Fields(vals) {
			if v == "-" {
				continue
			}
			var list []float64
			for _, x := range strings.Split(v, "/") {
				var p float64
				fmt.Sscan(x, &p)
				list = append(list, p)
			}
			f.p99[key(name, steps[i])] = list
		}
	}
	return f
}

func search(steps []int, f *fakeSteps, paths ...string) capacitySearch {
	return capacitySearch{steps: steps, paths: paths, limit: 5000, recheck: true,
		offered: func(s int) float64 { return float64(s) * 50 }, measure: f.measure}
}

func TestCapacityFirstStepOverTheLimit(t *testing.T) {
	steps := []int{100, 200, 300, 400}
	f := table(steps,
		"direct: 1000 1000 1200 1500",
		"bare:   2000 3000 7000/6500 -",
		"tokentap: 2500 7000/8000 - -",
		"nginx:  1500 2000 2500 3000",
	)
	_, res, stopped := search(steps, f, "bare", "tokentap", "nginx").run()
	if stopped != "" {
		t.Fatalf("stopped: %s", stopped)
	}
	want := map[string]struct {
		last, overAt int
		exceeded     bool
		added        float64
	}{
		"bare":     {1, 2, true, 2000},  // 3000 − 1000 at 200; 7000 − 1200 over at 300, 6500 − 1200 again
		"tokentap": {0, 1, true, 1500},  // over at 200 twice: its capacity is the first step
		"nginx":    {3, 0, false, 1500}, // never over: a lower bound at the last step
	}
	for _, r := range res {
		w := want[r.path]
		if r.last != w.last || r.exceeded != w.exceeded || (w.exceeded && r.overAt != w.overAt) || r.at.added != w.added {
			t.Errorf("%s: last %d exceeded %v overAt %d added %.0f; want %+v", r.path, r.last, r.exceeded, r.overAt, r.at.added, w)
		}
	}
	// A path over the limit is measured again with direct, then never.
	if n := count(f.calls, "direct@200"); n != 2 {
		t.Errorf("direct measured %d times at 200 streams, want 2 (the recheck's)", n)
	}
	for _, c := range f.calls {
		if c == "tokentap@300" || c == "tokentap@400" || c == "bare@400" {
			t.Errorf("%s measured after the path went over the limit", c)
		}
	}
	// direct is measured at every step.
	for _, s := range steps {
		if count(f.calls, key("direct", s)) == 0 {
			t.Errorf("direct not measured at %d streams", s)
		}
	}
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

func TestCapacityRecheckOutlastsASpike(t *testing.T) {
	steps := []int{100, 200, 300}
	f := table(steps,
		"direct: 1000 1000/1100 1000",
		"tokentap: 2000 9000/3000 8000/7000",
	)
	rows, res, _ := search(steps, f, "tokentap").run()
	r := res[0]
	if r.last != 1 || !r.exceeded || r.overAt != 2 || r.at.added != 1900 || !r.at.rechecked {
		t.Fatalf("got last %d exceeded %v overAt %d added %.0f rechecked %v; want the spike at 200 measured again (3000 − 1100), over at 300",
			r.last, r.exceeded, r.overAt, r.at.added, r.at.rechecked)
	}
	var notes []string
	for _, row := range rows {
		if row.path == "tokentap" {
			notes = append(notes, fmt.Sprintf("%d %v %v", row.streams, row.over, row.rechecked))
		}
	}
	want := []string{"100 false false", "200 true false", "200 false true", "300 true false", "300 true true"}
	if !slices.Equal(notes, want) {
		t.Errorf("tokentap's rows %q, want %q", notes, want)
	}

	// Without the recheck, the spike ends the search.
	f = table(steps, "direct: 1000 1000 1000", "tokentap: 2000 9000 -")
	s := search(steps, f, "tokentap")
	s.recheck = false
	_, res, _ = s.run()
	if r := res[0]; r.last != 0 || r.overAt != 1 {
		t.Errorf("no recheck: last %d overAt %d, want 0 and 1", r.last, r.overAt)
	}
}

func TestCapacityOverAtTheFirstStep(t *testing.T) {
	steps := []int{100, 200}
	f := table(steps, "direct: 1000 -", "bare: 7000/7000 -")
	_, res, _ := search(steps, f, "bare").run()
	if r := res[0]; r.last != -1 || !r.exceeded || r.overAt != 0 {
		t.Errorf("last %d exceeded %v overAt %d, want -1, true, 0", r.last, r.exceeded, r.overAt)
	}
}

func TestCapacityFallingBehindOrNoEventsIsOver(t *testing.T) {
	steps := []int{100, 200}
	f := table(steps, "direct: 1000 1000", "bare: 1000 1000/1000", "nginx: 1000 1000/1000")
	f.evs[key("bare", 200)] = 7500 // of direct's 10,000: behind
	f.evs[key("nginx", 200)] = 0   // nothing through it
	_, res, _ := search(steps, f, "bare", "nginx").run()
	for _, r := range res {
		if r.last != 0 || !r.exceeded || r.overAt != 1 {
			t.Errorf("%s: last %d exceeded %v overAt %d, want 0, true, 1", r.path, r.last, r.exceeded, r.overAt)
		}
	}
}

func TestCapacityStopsWhenDirectFallsBehind(t *testing.T) {
	steps := []int{100, 200, 300}
	f := table(steps, "direct: 1000 1000 -", "tokentap: 2000 9000 -")
	f.evs[key("direct", 200)] = 8000 // offered 10,000
	rows, res, stopped := search(steps, f, "tokentap").run()
	if !strings.Contains(stopped, "200 streams") || !strings.Contains(stopped, "8000 events/s, 80%") {
		t.Errorf("stopped %q, want direct's shortfall at 200 streams", stopped)
	}
	if r := res[0]; r.last != 0 || r.exceeded {
		t.Errorf("last %d exceeded %v: want a lower bound at the first step (the step where direct fell behind is not judged)", r.last, r.exceeded)
	}
	if last := rows[len(rows)-1]; last.path != "tokentap" || last.over || last.note == "" {
		t.Errorf("last row %+v: want tokentap's, not judged, with a note", last)
	}
}

func TestCapacityTimeBudget(t *testing.T) {
	steps := []int{100, 200, 300}
	f := table(steps, "direct: 1000 1000 1000", "bare: 2000 2000 2000", "tokentap: 2000 2000 2000")
	now := time.Unix(0, 0)
	s := search(steps, f, "bare", "tokentap")
	// Every measurement takes 10 s of the fake clock; a step of three
	// is 30 s; the budget holds two steps.
	s.now = func() time.Time { return now }
	s.measure = func(streams int, path string) summary {
		now = now.Add(10 * time.Second)
		return f.measure(streams, path)
	}
	s.stepTime, s.budget = 10*time.Second, 65*time.Second
	_, res, stopped := s.run()
	if !strings.Contains(stopped, "budget") || !strings.Contains(stopped, "300 streams") {
		t.Errorf("stopped %q, want the budget before 300 streams", stopped)
	}
	if n := count(f.calls, "direct@300"); n != 0 {
		t.Errorf("the step past the budget was measured")
	}
	for _, r := range res {
		if r.last != 1 || r.exceeded {
			t.Errorf("%s: last %d exceeded %v, want a lower bound at 200 streams", r.path, r.last, r.exceeded)
		}
	}
}

func TestParseCapacitySteps(t *testing.T) {
	if _, err := parseCapacity([]string{"-sidecar", "x", "-steps", "100,200,150"}); err == nil || !strings.Contains(err.Error(), "150") {
		t.Errorf("descending steps: err %v, want one naming 150", err)
	}
	f, err := parseCapacity([]string{"-sidecar", "x", "-steps", "5, 10"})
	if err != nil || !slices.Equal(f.steps, []int{5, 10}) || !f.only["direct"] || !f.only["nginx"] || f.only["tokentap-nootlp"] {
		t.Errorf("steps %v only %v err %v", f.steps, f.only, err)
	}
}

// TestCapacityJudgedOverTheReference: with reference streams beside a
// path's, its added p99 is over them, whatever direct's own window said.
func TestCapacityJudgedOverTheReference(t *testing.T) {
	steps := []int{100, 200}
	f := table(steps, "direct: 1000 9000", "tokentap: 2000 12000 -")
	ref := map[string]float64{key("tokentap", 100): 1500, key("tokentap", 200): 11000}
	s := search(steps, f, "tokentap")
	s.measure = func(streams int, path string) summary {
		m := f.measure(streams, path)
		if r, ok := ref[key(path, streams)]; ok {
			m.refP99, m.hasRef = r, true
		}
		return m
	}
	_, res, _ := s.run()
	if r := res[0]; r.last != 1 || r.exceeded || r.at.added != 1000 || r.at.seqAdded != 3000 {
		t.Errorf("last %d exceeded %v added %.0f over direct's window %.0f; want the last step, 12000 − 11000 and 12000 − 9000",
			r.last, r.exceeded, r.at.added, r.at.seqAdded)
	}
	// Over the reference by more than the limit: over, though direct's
	// window was worse still.
	ref[key("tokentap", 200)] = 6000
	f.calls = nil
	_, res, _ = s.run()
	if r := res[0]; !r.exceeded || r.overAt != 1 {
		t.Errorf("12000 over a reference of 6000: exceeded %v overAt %d; want over at 200 streams", r.exceeded, r.overAt)
	}
}

func TestFellBehind(t *testing.T) {
	d := summary{evs: 4000, hasEvents: true}
	for _, c := range []struct {
		streams            int
		offered, perStream float64
		want               string
	}{
		{100, 5000, 0, ""},                    // the first step: 80% of offered, the timers' slop
		{100, 6000, 0, "4000 of the 6000"},    // under 75%
		{100, 5000, 44, ""},                   // 91% of 100 streams at 44 a stream
		{100, 5000, 45, "4000 events/s, 89%"}, // under 90%
		{100, 5000, 40, ""},
	} {
		got := fellBehind(d, c.streams, c.offered, c.perStream)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%d streams, offered %.0f, %.0f a stream before: %q, want %q", c.streams, c.offered, c.perStream, got, c.want)
		}
	}
	if got := fellBehind(summary{}, 100, 5000, 50); got == "" {
		t.Error("no events: not behind")
	}
}
