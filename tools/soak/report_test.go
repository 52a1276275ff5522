package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b)) }

func TestLsq(t *testing.T) {
	x := []float64{0, 10, 20, 30, 40}
	y := make([]float64, len(x))
	for i := range x {
		y[i] = 3 + 2*x[i]
	}
	if f := lsq(x, y); !near(f.Slope, 2) || !near(f.Intercept, 3) {
		t.Errorf("exact line: got %+v, want slope 2, intercept 3", f)
	}
	// Noise symmetric about the line y = 10 − x leaves the fit on it.
	if f := lsq(x, y); f.SE != 0 {
		t.Errorf("exact line: standard error %v, want 0", f.SE)
	}
	// Noise symmetric about the line y = 10 − x leaves the fit on it;
	// residuals ±1 over x of variance sum 4: SE = sqrt(6/4/4).
	if f := lsq([]float64{0, 0, 1, 1, 2, 2}, []float64{11, 9, 10, 8, 9, 7}); !near(f.Slope, -1) || !near(f.Intercept, 10) || !near(f.SE, math.Sqrt(6.0/4/4)) {
		t.Errorf("noisy line: got %+v, want slope -1, intercept 10, standard error %v", f, math.Sqrt(6.0/4/4))
	}
	if f := lsq([]float64{5, 5}, []float64{1, 3}); f.Slope != 0 || f.Intercept != 2 {
		t.Errorf("one x: got %+v, want slope 0, the mean 2", f)
	}
	if f := lsq(nil, nil); f != (fit{}) {
		t.Errorf("no points: got %+v", f)
	}
	if f := lsq([]float64{1, 2}, []float64{1}); f != (fit{}) {
		t.Errorf("mismatched lengths: got %+v", f)
	}
}

// steady is a run's samples every 10 s for an hour: RSS growing by
// rssPerHour from 200 MiB after a warm-up that climbs from 20 MiB, the
// goroutines and descriptors alternating ±wobble about their means.
func steady(rssPerHour float64, wobble float64) []sample {
	var out []sample
	for t := 0.0; t < 3600; t += 10 {
		s := sample{Elapsed: t, RSS: 200*mib + rssPerHour*t/3600, HeapInuse: 60 * mib, Goroutines: 1510, FDs: 1530, Live: t * 100, CPU: 0.25 * t}
		if t < 300 {
			s.RSS, s.Goroutines, s.FDs = 20*mib+t*mib, 10+5*t, 12+5*t
		}
		if int(t/10)%2 == 0 {
			s.Goroutines += wobble
			s.FDs -= wobble
		} else {
			s.Goroutines -= wobble
			s.FDs += wobble
		}
		out = append(out, s)
	}
	return out
}

func TestSummarizeLeavesOutTheWarmup(t *testing.T) {
	s := summarize("RSS", steady(0.5*mib, 0), 300, func(s sample) float64 { return s.RSS })
	if s.N != 330 {
		t.Errorf("N = %d, want 330 samples from 300 s to 3590 s", s.N)
	}
	if !near(s.PerHour, 0.5*mib) {
		t.Errorf("slope %.1f bytes/h, want %.1f (the warm-up's climb left out)", s.PerHour, 0.5*mib)
	}
	if s.Min < 200*mib || s.Max > 200.5*mib {
		t.Errorf("min %.0f max %.0f: warm-up samples included", s.Min, s.Max)
	}
	with := summarize("RSS", steady(0.5*mib, 0), 0, func(s sample) float64 { return s.RSS })
	if with.PerHour <= 10*mib {
		t.Errorf("with the warm-up the slope is %.1f MiB/h: the test's warm-up should dominate it", with.PerHour/mib)
	}
	if e := summarize("x", nil, 0, func(s sample) float64 { return s.RSS }); e.N != 0 || e.PerHour != 0 {
		t.Errorf("no samples: %+v", e)
	}
}

