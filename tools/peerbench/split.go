package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// splitCmd splits the CPU of proxies under the same load into where it
// goes, per event, from `perf script -F ip,sym,dso` of a `perf record
// -g -F HZ` of each (scripts/peers.sh --perf; docs/performance.md,
// "Where each microsecond per event goes"): each argument is
// NAME=FILE:EVENTS, the events the proxy carried while perf sampled it.
// It prints a markdown table, a column per proxy, rows by part, in
// microseconds of CPU per event.
func splitCmd(args []string) error {
	fs := flag.NewFlagSet("split", flag.ExitOnError)
	hz := fs.Float64("hz", 1999, "perf record's sampling frequency (-F)")
	fs.Parse(args)
	if fs.NArg() == 0 {
		return fmt.Errorf("split: no NAME=FILE:EVENTS given")
	}
	var (
		names []string
		cols  []map[string]float64
		seen  = map[string]bool{}
		order []string
	)
	for _, a := range fs.Args() {
		name, rest, ok1 := strings.Cut(a, "=")
		file, evs, ok2 := strings.Cut(rest, ":")
		events, err := strconv.ParseFloat(evs, 64)
		if !ok1 || !ok2 || err != nil || events <= 0 {
			return fmt.Errorf("split: %q is not NAME=FILE:EVENTS with EVENTS > 0", a)
		}
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		counts, err := splitSamples(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("split: %s: %w", file, err)
		}
		col := map[string]float64{}
		for _, p := range parts {
			if n := counts[p]; n > 0 {
				col[p] = float64(n) / *hz / events * 1e6
				if !seen[p] {
					seen[p] = true
					order = append(order, p)
				}
			}
		}
		names, cols = append(names, name), append(cols, col)
	}
	fmt.Print(splitTable(names, cols, order))
	return nil
}

// The parts a sample is put in, in the order of the table.
const (
	partKernel  = "kernel: system calls, TCP, scheduling"
	partGo      = "net/http, ReverseProxy and the Go runtime"
	partGC      = "the Go runtime: GC"
	partTap     = "the tap, per event: framing, parsing, token instants, forward delay"
	partEnd     = "the request's end and the sidecar's own goroutines: metrics, OTLP, SLO, capture, live page, probe"
	partRecords = "the records file's writer"
	partLoop    = "the event loop (--event-loop): its waits on Go's poller, read(2) and write(2), chunked framing"
	partStart   = "the request's start: peek, routing, tenant, record"
)

var parts = []string{partKernel, partGo, partGC, partTap, partEnd, partRecords, partLoop, partStart}

const ours = "github.com/tokentap/tokentap/"

// classify puts one sample, its stack from the leaf up (symbol, object),
// in a part: the kernel's when the leaf is in the kernel; GC's under a GC
// worker; Go's own when the first frame of the sidecar's code from the
// leaf only wraps net/http's I/O (the tap's Read around the upstream
// read, the connection limit's wrapper); then by whose work it is, the
// tap's (any frame of it: the histogram and live-page observations it
// makes per event count as its own), the records writer's, the end of
// the request's, the rest of the sidecar's (the request's start); Go's
// own when none of the sidecar's code is on the stack.
func classify(stack [][2]string) string {
	if len(stack) == 0 {
		return partGo
	}
	if strings.HasPrefix(stack[0][1], "[kernel") {
		return partKernel
	}
	first := ""
	for i, fr := range stack {
		sym := fr[0]
		if strings.Contains(sym, "gcBgMarkWorker") || strings.Contains(sym, "bgsweep") || strings.Contains(sym, "bgscavenge") {
			return partGC
		}
		f, ok := strings.CutPrefix(sym, ours)
		if !ok || first != "" {
			continue
		}
		leaf := i == 0
		switch {
		case !leaf && (f == "proxy.(*Proxy).ServeHTTP" || strings.HasPrefix(f, "proxy.onOwnStack")):
			continue // the handler's frame: what it calls decides
		case strings.HasPrefix(f, "record.(*Record)"), strings.HasPrefix(f, "record.(*SystemClock)"):
			continue // a record's helper: its caller's work
		case !leaf && (f == "proxy.(*tap).Read" || f == "proxy.(*tap).readStrip"),
			strings.HasPrefix(f, "app.(*limitConn)"):
			return partGo // net/http's I/O, wrapped
		}
		first = f
	}
	if first == "" {
		return partGo
	}
	has := func(prefixes ...string) bool {
		for _, fr := range stack {
			for _, p := range prefixes {
				if strings.HasPrefix(fr[0], ours+p) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case has("proxy.(*tap)."):
		return partTap
	case has("record.(*File)", "record.openFile"):
		return partRecords
	case has("proxy.(*relay)", "proxy.rawIO", "internal/chunked."):
		return partLoop
	case has("proxy.(*Proxy).endStages", "proxy.(*Proxy).runCheck", "proxy.(*Proxy).end", "proxy.(*Proxy).finish",
		"proxy.(*Proxy).release", "pipeline.", "exporter.", "slo.", "cause.", "tracing.", "capture.", "prefix.",
		"live.", "structure.", "probe.", "app."):
		return partEnd
	}
	return partStart
}

// splitSamples counts the samples of `perf script -F ip,sym,dso` output
// by part: each sample a block of "ADDR SYMBOL (OBJECT)" lines, leaf
// first, blocks apart by an empty line.
func splitSamples(r io.Reader) (map[string]int, error) {
	counts := map[string]int{}
	var stack [][2]string
	flush := func() {
		if len(stack) > 0 {
			counts[classify(stack)]++
			stack = stack[:0]
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			flush()
			continue
		}
		_, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		sym, obj := rest, ""
		if i := strings.LastIndex(rest, " ("); i >= 0 && strings.HasSuffix(rest, ")") {
			sym, obj = rest[:i], rest[i+2:len(rest)-1]
		}
		stack = append(stack, [2]string{strings.TrimSpace(sym), obj})
	}
	flush()
	return counts, sc.Err()
}

// splitTable is the markdown table: a row per part in order, a column
// per proxy, the total, and each column's difference from the first.
func splitTable(names []string, cols []map[string]float64, order []string) string {
	var b strings.Builder
	b.WriteString("| µs of CPU per event |")
	for _, n := range names {
		b.WriteString(" " + n + " |")
	}
	for _, n := range names[1:] {
		b.WriteString(" " + n + " − " + names[0] + " |")
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", 2*len(names)-1))
	b.WriteString("\n")
	cell := func(v float64, ok bool) string {
		if !ok {
			return " – |"
		}
		return fmt.Sprintf(" %.2f |", v)
	}
	row := func(label string, get func(map[string]float64) (float64, bool)) {
		b.WriteString("| " + label + " |")
		for _, c := range cols {
			b.WriteString(cell(get(c)))
		}
		base, _ := get(cols[0])
		for _, c := range cols[1:] {
			v, _ := get(c)
			b.WriteString(fmt.Sprintf(" %+.2f |", v-base))
		}
		b.WriteString("\n")
	}
	for _, p := range order {
		row(p, func(c map[string]float64) (float64, bool) { v, ok := c[p]; return v, ok })
	}
	row("**all**", func(c map[string]float64) (float64, bool) {
		t := 0.0
		for _, v := range c {
			t += v
		}
		return t, true
	})
	return b.String()
}
