package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// sampleHeader is the samples file's first line; each later line is one
// sample. elapsed_s counts from the sampler's start.
var sampleHeader = []string{"elapsed_s", "rss_bytes", "heap_inuse_bytes", "goroutines", "fds", "live_requests", "cpu_seconds"}

// sample is one line of the samples file.
type sample struct {
	Elapsed    float64 // seconds since the sampler started
	RSS        float64 // VmRSS of /proc/PID/status, bytes
	HeapInuse  float64 // go_memstats_heap_inuse_bytes
	Goroutines float64 // go_goroutines
	FDs        float64 // entries of /proc/PID/fd
	Live       float64 // tokentap_requests_total{traffic="live"}, every outcome
	CPU        float64 // process_cpu_seconds_total: user and system, the simulator's included
}

func (s sample) row() []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	return []string{strconv.FormatFloat(s.Elapsed, 'f', 3, 64), f(s.RSS), f(s.HeapInuse), f(s.Goroutines), f(s.FDs), f(s.Live), f(s.CPU)}
}

// samplerSummary is what the sampler writes when it stops.
type samplerSummary struct {
	Samples       int   `json:"samples"`
	SampleErrors  int64 `json:"sample_errors"`  // samples not taken: /proc or /metrics could not be read
	Scrapes       int64 `json:"scrapes"`        // /metrics answered whole
	LivePolls     int64 `json:"live_polls"`     // /live/data answered 200
	LiveBusy      int64 `json:"live_busy"`      // answered 503 (at most 4 polls at once)
	LiveErrors    int64 `json:"live_errors"`    // any other answer, or none, of /live/data or /probes
	Bursts        int   `json:"bursts"`         // samples over -burst whose profiles were written
	ProfileErrors int64 `json:"profile_errors"` // profiles not read or not written (-pprof)
}

// sampleCmd samples the sidecar (its process and its admin listener)
// until SIGTERM or SIGINT, -duration, or until the process is gone: every -interval
// its RSS and descriptors from /proc and its heap and goroutines from a
// whole scrape of /metrics (the sampler is the run's Prometheus), and
// every -live-interval the live page's data, as an open page polls it.
// With -pprof, it also catches the allocations of a heap burst
// (burstCatcher).
func sampleCmd(args []string) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	pid := fs.Int("pid", 0, "the sidecar's process id")
	admin := fs.String("admin", "", "the sidecar's admin base URL, e.g. http://127.0.0.1:9464")
	out := fs.String("out", "samples.csv", "the samples file (CSV)")
	summary := fs.String("summary", "", "write the sampler's counts as JSON to this file when it stops")
	interval := fs.Duration("interval", 10*time.Second, "between samples (and /metrics scrapes)")
	liveEvery := fs.Duration("live-interval", time.Second, "between polls of /live/data (0: none)")
	duration := fs.Duration("duration", 0, "stop after this long, taking no sample at or past it (0: until SIGTERM)")
	pprofURL := fs.String("pprof", "", "the sidecar's profiling base URL (peerbench sidecar -pprof ADDR), to catch a heap burst's allocations (empty: none)")
	burst := fs.Float64("burst", 110, "with -pprof: heap in use, MiB, above which a sample is a burst and its profiles are written")
	profiles := fs.String("profiles", ".", "with -pprof: the folder for a burst's profiles")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pid <= 0 || *admin == "" || *interval <= 0 || *liveEvery < 0 || *duration < 0 {
		return errors.New("-pid, -admin and a positive -interval are required")
	}
	base := strings.TrimSuffix(*admin, "/")
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	if err := w.Write(sampleHeader); err != nil {
		return err
	}
	w.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	client := &http.Client{Timeout: 5 * time.Second}
	bursts := &burstCatcher{c: client, pprof: strings.TrimSuffix(*pprofURL, "/"), dir: *profiles, over: *burst * (1 << 20), max: 5}
	var sum samplerSummary
	var polls, busy, perr atomic.Int64
	pollDone := make(chan struct{})
	if *liveEvery > 0 {
		go func() {
			defer close(pollDone)
			pollLive(ctx, client, base, *liveEvery, &polls, &busy, &perr)
		}()
	} else {
		close(pollDone)
	}

	start := time.Now()
	proc := fmt.Sprintf("/proc/%d", *pid)
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		s, err := takeSample(ctx, client, proc, base)
		s.Elapsed = time.Since(start).Seconds()
		switch {
		case err == nil:
			sum.Samples++
			sum.Scrapes++
			if err := w.Write(s.row()); err != nil {
				return err
			}
			w.Flush()
			if err := w.Error(); err != nil {
				return err
			}
			if err := bursts.after(ctx, s); err != nil && ctx.Err() == nil {
				sum.ProfileErrors++
				fmt.Fprintf(os.Stderr, "soak sample: %.0fs: profile: %v\n", s.Elapsed, err)
			}
		case ctx.Err() != nil:
		default:
			sum.SampleErrors++
			fmt.Fprintf(os.Stderr, "soak sample: %.0fs: %v\n", s.Elapsed, err)
			if _, serr := os.Stat(proc); serr != nil {
				stop() // the process is gone
			}
		}
		select {
		case <-ctx.Done():
			<-pollDone
			sum.LivePolls, sum.LiveBusy, sum.LiveErrors = polls.Load(), busy.Load(), perr.Load()
			sum.Bursts = bursts.caught
			if *summary != "" {
				return writeJSON(*summary, sum)
			}
			return nil
		case <-t.C:
		}
	}
}

