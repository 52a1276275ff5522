package main

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// errChecksFailed is reportCmd's error when the run failed a check (exit 1;
// any other error is exit 2: the run's files could not be read).
var errChecksFailed = errors.New("a check failed")

// The files of a run's work directory that the report reads (written by
// scripts/soak.sh, the generator, the sampler and the sink).
const (
	fileSamples  = "samples.csv"
	fileRecords  = "records.jsonl"
	fileCapture  = "capture.jsonl"
	fileLoad     = "load.json"
	fileSampler  = "sampler.json"
	fileOTLP     = "otlp.json"
	fileMetrics  = "metrics.txt" // the last scrape of /metrics, after the load
	filePNG      = "soak.png"
	mib          = 1 << 20
	secondsPerHr = 3600
)

// limits are the acceptance bounds (issue 36): zero values are the
// strictest (nothing may grow, nothing may move).
type limits struct {
	RSSSlope   float64 // the RSS fit's most growth, bytes per hour
	FlatSlope  float64 // a flat series' most fitted change per hour, a share of its mean (either sign)
	FlatSpread float64 // a flat series' most max − min after the warm-up, a share of its mean
}

var defaultLimits = limits{RSSSlope: 1 * mib, FlatSlope: 0.01, FlatSpread: 0.10}

// loadSummary is what the generator writes with -summary.
type loadSummary struct {
	Streams        int     `json:"streams"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	Requests       int64   `json:"requests"` // finished: ok + errors
	OK             int64   `json:"ok"`
	Errors         int64   `json:"errors"`
	ToolRequests   int64   `json:"tool_requests"` // sent declaring a tool
	Events         int64   `json:"events"`
	Bytes          int64   `json:"bytes"`
}

func writeLoadSummary(path string, s loadSummary) error { return writeJSON(path, s) }

// fit is a least-squares line through (x, y): y ≈ Intercept + Slope·x,
// and SE the slope's standard error (from the residuals; 0 with fewer
// than three points). Fewer than two points, or all at one x, give a
// zero slope and the mean as the intercept.
type fit struct {
	Slope, Intercept, SE float64
}

func lsq(x, y []float64) fit {
	n := float64(len(x))
	if len(x) == 0 || len(x) != len(y) {
		return fit{}
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= n
	my /= n
	var sxy, sxx float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
	}
	if sxx == 0 {
		return fit{Intercept: my}
	}
	s := sxy / sxx
	f := fit{Slope: s, Intercept: my - s*mx}
	if len(x) > 2 {
		var rss float64
		for i := range x {
			r := y[i] - f.Intercept - s*x[i]
			rss += r * r
		}
		f.SE = math.Sqrt(rss / (n - 2) / sxx)
	}
	return f
}

// series is one sampled quantity over the window after the warm-up.
type series struct {
	Name           string
	N              int     // samples in the window
	PerHour        float64 // the fitted slope, units per hour
	SEPerHour      float64 // its standard error: the noise's share of it
	Mean, Min, Max float64
}

// summarize fits v(s) over the samples at or after warm seconds.
func summarize(name string, samples []sample, warm float64, v func(sample) float64) series {
	var x, y []float64
	st := series{Name: name, Min: math.Inf(1), Max: math.Inf(-1)}
	for _, s := range samples {
		if s.Elapsed < warm {
			continue
		}
		x = append(x, s.Elapsed)
		y = append(y, v(s))
		st.Mean += v(s)
		st.Min = min(st.Min, v(s))
		st.Max = max(st.Max, v(s))
	}
	st.N = len(x)
	if st.N == 0 {
		return series{Name: name}
	}
	st.Mean /= float64(st.N)
	f := lsq(x, y)
	st.PerHour, st.SEPerHour = f.Slope*secondsPerHr, f.SE*secondsPerHr
	return st
}

// flat reports whether s moved by at most l's shares of its mean: its
// fitted change per hour within ±FlatSlope·mean, and max − min within
// FlatSpread·mean. A series with no samples is not flat.
func flat(s series, l limits) bool {
	return s.N >= 2 && math.Abs(s.PerHour) <= l.FlatSlope*s.Mean && s.Max-s.Min <= l.FlatSpread*s.Mean
}

// readSamples reads a samples file (sampleHeader's columns).
func readSamples(r io.Reader) ([]sample, error) {
	cr := csv.NewReader(r)
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("samples: header: %w", err)
	}
	if !slices.Equal(head, sampleHeader) {
		return nil, fmt.Errorf("samples: header %q, want %q", head, sampleHeader)
	}
	var out []sample
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("samples: %w", err)
		}
		var v [7]float64
		for i, f := range rec {
			if v[i], err = strconv.ParseFloat(f, 64); err != nil || math.IsNaN(v[i]) || math.IsInf(v[i], 0) {
				return nil, fmt.Errorf("samples: line %d: %s %q is not a number", line, sampleHeader[i], f)
			}
		}
		out = append(out, sample{Elapsed: v[0], RSS: v[1], HeapInuse: v[2], Goroutines: v[3], FDs: v[4], Live: v[5], CPU: v[6]})
	}
}

// metrics is a parsed Prometheus text exposition: each sample's name,
// its label text (between the braces) and its value.
type metrics []metricSample

type metricSample struct {
	name, labels string
	value        float64
}

// parseMetrics reads the text format's samples; comments and blank
// lines are skipped, and a line that is neither is an error.
func parseMetrics(r io.Reader) (metrics, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var m metrics
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var s metricSample
		rest := line
		if i := strings.IndexAny(line, "{ \t"); i >= 0 && line[i] == '{' {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("line %d: unclosed labels", n)
			}
			s.name, s.labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else if i := strings.IndexAny(line, " \t"); i >= 0 {
			s.name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if s.name == "" || len(f) == 0 {
			return nil, fmt.Errorf("line %d: no value", n)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		s.value = v
		m = append(m, s)
	}
	return m, sc.Err()
}

// one is the value of the sample named name without labels.
func (m metrics) one(name string) (float64, bool) {
	for _, s := range m {
		if s.name == name && s.labels == "" {
			return s.value, true
		}
	}
	return 0, false
}

// sum adds the samples named name whose labels contain every one of
// match (each `key="value"`); none: 0.
func (m metrics) sum(name string, match ...string) float64 {
	var t float64
	for _, s := range m {
		if s.name != name {
			continue
		}
		ok := true
		for _, want := range match {
			if !strings.Contains(","+s.labels+",", ","+want+",") {
				ok = false
			}
		}
		if ok {
			t += s.value
		}
	}
	return t
}

// recordCounts are a records file's lines, by outcome and traffic.
type recordCounts struct {
	Lines      int64
	Bad        int64 // lines that are not a JSON record
	Live       int64
	ByOutcome  map[string]int64
	ByTraffic  map[string]int64
	Structure  map[string]int64 // records with a structure verdict, by verdict
	Tenants    map[string]int64
	ErrorTypes map[string]int64 // outcome error's error_type
}

func countRecords(r io.Reader) (recordCounts, error) {
	c := recordCounts{ByOutcome: map[string]int64{}, ByTraffic: map[string]int64{}, Structure: map[string]int64{},
		Tenants: map[string]int64{}, ErrorTypes: map[string]int64{}}
	br := bufio.NewReaderSize(r, 256<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			c.Lines++
			var rec struct {
				Traffic   string `json:"traffic"`
				Outcome   string `json:"outcome"`
				ErrorType string `json:"error_type"`
				Structure string `json:"structure"`
				Tenant    string `json:"tenant"`
			}
			if json.Unmarshal(line, &rec) != nil || rec.Outcome == "" {
				c.Bad++
			} else {
				c.ByOutcome[rec.Outcome]++
				c.ByTraffic[rec.Traffic]++
				if rec.Traffic == "live" {
					c.Live++
				}
				if rec.Structure != "" {
					c.Structure[rec.Structure]++
				}
				if rec.Tenant != "" {
					c.Tenants[rec.Tenant]++
				}
				if rec.ErrorType != "" {
					c.ErrorTypes[rec.ErrorType]++
				}
			}
		}
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return c, err
		}
	}
}

// countLines counts a file's lines (a last line without its newline
// counted) and those that do not begin as a JSON object.
func countLines(r io.Reader) (lines, bad int64, err error) {
	br := bufio.NewReaderSize(r, 256<<10)
	start := true
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			if !start {
				lines++
			}
			return lines, bad, nil
		}
		if err != nil {
			return lines, bad, err
		}
		if start && b != '{' {
			bad++
		}
		start = b == '\n'
		if start {
			lines++
		}
	}
}

// check is one acceptance line and its outcome.
type check struct {
	Name, Got string
	OK        bool
}

// run is everything the report reads of a run.
type run struct {
	Samples  []sample
	Records  recordCounts
	Capture  int64 // capture lines
	BadCapt  int64 // capture lines that are not JSON objects
	Load     loadSummary
	Sampler  samplerSummary
	OTLP     otlpSummary
	Final    metrics // the last scrape
	Warmup   time.Duration
	Interval time.Duration // between samples, as asked
}

// result is the report of a run: the four series and the checks.
type result struct {
	RSS, Heap, Goroutines, FDs series
	CPU                        series // the fit of cpu_seconds: its PerHour/3600 is the cores used
	Checks                     []check
}

func (r result) ok() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return len(r.Checks) > 0
}

func judge(in run, l limits) result {
	w := in.Warmup.Seconds()
	res := result{
		RSS:        summarize("RSS", in.Samples, w, func(s sample) float64 { return s.RSS }),
		Heap:       summarize("heap in use", in.Samples, w, func(s sample) float64 { return s.HeapInuse }),
		Goroutines: summarize("goroutines", in.Samples, w, func(s sample) float64 { return s.Goroutines }),
		FDs:        summarize("descriptors", in.Samples, w, func(s sample) float64 { return s.FDs }),
		CPU:        summarize("CPU", in.Samples, w, func(s sample) float64 { return s.CPU }),
	}
	add := func(name string, ok bool, format string, a ...any) {
		res.Checks = append(res.Checks, check{Name: name, OK: ok, Got: fmt.Sprintf(format, a...)})
	}
	i := func(f float64) int64 { return int64(math.Round(f)) }
	ld := in.Load
	add("0 errors", ld.Requests > 0 && ld.Errors == 0, "%d errors of %d requests answered", ld.Errors, ld.Requests)
	// The built-in simulator comes with a canary probe (docs/probe.md):
	// its records are the file's other lines, traffic "canary".
	add("records written = requests answered", in.Records.Live == ld.Requests && in.Records.Bad == 0,
		"%d live records of %d lines (%s; by traffic: %s; %d not a record), %d requests answered",
		in.Records.Live, in.Records.Lines, kv(in.Records.ByOutcome), kv(in.Records.ByTraffic), in.Records.Bad, ld.Requests)
	live := i(in.Final.sum("tokentap_requests_total", `traffic="live"`))
	written := i(in.Final.sum("tokentap_capture_lines_written_total"))
	add("capture lines = live requests", in.Capture == in.Records.Live && in.Capture == live && in.Capture == written && in.BadCapt == 0,
		"%d capture lines (%d not JSON), %d live records, tokentap_requests_total{traffic=\"live\"} %d, tokentap_capture_lines_written_total %d",
		in.Capture, in.BadCapt, in.Records.Live, live, written)
	recWritten := i(in.Final.sum("tokentap_records_written_total"))
	lost := map[string]int64{
		"tokentap_records_dropped_total":           i(in.Final.sum("tokentap_records_dropped_total")),
		"tokentap_capture_dropped_total":           i(in.Final.sum("tokentap_capture_dropped_total")),
		"tokentap_capture_write_errors_total":      i(in.Final.sum("tokentap_capture_write_errors_total")),
		"tokentap_otel_errors_total":               i(in.Final.sum("tokentap_otel_errors_total")),
		"tokentap_connections_rejected_total":      i(in.Final.sum("tokentap_connections_rejected_total")),
		"records counted written, not in the file": max(recWritten-in.Records.Lines, 0),
		"sampler: samples not taken":               in.Sampler.SampleErrors,
		"sampler: live page polls not answered":    in.Sampler.LiveErrors + in.Sampler.LiveBusy,
	}
	var lostTotal int64
	for _, v := range lost {
		lostTotal += max(v, -v)
	}
	add("nothing dropped, refused or unwritten", lostTotal == 0, "%s", kv(lost))
	add("every instrument saw the load", ld.ToolRequests > 0 && sumOf(in.Records.Structure) == ld.ToolRequests &&
		len(in.Records.Tenants) > 0 && in.OTLP.Traces > 0 && in.OTLP.Metrics > 0 && in.Sampler.LivePolls > 0 && in.Sampler.Scrapes > 0,
		"structure verdicts %s for %d requests declaring a tool; tenants %d; OTLP exports: %d traces, %d metrics (%d bytes); /live/data polls %d; /metrics scrapes %d",
		kv(in.Records.Structure), ld.ToolRequests, len(in.Records.Tenants), in.OTLP.Traces, in.OTLP.Metrics,
		in.OTLP.TraceBytes+in.OTLP.MetricBytes, in.Sampler.LivePolls, in.Sampler.Scrapes)
	add("samples after the warm-up", res.RSS.N >= 3, "%d samples after %v", res.RSS.N, in.Warmup)
	add("RSS slope ≤ 1 MiB per hour", res.RSS.N >= 3 && res.RSS.PerHour <= l.RSSSlope,
		"%+.2f MiB per hour (standard error %.2f; mean %.1f MiB, min %.1f, max %.1f)", res.RSS.PerHour/mib, res.RSS.SEPerHour/mib, res.RSS.Mean/mib, res.RSS.Min/mib, res.RSS.Max/mib)
	for _, s := range []series{res.Goroutines, res.FDs} {
		add(s.Name+" flat", flat(s, l), "%+.1f per hour (%+.2f%% of the mean %.0f; at most ±%.0f%%), min %.0f, max %.0f (spread %.1f%%; at most %.0f%%)",
			s.PerHour, pct(s.PerHour, s.Mean), s.Mean, l.FlatSlope*100, s.Min, s.Max, pct(s.Max-s.Min, s.Mean), l.FlatSpread*100)
	}
	return res
}

func pct(v, of float64) float64 {
	if of == 0 {
		return math.Inf(1)
	}
	return 100 * v / of
}

func sumOf(m map[string]int64) int64 {
	var t int64
	for _, v := range m {
		t += v
	}
	return t
}

// kv prints a map sorted by key: "a=1 b=2".
func kv(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// write prints the report: the figures, each check, and a markdown block
// for docs/performance.md.
func (res result) write(w io.Writer, in run, commit string) {
	ld := in.Load
	events := float64(ld.Events) / max(ld.ElapsedSeconds, 1)
	fmt.Fprintf(w, "soak: %d streams for %.0f s: %d requests answered (%.1f/s), %.0f token events/s; fits after the first %v (%d samples, every %v)\n",
		ld.Streams, ld.ElapsedSeconds, ld.Requests, float64(ld.Requests)/max(ld.ElapsedSeconds, 1), events, in.Warmup, res.RSS.N, in.Interval)
	if res.RSS.N > 0 {
		span := in.Samples[len(in.Samples)-1].Elapsed - in.Warmup.Seconds()
		if span < 30*60 {
			fmt.Fprintf(w, "soak: note: the fits span %.0f s: a slope per hour from under 30 minutes is mostly noise and warm-up; the acceptance run is an hour\n", span)
		}
	}
	cores := res.CPU.PerHour / secondsPerHr
	perEvent := 1e6 * cores / max(events, 1)
	fmt.Fprintf(w, "soak: CPU %.3f cores after the warm-up, the sidecar and its simulator together: %.1f µs per token event\n", cores, perEvent)
	for _, s := range []series{res.RSS, res.Heap} {
		fmt.Fprintf(w, "soak: %-12s %+8.2f ± %.2f MiB/h  mean %8.1f MiB  min %8.1f  max %8.1f\n", s.Name, s.PerHour/mib, s.SEPerHour/mib, s.Mean/mib, s.Min/mib, s.Max/mib)
	}
	for _, s := range []series{res.Goroutines, res.FDs} {
		fmt.Fprintf(w, "soak: %-12s %+8.1f ± %.1f /h     mean %8.0f      min %8.0f  max %8.0f\n", s.Name, s.PerHour, s.SEPerHour, s.Mean, s.Min, s.Max)
	}
	for _, c := range res.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "soak: %s %s: %s\n", mark, c.Name, c.Got)
	}
	verdict := "all checks pass"
	if !res.ok() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "soak: %s\n\n", verdict)

	fmt.Fprintln(w, "<!-- paste into docs/performance.md, \"An hour at 500 streams\" -->")
	fmt.Fprintf(w, "Measured on commit %s: %d streams for %.0f s, %d requests answered (%.1f/s), %.0f token events/s; the fits are over the %d samples after the first %v. The sidecar's process (its simulator included) used %.3f cores after the warm-up, %.1f µs per token event.\n\n",
		commit, ld.Streams, ld.ElapsedSeconds, ld.Requests, float64(ld.Requests)/max(ld.ElapsedSeconds, 1), events, res.RSS.N, in.Warmup, cores, perEvent)
	fmt.Fprintln(w, "| series | slope per hour | its standard error | mean | min | max |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, s := range []series{res.RSS, res.Heap} {
		fmt.Fprintf(w, "| %s | %+.2f MiB | %.2f MiB | %.1f MiB | %.1f MiB | %.1f MiB |\n", s.Name, s.PerHour/mib, s.SEPerHour/mib, s.Mean/mib, s.Min/mib, s.Max/mib)
	}
	for _, s := range []series{res.Goroutines, res.FDs} {
		fmt.Fprintf(w, "| %s | %+.1f (%+.2f%%) | %.1f | %.0f | %.0f | %.0f |\n", s.Name, s.PerHour, pct(s.PerHour, s.Mean), s.SEPerHour, s.Mean, s.Min, s.Max)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| check | met? | figures |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, c := range res.Checks {
		m := "yes"
		if !c.OK {
			m = "**no**"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", c.Name, m, strings.ReplaceAll(c.Got, "|", "\\|"))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "![RSS, heap, goroutines and descriptors over the hour](soak.png)")
	fmt.Fprintln(w, "<!-- end -->")
}

// readRun reads a run's work directory.
func readRun(dir string, warm, every time.Duration) (run, error) {
	in := run{Warmup: warm, Interval: every}
	open := func(name string, f func(io.Reader) error) error {
		fh, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		defer fh.Close()
		if err := f(fh); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	decode := func(v any) func(io.Reader) error {
		return func(r io.Reader) error { return json.NewDecoder(r).Decode(v) }
	}
	var err error
	errs := []error{
		open(fileSamples, func(r io.Reader) error { in.Samples, err = readSamples(r); return err }),
		open(fileRecords, func(r io.Reader) error { in.Records, err = countRecords(r); return err }),
		open(fileCapture, func(r io.Reader) error { in.Capture, in.BadCapt, err = countLines(r); return err }),
		open(fileLoad, decode(&in.Load)),
		open(fileSampler, decode(&in.Sampler)),
		open(fileOTLP, decode(&in.OTLP)),
		open(fileMetrics, func(r io.Reader) error { in.Final, err = parseMetrics(r); return err }),
	}
	return in, errors.Join(errs...)
}

// reportCmd reads a run's work directory, prints the figures and checks
// and a markdown block, draws soak.png, and returns errChecksFailed when
// a check failed.
func reportCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	dir := fs.String("dir", ".", "the run's work directory")
	warm := fs.Duration("warmup", 5*time.Minute, "samples before this are left out of the fits")
	every := fs.Duration("interval", 10*time.Second, "the sampler's interval (for the report's text)")
	commit := fs.String("commit", "unknown", "the commit measured (for the markdown block)")
	png := fs.String("png", "", "the plot (default: soak.png in -dir)")
	l := defaultLimits
	fs.Float64Var(&l.RSSSlope, "max-rss-slope", l.RSSSlope, "the most RSS growth per hour after the warm-up, bytes")
	fs.Float64Var(&l.FlatSlope, "flat-slope", l.FlatSlope, "a flat series' most fitted change per hour, a share of its mean")
	fs.Float64Var(&l.FlatSpread, "flat-spread", l.FlatSpread, "a flat series' most max − min after the warm-up, a share of its mean")
	if err := fs.Parse(args); err != nil {
		return err
	}
	in, err := readRun(*dir, *warm, *every)
	if err != nil {
		return err
	}
	res := judge(in, l)
	if *png == "" {
		*png = filepath.Join(*dir, filePNG)
	}
	f, err := os.Create(*png)
	if err != nil {
		return err
	}
	if err := plot(f, in.Samples, in.Warmup.Seconds()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	res.write(stdout, in, *commit)
	fmt.Fprintf(stdout, "soak: plot %s\n", *png)
	if !res.ok() {
		return errChecksFailed
	}
	return nil
}