func TestFlat(t *testing.T) {
	l := defaultLimits
	for _, c := range []struct {
		name string
		s    series
		want bool
	}{
		{"constant", series{N: 10, Mean: 1500, Min: 1500, Max: 1500}, true},
		{"within the slope and the spread", series{N: 10, PerHour: -14.9, Mean: 1500, Min: 1440, Max: 1590}, true},
		{"growing 1.1% per hour", series{N: 10, PerHour: 16.5, Mean: 1500, Min: 1490, Max: 1510}, false},
		{"falling 1.1% per hour", series{N: 10, PerHour: -16.5, Mean: 1500, Min: 1490, Max: 1510}, false},
		{"spread past 10%", series{N: 10, Mean: 1500, Min: 1400, Max: 1551}, false},
		{"one sample", series{N: 1, Mean: 1500, Min: 1500, Max: 1500}, false},
		{"none", series{}, false},
	} {
		if got := flat(c.s, l); got != c.want {
			t.Errorf("%s: flat = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestVmRSS(t *testing.T) {
	got, err := vmRSS("Name:\tsidecar\nVmPeak:\t  999 kB\nVmRSS:\t  123456 kB\nThreads:\t12\n")
	if err != nil || got != 123456*1024 {
		t.Errorf("got %v, %v; want %d", got, err, 123456*1024)
	}
	for _, bad := range []string{"Name:\tkthreadd\n", "VmRSS:\t12 MB\n", "VmRSS:\tx kB\n"} {
		if _, err := vmRSS(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func writeSamples(t *testing.T, path string, s []sample) {
	t.Helper()
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	w.Write(sampleHeader)
	for _, x := range s {
		w.Write(x.row())
	}
	w.Flush()
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadSamples(t *testing.T) {
	in := []sample{{Elapsed: 0.004, RSS: 1 << 30, HeapInuse: 5e7, Goroutines: 1512, FDs: 1530, Live: 0, CPU: 0.31},
		{Elapsed: 10.001, RSS: 1<<30 + 4096, HeapInuse: 5.1e7, Goroutines: 1511, FDs: 1531, Live: 1049, CPU: 2.75}}
	p := filepath.Join(t.TempDir(), fileSamples)
	writeSamples(t, p, in)
	b, _ := os.ReadFile(p)
	got, err := readSamples(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != in[0] || got[1] != in[1] {
		t.Errorf("got %+v, want %+v", got, in)
	}
	for _, bad := range []string{
		"",
		"elapsed_s,rss_bytes\n1,2\n",
		strings.Join(sampleHeader[:6], ",") + "\n1,2,3,4,5,6\n",
		strings.Join(sampleHeader, ",") + "\n1,2,3,4,5,6,x\n",
		strings.Join(sampleHeader, ",") + "\n1,2,3,4,5,6,NaN\n",
		strings.Join(sampleHeader, ",") + "\n1,2,3,4,5,6\n",
	} {
		if _, err := readSamples(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

const exposition = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 1512
go_memstats_heap_inuse_bytes 5.2428800e+07
tokentap_requests_total{api="chat",model="m",outcome="success",traffic="live"} 100
tokentap_requests_total{api="chat",model="m",outcome="error",traffic="live"} 2
tokentap_requests_total{api="chat",model="m",outcome="success",traffic="canary"} 7
tokentap_requests_total{api="chat",model="m",outcome="success",traffic="livex"} 1000
tokentap_odd{error="a } b",traffic="live"} 3 1700000000000
`

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.one("go_goroutines"); !ok || v != 1512 {
		t.Errorf("go_goroutines = %v, %v", v, ok)
	}
	if v, ok := m.one("go_memstats_heap_inuse_bytes"); !ok || v != 50*mib {
		t.Errorf("heap = %v, %v", v, ok)
	}
	if _, ok := m.one("tokentap_requests_total"); ok {
		t.Error("one found a labelled series")
	}
	if got := m.sum("tokentap_requests_total", `traffic="live"`); got != 102 {
		t.Errorf("live = %v, want 102 (not livex's)", got)
	}
	if got := m.sum("tokentap_requests_total", `traffic="live"`, `outcome="error"`); got != 2 {
		t.Errorf("live errors = %v, want 2", got)
	}
	if got := m.sum("tokentap_requests_total"); got != 1109 {
		t.Errorf("all = %v, want 1109", got)
	}
	if got := m.sum("tokentap_odd", `traffic="live"`); got != 3 {
		t.Errorf("a label value with a brace, a timestamp: %v, want 3", got)
	}
	if got := m.sum("absent"); got != 0 {
		t.Errorf("absent = %v", got)
	}
	for _, bad := range []string{"go_goroutines\n", "x{a=\"1\" 3\n", "x 1e+\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestCountRecordsAndLines(t *testing.T) {
	recs := `{"traffic":"live","outcome":"success","structure":"pass","tenant":"t-1"}
{"traffic":"live","outcome":"error","error_type":"http_5xx","tenant":"t-2"}
{"traffic":"canary","outcome":"not_sent","error_type":"shutdown"}
not json
{"traffic":"live","outcome":"success","tenant":"t-1"}`
	c, err := countRecords(strings.NewReader(recs))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lines != 5 || c.Bad != 1 || c.Live != 3 || c.ByOutcome["success"] != 2 || c.ByOutcome["error"] != 1 ||
		c.ByTraffic["canary"] != 1 || c.Structure["pass"] != 1 || len(c.Tenants) != 2 || c.ErrorTypes["shutdown"] != 1 {
		t.Errorf("got %+v", c)
	}
	for _, tc := range []struct {
		in         string
		lines, bad int64
	}{
		{"", 0, 0},
		{"{}\n{}\n", 2, 0},
		{"{}\n{}", 2, 0},
		{"{}\nx\n\n", 3, 2},
	} {
		l, b, err := countLines(strings.NewReader(tc.in))
		if err != nil || l != tc.lines || b != tc.bad {
			t.Errorf("%q: lines %d bad %d (%v), want %d %d", tc.in, l, b, err, tc.lines, tc.bad)
		}
	}
}

// good is a run that passes every check.
func good() run {
	return run{
		Samples: steady(0.5*mib, 5),
		Records: recordCounts{Lines: 1010, Live: 1000, ByOutcome: map[string]int64{"success": 1010},
			ByTraffic: map[string]int64{"live": 1000, "canary": 10}, Structure: map[string]int64{"pass": 250},
			Tenants: map[string]int64{"t-a": 500, "t-b": 500}},
		Capture: 1000,
		Load:    loadSummary{Streams: 500, ElapsedSeconds: 3600, Requests: 1000, OK: 1000, ToolRequests: 250, Events: 18e6},
		Sampler: samplerSummary{Samples: 360, Scrapes: 360, LivePolls: 3600},
		OTLP:    otlpSummary{Traces: 700, Metrics: 360},
		Final: metrics{{"tokentap_requests_total", `outcome="success",traffic="live"`, 1000},
			{"tokentap_capture_lines_written_total", "", 1000}, {"tokentap_records_written_total", "", 1009}},
		Warmup:   5 * time.Minute,
		Interval: 10 * time.Second,
	}
}

func failed(r result) []string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

func TestJudge(t *testing.T) {
	res := judge(good(), defaultLimits)
	if !res.ok() || len(res.Checks) != 9 {
		t.Fatalf("a good run: failed %q of %d checks: %+v", failed(res), len(res.Checks), res.Checks)
	}
	for _, c := range []struct {
		name   string
		change func(*run)
		fails  string
	}{
		{"an error", func(r *run) { r.Load.Errors, r.Load.OK = 1, 999 }, "0 errors"},
		{"no request", func(r *run) { r.Load.Requests = 0 }, "0 errors"},
		{"a record missing", func(r *run) { r.Records.Live = 999 }, "records written = requests answered"},
		{"a line not a record", func(r *run) { r.Records.Bad = 1 }, "records written = requests answered"},
		{"a capture line missing", func(r *run) { r.Capture = 999 }, "capture lines = live requests"},
		{"the counter differs", func(r *run) { r.Final[0].value = 1001 }, "capture lines = live requests"},
		{"a capture line not JSON", func(r *run) { r.BadCapt = 1 }, "capture lines = live requests"},
		{"a record dropped", func(r *run) {
			r.Final = append(r.Final, metricSample{"tokentap_records_dropped_total", `reason="queue"`, 1})
		}, "nothing dropped, refused or unwritten"},
		{"a record counted, not in the file", func(r *run) { r.Final[2].value = 1011 }, "nothing dropped, refused or unwritten"},
		{"an OTLP error", func(r *run) { r.Final = append(r.Final, metricSample{"tokentap_otel_errors_total", "", 2}) }, "nothing dropped, refused or unwritten"},
		{"a live poll refused", func(r *run) { r.Sampler.LiveBusy = 1 }, "nothing dropped, refused or unwritten"},
		{"no OTLP metrics", func(r *run) { r.OTLP.Metrics = 0 }, "every instrument saw the load"},
		{"a tool request unchecked", func(r *run) { r.Records.Structure["pass"] = 249 }, "every instrument saw the load"},
		{"no tenant", func(r *run) { r.Records.Tenants = nil }, "every instrument saw the load"},
		{"RSS growing 1.5 MiB/h", func(r *run) { r.Samples = steady(1.5*mib, 5) }, "RSS slope ≤ 1 MiB per hour"},
		{"no sample after the warm-up", func(r *run) { r.Samples = r.Samples[:30] }, "samples after the warm-up"},
	} {
		in := good()
		c.change(&in)
		res := judge(in, defaultLimits)
		if f := failed(res); len(f) == 0 || f[0] != c.fails {
			t.Errorf("%s: failed %q, want %q first", c.name, f, c.fails)
		}
	}
	// Goroutines and descriptors leaking a stream's worth (3 each) every
	// 10 minutes after the warm-up: 18 an hour, 1.2% of 1,510.
	in := good()
	for i := range in.Samples {
		if e := in.Samples[i].Elapsed; e >= 300 {
			in.Samples[i].Goroutines += 3 * math.Floor(e/600)
			in.Samples[i].FDs += 3 * math.Floor(e/600)
		}
	}
	if f := failed(judge(in, defaultLimits)); len(f) != 2 || f[0] != "goroutines flat" || f[1] != "descriptors flat" {
		t.Errorf("a slow leak: failed %q, want goroutines and descriptors", f)
	}
}

func writeRun(t *testing.T, dir string, in run) {
	t.Helper()
	writeSamples(t, filepath.Join(dir, fileSamples), in.Samples)
	var recs, capt strings.Builder
	for i := range in.Records.Lines {
		tr := "live"
		if i >= in.Records.Live {
			tr = "canary"
		}
		fmt.Fprintf(&recs, `{"traffic":%q,"outcome":"success","tenant":"t-%d"`, tr, i%2)
		if i < 250 {
			recs.WriteString(`,"structure":"pass"`)
		}
		recs.WriteString("}\n")
	}
	for range in.Capture {
		capt.WriteString(`{"timestamp":0,"input_length":10,"output_length":5,"hash_ids":[0]}` + "\n")
	}
	var m strings.Builder
	for _, s := range in.Final {
		if s.labels == "" {
			fmt.Fprintf(&m, "%s %g\n", s.name, s.value)
		} else {
			fmt.Fprintf(&m, "%s{%s} %g\n", s.name, s.labels, s.value)
		}
	}
	for name, text := range map[string]string{fileRecords: recs.String(), fileCapture: capt.String(), fileMetrics: m.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range map[string]any{fileLoad: in.Load, fileSampler: in.Sampler, fileOTLP: in.OTLP} {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReportCmd(t *testing.T) {
	dir := t.TempDir()
	writeRun(t, dir, good())
	var out bytes.Buffer
	if err := reportCmd([]string{"-dir", dir, "-commit", "abc1234"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"soak: all checks pass",
		"Measured on commit abc1234: 500 streams for 3600 s, 1000 requests answered",
		"| RSS | +0.50 MiB | 0.00 MiB |",
		"| 1510 | 1505 | 1515 |",
		"| RSS slope ≤ 1 MiB per hour | yes |",
		"used 0.250 cores after the warm-up, 50.0 µs per token event",
		"the fits span 3290 s",
	} {
		if want == "the fits span 3290 s" {
			if strings.Contains(text, want) {
				t.Errorf("an hour's run is noted as short")
			}
			continue
		}
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q:\n%s", want, text)
		}
	}
	f, err := os.Open(filepath.Join(dir, filePNG))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != image.Rect(0, 0, plotW, plotH) {
		t.Errorf("the plot is %v, want %dx%d", img.Bounds(), plotW, plotH)
	}

	// A run that lost a capture line fails, says so, and still plots.
	bad := good()
	bad.Capture = 999
	dir2 := t.TempDir()
	writeRun(t, dir2, bad)
	out.Reset()
	err = reportCmd([]string{"-dir", dir2, "-png", filepath.Join(dir2, "x.png")}, &out)
	if !errors.Is(err, errChecksFailed) {
		t.Errorf("a lost capture line: err %v, want errChecksFailed", err)
	}
	if !strings.Contains(out.String(), "soak: FAIL capture lines = live requests") || !strings.Contains(out.String(), "| capture lines = live requests | **no** |") {
		t.Errorf("the report does not name the failed check:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(dir2, "x.png")); err != nil {
		t.Errorf("no plot: %v", err)
	}

	// A missing file is a read error, naming it, not a failed check.
	os.Remove(filepath.Join(dir2, fileOTLP))
	err = reportCmd([]string{"-dir", dir2}, &out)
	if err == nil || errors.Is(err, errChecksFailed) || !strings.Contains(err.Error(), fileOTLP) {
		t.Errorf("a missing %s: err %v", fileOTLP, err)
	}
}