// takeSample reads one sample (Elapsed left to the caller).
func takeSample(ctx context.Context, c *http.Client, proc, base string) (sample, error) {
	var s sample
	st, err := os.ReadFile(proc + "/status")
	if err != nil {
		return s, err
	}
	if s.RSS, err = vmRSS(string(st)); err != nil {
		return s, err
	}
	fds, err := os.ReadDir(proc + "/fd")
	if err != nil {
		return s, err
	}
	s.FDs = float64(len(fds))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return s, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m, err := parseMetrics(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return s, fmt.Errorf("/metrics: %w", err)
	}
	var ok1, ok2, ok3 bool
	s.HeapInuse, ok1 = m.one("go_memstats_heap_inuse_bytes")
	s.Goroutines, ok2 = m.one("go_goroutines")
	s.CPU, ok3 = m.one("process_cpu_seconds_total")
	if !ok1 || !ok2 || !ok3 {
		return s, errors.New("/metrics: no go_memstats_heap_inuse_bytes, go_goroutines or process_cpu_seconds_total")
	}
	s.Live = m.sum("tokentap_requests_total", `traffic="live"`)
	return s, nil
}

// vmRSS is the VmRSS line of a /proc/PID/status text, in bytes.
func vmRSS(status string) (float64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS: %q", strings.TrimSpace(line))
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("VmRSS: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, errors.New("no VmRSS line (a kernel thread, or the process is a zombie)")
}

// pollLive polls /live/data as the open page does (live/static/live.js),
// but every -live-interval rather than every 2 s: 30 records, the seq of
// the last changed answer passed as since, so an unchanged page gets a
// short answer; and /probes?format=json every fifth poll, as the page's
// canary table asks every 5 s.
func pollLive(ctx context.Context, c *http.Client, base string, every time.Duration, ok, busy, bad *atomic.Int64) {
	t := time.NewTicker(every)
	defer t.Stop()
	var seq uint64
	have := false
	for i := 0; ; i++ {
		u := base + "/live/data?n=30"
		if have {
			u = base + "/live/data?since=" + strconv.FormatUint(seq, 10) + "&n=30"
		}
		switch d, code, err := liveOnce(ctx, c, u); {
		case ctx.Err() != nil:
			return
		case err == nil && code == http.StatusOK:
			ok.Add(1)
			if !d.Unchanged {
				seq, have = d.Seq, true
			}
		case err == nil && code == http.StatusServiceUnavailable:
			busy.Add(1)
			logPoll(bad.Load()+busy.Load(), u, code, nil)
		default:
			bad.Add(1)
			logPoll(bad.Load()+busy.Load(), u, code, err)
		}
		if i%5 == 0 {
			u := base + "/probes?format=json"
			if _, code, err := liveOnce(ctx, c, u); ctx.Err() == nil && (err != nil || code != http.StatusOK) {
				bad.Add(1)
				logPoll(bad.Load()+busy.Load(), u, code, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// logPoll says why a poll was not answered, for the first 20 (the count
// is in the summary).
func logPoll(n int64, u string, code int, err error) {
	if n > 20 {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak sample: %s: %v\n", u, err)
		return
	}
	fmt.Fprintf(os.Stderr, "soak sample: %s: HTTP %d\n", u, code)
}

// liveData is what the poller reads of a /live/data answer.
type liveData struct {
	Seq       uint64 `json:"seq"`
	Unchanged bool   `json:"unchanged"`
}

func liveOnce(ctx context.Context, c *http.Client, u string) (d liveData, code int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return d, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return d, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return d, resp.StatusCode, nil
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&d)
	return d, resp.StatusCode, err
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
