package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The capacity mode: each path's event rate at which the added p99
// delay first exceeds a limit (5 ms), found by a stepped load in one
// run. The rate is raised by adding streams at the same event interval
// (20 ms): an operator's traffic grows by more concurrent users, not by
// faster tokens, and a stream's request and end work stay in the same
// proportion to its events (one request per 200 events) at every step.
// At each step the direct path is measured too (its events/s tell when
// the client and the upstream no longer keep up). A path's added p99 is
// judged against direct streams run at the same time: beside the S
// streams through the path, the client keeps a tenth as many (at least
// 10) straight to the upstream, and the path's p99 minus theirs, over
// the same window on the same machine, is what its hop added. On the
// shared 2-core machine direct's own p99 moves by 5-10 ms between one
// window and the next (the neighbours' builds), so the difference of two
// windows taken one after the other cannot resolve 5 ms; it is printed
// too. With -ref 0 the search judges by it.

// capacitySearch finds each path's capacity. It measures direct and
// every path still under the limit at each step, in a rotated order;
// a path over the limit is measured again once, with direct (recheck),
// so that one window's scheduling spike on a shared machine does not
// end its search; a path over the limit twice is done, its capacity
// the step before. The search stops when every path is done, when
// direct falls behind (the client and the upstream no longer keep up:
// added delays past that point measure the machine, not the proxy:
// fellBehind), or when the next step would pass the time budget.
type capacitySearch struct {
	steps   []int    // stream counts, ascending
	paths   []string // the paths other than direct
	limit   float64  // µs of added p99
	recheck bool
	// offered is the event rate the client asks for at s streams.
	offered func(streams int) float64
	// measure runs the client through path at streams for one window.
	measure func(streams int, path string) summary
	// stepTime and budget bound the search in time: a step of n
	// measurements takes about n × stepTime; none starts that would end
	// past budget after the first. Zero budget: no bound.
	stepTime, budget time.Duration
	now              func() time.Time
	// progress, when set, receives each step's rows as they are found.
	progress func(rows []capRow)
}

// capRow is one measurement of a path at a step.
type capRow struct {
	streams int
	path    string
	s       summary
	// added is the judged added p99, µs (addedP99); seqAdded the p99
	// over direct's own window at the step.
	added, seqAdded float64
	over            bool
	// rechecked: this row is the second measurement of the path at the
	// step (the first was over the limit).
	rechecked bool
	note      string
}

// capResult is a path's capacity: the last step under the limit.
type capResult struct {
	path string
	// last is the index in steps of the last step under the limit; -1:
	// over it at the first step.
	last int
	at   capRow // the row at last
	// exceeded: the path went over the limit at step overAt; false: the
	// search stopped first, and last is a lower bound.
	exceeded bool
	overAt   int
}

// addedP99 is what a path added at p99, µs: over its reference
// streams, run at the same time, when it had some; else over direct's
// window at the step.
func addedP99(p, direct summary) float64 {
	if p.hasRef {
		return p.p99 - p.refP99
	}
	return p.p99 - direct.p99
}

// overLimit reports whether a path's step is over: no events, fewer
// than 80% of direct's (it falls behind), or an added p99 over limit.
func overLimit(p, direct summary, limit float64) bool {
	return !p.hasEvents || p.evs < 0.8*direct.evs || addedP99(p, direct) > limit
}

// fellBehind says why direct at a step shows the client and the
// upstream falling behind, or "": no events; at the first step (no
// rate per stream kept yet), less than 75% of the offered rate; later,
// less than 90% of the step's streams at the best rate per stream
// direct kept at an earlier step. On a loaded machine the upstream's
// timers run late and every stream is a little slower than offered,
// at every step alike: only a drop from step to step is falling behind.
func fellBehind(direct summary, streams int, offered, perStream float64) string {
	switch {
	case !direct.hasEvents:
		return "direct carried no event"
	case perStream == 0 && direct.evs < 0.75*offered:
		return fmt.Sprintf("direct delivered %.0f of the %.0f events/s offered", direct.evs, offered)
	case perStream > 0 && direct.evs < 0.9*perStream*float64(streams):
		return fmt.Sprintf("direct delivered %.0f events/s, %.0f%% of its rate per stream at the steps before", direct.evs, 100*direct.evs/(perStream*float64(streams)))
	}
	return ""
}

