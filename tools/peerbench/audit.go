package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// audit is what one sidecar process left in its files, read once it has
// stopped: every instrument of the run must have done its work, and the
// capture must hold one line per live request the records hold.
type audit struct {
	name string
	gen  int
	// records is the records file's lines, live those of live traffic
	// (not the canary's), captured the capture file's lines.
	records, live, captured int
	injected                int            // live records whose usage the sidecar injected
	tenants                 map[string]int // live records by tenant
	structure               map[string]int // live records by structure verdict (pass, fail, unchecked)
	err                     error          // a file could not be read
}

// auditFiles reads a sidecar's records and capture files.
func auditFiles(name string, gen int, records, capture string) audit {
	a := audit{name: name, gen: gen, tenants: map[string]int{}, structure: map[string]int{}}
	var errs []error
	if f, err := os.Open(records); err != nil {
		errs = append(errs, err)
	} else {
		dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<16))
		for {
			var r struct {
				Traffic       string `json:"traffic"`
				Tenant        string `json:"tenant"`
				Structure     string `json:"structure"`
				UsageInjected bool   `json:"usage_injected"`
			}
			if err := dec.Decode(&r); err != nil {
				if !errors.Is(err, io.EOF) {
					errs = append(errs, fmt.Errorf("%s: record %d: %w", records, a.records+1, err))
				}
				break
			}
			a.records++
			if r.Traffic != "live" {
				continue
			}
			a.live++
			a.tenants[r.Tenant]++
			if r.Structure != "" {
				a.structure[r.Structure]++
			}
			if r.UsageInjected {
				a.injected++
			}
		}
		f.Close()
	}
	if n, err := countLines(capture); err != nil {
		errs = append(errs, err)
	} else {
		a.captured = n
	}
	a.err = errors.Join(errs...)
	return a
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	buf := make([]byte, 1<<16)
	for {
		k, err := f.Read(buf)
		for _, c := range buf[:k] {
			if c == '\n' {
				n++
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// problems says what the audit found wrong: a file not read, a live
// request without its capture line (or a line too many), a tool call
// that failed its structure check (the upstream's calls fit their
// schema), no tool call checked (the sidecar's start sends one), no
// tenant from a key where keys were sent.
func (a audit) problems(keys bool) []string {
	var out []string
	if a.err != nil {
		out = append(out, a.err.Error())
	}
	if a.live != a.captured {
		out = append(out, fmt.Sprintf("%d live records but %d capture lines", a.live, a.captured))
	}
	if n := a.structure["fail"]; n > 0 {
		out = append(out, fmt.Sprintf("%d tool calls failed their structure check", n))
	}
	if a.structure["pass"] == 0 {
		out = append(out, "no tool call passed a structure check")
	}
	if keys {
		named := 0
		for t := range a.tenants {
			if strings.HasPrefix(t, "t-") {
				named++
			}
		}
		if named == 0 && a.live > a.tenants["_none"] {
			out = append(out, "requests carried API keys but no record has a tenant from one")
		}
	}
	return out
}

func (a audit) String() string {
	var ts []string
	for t, n := range a.tenants {
		ts = append(ts, fmt.Sprintf("%s %d", t, n))
	}
	slices.Sort(ts)
	var ss []string
	for s, n := range a.structure {
		ss = append(ss, fmt.Sprintf("%s %d", s, n))
	}
	slices.Sort(ss)
	return fmt.Sprintf("%s (process %d): %d records, %d live, %d capture lines, usage injected in %d; structure: %s; tenants: %s",
		a.name, a.gen, a.records, a.live, a.captured, a.injected, strings.Join(ss, ", "), strings.Join(ts, ", "))
}

// printAudits prints each sidecar process's audit and reports whether
// one found a problem.
func printAudits(w io.Writer, targets []*target, keys bool) (bad bool) {
	for _, t := range targets {
		for _, a := range t.audits {
			p := a.problems(keys)
			status := "ok"
			if len(p) > 0 {
				status = "PROBLEM: " + strings.Join(p, "; ")
				bad = true
			}
			fmt.Fprintf(w, "# audit: %s: %s\n", a, status)
		}
	}
	return bad
}