// row is a path's row at a step.
func row(streams int, path string, p, direct summary, limit float64) capRow {
	return capRow{streams: streams, path: path, s: p, added: addedP99(p, direct), seqAdded: p.p99 - direct.p99, over: overLimit(p, direct, limit)}
}

// run measures step by step; it returns every row, each path's result
// (in c.paths' order) and why the search stopped early ("" when it ran
// until every path was done or the steps ended).
func (c capacitySearch) run() (rows []capRow, results []*capResult, stopped string) {
	res := map[string]*capResult{}
	active := slices.Clone(c.paths)
	for _, p := range c.paths {
		r := &capResult{path: p, last: -1}
		res[p] = r
		results = append(results, r)
	}
	var start time.Time
	if c.now != nil {
		start = c.now()
	}
	perStream := 0.0 // the best events/s per stream direct kept at a step
	for k, st := range c.steps {
		if len(active) == 0 {
			break
		}
		if c.budget > 0 && c.now != nil && k > 0 {
			if need := time.Duration(len(active)+1) * c.stepTime; c.now().Sub(start)+need > c.budget {
				stopped = fmt.Sprintf("the time budget (%s) would pass at %d streams", c.budget, st)
				break
			}
		}
		// direct, then the paths, rotated from step to step.
		order := append([]string{"direct"}, active...)
		rot := k % len(order)
		order = append(order[rot:], order[:rot]...)
		got := map[string]summary{}
		for _, p := range order {
			got[p] = c.measure(st, p)
		}
		d := got["direct"]
		var step []capRow
		step = append(step, capRow{streams: st, path: "direct", s: d, added: addedP99(d, d)})
		if why := fellBehind(d, st, c.offered(st), perStream); why != "" {
			stopped = fmt.Sprintf("at %d streams %s: the client and the upstream no longer keep up", st, why)
			for _, p := range active {
				r := row(st, p, got[p], d, c.limit)
				r.over, r.note = false, "not judged: direct fell behind"
				step = append(step, r)
			}
			rows = append(rows, step...)
			if c.progress != nil {
				c.progress(step)
			}
			break
		}
		perStream = max(perStream, d.evs/float64(st))
		var still []string
		for _, p := range active {
			rw := row(st, p, got[p], d, c.limit)
			if rw.over && c.recheck {
				rw.note = "over: measured again"
				step = append(step, rw)
				d2 := c.measure(st, "direct")
				p2 := c.measure(st, p)
				step = append(step, capRow{streams: st, path: "direct", s: d2, added: addedP99(d2, d2), rechecked: true})
				rw = row(st, p, p2, d2, c.limit)
				rw.rechecked = true
			}
			step = append(step, rw)
			r := res[p]
			if rw.over {
				r.exceeded, r.overAt = true, k
				continue
			}
			r.last, r.at = k, rw
			still = append(still, p)
		}
		active = still
		rows = append(rows, step...)
		if c.progress != nil {
			c.progress(step)
		}
	}
	return rows, results, stopped
}

type capFlags struct {
	runFlags
	steps   []int
	limit   time.Duration
	recheck bool
	budget  time.Duration
	ref     int
}

func parseCapacity(args []string) (capFlags, error) {
	var f capFlags
	fs := flag.NewFlagSet("capacity", flag.ContinueOnError)
	fs.StringVar(&f.sidecar, "sidecar", "", "the sidecar binary (cmd/sidecar)")
	steps := fs.String("steps", "25,50,100,150,200,300,400,600,800,1000", "stream counts of the steps, ascending (each stream: -events events -interval apart)")
	fs.DurationVar(&f.duration, "duration", 6*time.Second, "measuring window of each step")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "warm-up before each window")
	fs.DurationVar(&f.limit, "limit", 5*time.Millisecond, "the added p99 delay a path's capacity stays within")
	fs.BoolVar(&f.recheck, "recheck", true, "measure a path over the limit again once before its search ends")
	fs.DurationVar(&f.budget, "budget", 8*time.Minute, "no step starts that would end the search past this (0: no bound)")
	fs.IntVar(&f.ref, "ref", 10, "reference streams straight to the upstream beside each step's, in percent of its streams (at least 10 streams), whose p99 the added p99 is judged against; 0: none (judged against direct's own window at the step)")
	peersFlag := fs.String("peers", "nginx", "peers to run when installed")
	workloadFlags(fs, &f.runFlags)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	errs := f.checkWorkload()
	if f.sidecar == "" {
		errs = append(errs, errors.New("-sidecar is required"))
	}
	prev := 0
	for _, s := range strings.Split(*steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= prev {
			errs = append(errs, fmt.Errorf("-steps: %q is not a stream count above the step before", s))
			continue
		}
		f.steps, prev = append(f.steps, n), n
	}
	if f.limit <= 0 || f.budget < 0 || f.ref < 0 {
		errs = append(errs, errors.New("-limit must be positive, -budget and -ref not negative"))
	}
	f.runs = 1
	f.peers = nameSet(*peersFlag)
	f.only = map[string]bool{"direct": true, "bare": true, "tokentap": true}
	for p := range f.peers {
		f.only[p] = true
	}
	return f, errors.Join(errs...)
}

// capacityCmd runs the stepped load and prints each step and the
// capacities.
func capacityCmd(args []string) error {
	f, err := parseCapacity(args)
	if err != nil {
		return err
	}
	b, err := newBench(f.runFlags)
	if err != nil {
		return err
	}
	defer b.close()
	if f.ref > 0 {
		b.refStreams = func(s int) int { return max(10, s*f.ref/100) }
	}
	perStream := float64(f.events) / (upstreamFirst + time.Duration(f.events-1)*f.interval).Seconds()
	fmt.Printf("# capacity: steps of %v streams, each %d events %s apart (%.1f events/s a stream); window %s after %s warm-up; limit: added p99 %s; budget %s; work folder %s\n",
		f.steps, f.events, f.interval, perStream, f.duration, f.warmup, f.limit, f.budget, f.dir)
	if f.ref > 0 {
		fmt.Printf("# added p99 judged over reference streams straight to the upstream in the same window: %d%% of the step's streams, at least 10\n", f.ref)
	} else {
		fmt.Println("# added p99 judged over direct's own window at the step")
	}
	b.printSetup()
	byName := map[string]*target{}
	var paths []string
	for _, t := range b.targets {
		byName[t.name] = t
		if t.name != "direct" {
			paths = append(paths, t.name)
		}
	}
	bad := false
	cs := capacitySearch{
		steps: f.steps, paths: paths, limit: float64(f.limit) / 1e3, recheck: f.recheck,
		offered:  func(s int) float64 { return float64(s) * perStream },
		stepTime: f.warmup + f.duration + time.Second, budget: f.budget, now: time.Now,
		measure: func(s int, path string) summary {
			t := byName[path]
			if err := t.up(); err != nil { // restarted if it died
				fmt.Fprintln(os.Stderr, "peerbench:", err)
				bad = true
				return summary{}
			}
			c := b.measure(t, s, "")
			time.Sleep(500 * time.Millisecond) // let the connections close
			if c.res.Errors > 0 || c.res.Events == 0 {
				fmt.Printf("# WARNING: %d streams, %s: %d errors %v, %d events\n", s, path, c.res.Errors, c.res.ErrKinds, c.res.Events)
				bad = bad || strict(path, c.res)
			}
			if c.polled && (c.polls.Polls == 0 || c.polls.Errors > 0) {
				fmt.Printf("# WARNING: %d streams, %s: the live page answered %d polls, %d errors (%s)\n", s, path, c.polls.Polls, c.polls.Errors, c.polls.FirstErr)
				bad = true
			}
			return summarize(c, f.duration)
		},
	}
	fmt.Println()
	fmt.Println(capHeader)
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	cs.progress = func(rows []capRow) {
		for _, r := range rows {
			printCapRow(os.Stdout, r, cs.offered(r.streams), f.duration, cs.limit)
		}
	}
	_, results, stopped := cs.run()
	if stopped != "" {
		fmt.Printf("\n(stopped: %s)\n", stopped)
	}
	printCapacity(os.Stdout, f.steps, results, f.limit, f.duration)
	if b.finish() {
		bad = true
	}
	if bad {
		return errors.New("some target had errors or no events, or its audit found a problem (see above)")
	}
	return nil
}

// upstreamFirst is the upstream's delay before a stream's first event
// (its -first default, which the run does not change).
const upstreamFirst = 50 * time.Millisecond

const capHeader = "| streams | offered events/s | path | events/s | errors | p99 delay µs | reference p99 µs | added p99 µs | added over direct's window µs | CPU µs/event | proxy cores used | note |"

func printCapRow(w io.Writer, r capRow, offered float64, window time.Duration, limit float64) {
	ref, added, seq, cpu, cores := "–", "–", "–", "–", "–"
	if r.s.hasRef {
		ref, added = fmt.Sprintf("%.0f", r.s.refP99), fmt.Sprintf("%.0f", r.added)
	}
	if r.path != "direct" {
		added, seq = fmt.Sprintf("%.0f", r.added), fmt.Sprintf("%.0f", r.seqAdded)
		if r.s.cpu > 0 {
			cpu = fmt.Sprintf("%.1f", r.s.cpuPerEv)
			cores = fmt.Sprintf("%.2f", r.s.cpu/window.Seconds())
		}
	}
	note := r.note
	if note == "" && r.path != "direct" {
		note = "under"
		if r.over {
			note = fmt.Sprintf("over %.0f ms", limit/1e3)
		}
	}
	if r.rechecked {
		note = strings.TrimSuffix("again: "+note, ": ")
	}
	fmt.Fprintf(w, "| %d | %.0f | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s |\n",
		r.streams, offered, r.path, r.s.evs, r.s.errs, r.s.p99, ref, added, seq, cpu, cores, note)
}

// printCapacity prints each path's capacity, its CPU per event there,
// and the sizing rule that follows: events/s per core of the proxy and
// the CPU request per 1,000 events/s.
func printCapacity(w io.Writer, steps []int, results []*capResult, limit, window time.Duration) {
	fmt.Fprintf(w, "\ncapacity: the highest step before the added p99 delay first exceeds %s\n\n", limit)
	fmt.Fprintln(w, "| path | capacity events/s | at streams | added p99 µs there | CPU µs/event there | proxy cores used | events/s per proxy core | CPU request per 1,000 events/s | first over the limit at |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		over := "not reached (a lower bound)"
		if r.exceeded {
			over = fmt.Sprintf("%d streams", steps[r.overAt])
		}
		if r.last < 0 {
			rate := "below the first step"
			if !r.exceeded {
				rate = "no step judged"
			}
			fmt.Fprintf(w, "| %s | %s | – | – | – | – | – | – | %s |\n", r.path, rate, over)
			continue
		}
		s := r.at.s
		rate := fmt.Sprintf("%.0f", s.evs)
		if !r.exceeded {
			rate = "≥ " + rate
		}
		perCore, cores, request := "–", "–", "–"
		if s.cpu > 0 {
			used := s.cpu / window.Seconds()
			cores = fmt.Sprintf("%.2f", used)
			perCore = fmt.Sprintf("%.0f", s.evs/used)
			// CPU µs per event × 1,000 events/s = ms of CPU per s:
			// millicores.
			request = fmt.Sprintf("%.0f m", s.cpuPerEv)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.1f | %s | %s | %s | %s |\n",
			r.path, rate, steps[r.last], r.at.added, s.cpuPerEv, cores, perCore, request, over)
	}
}
