package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// load is one client run: Streams streams kept in flight against URL for
// Warmup+Duration; only events that arrive after the warm-up count.
type load struct {
	URL      string
	Streams  int
	Duration time.Duration
	Warmup   time.Duration
	// OnMeasure, if set, is called once when the warm-up is over (the
	// measuring window starts), and OnEnd when it ends.
	OnMeasure, OnEnd func()
	// ToolEvery, when above 0, makes every ToolEvery-th request (counted
	// across streams) declare a tool with a JSON schema (toolBody); the
	// upstream answers those with a tool call that fits it. 0: none.
	ToolEvery int
	// Keys, when set, are API keys the requests carry in turn, as
	// "Authorization: Bearer KEY" (tenants from the API key); empty: no
	// Authorization header.
	Keys []string
	// RefStreams more streams, kept against RefURL (the upstream itself)
	// at the same time, are the reference: their delays, in
	// result.RefDelays, saw the same machine in the same window, so
	// that a path's p99 minus theirs is what the path's hop added,
	// whatever the neighbours' load did meanwhile. 0: none.
	RefStreams int
	RefURL     string
}

// plainBody and toolBody are the requests' bodies: a chat completion,
// and the same declaring one tool, get_weather, whose parameters schema
// the upstream's tool call fits (appendToolEvent).
var (
	plainBody = []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)
	toolBody  = []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"the weather?"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","description":"the forecast for a city",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string","minLength":1},` +
		`"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","days"],"additionalProperties":false}}}],` +
		`"tool_choice":"auto"}`)
)

// apiKeys returns n API keys for the client to send in turn.
func apiKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("sk-peerbench-%02d-0123456789abcdef", i)
	}
	return keys
}

// result is what the client saw in the measuring window.
type result struct {
	Events int64
	Errors int64 // in the window: failed requests, non-200 answers, streams without [DONE]
	// WarmErrors are the same failures during the warm-up: not counted
	// in Errors (a Go proxy's pooled upstream connections may carry the
	// previous window's cancellations into the next warm-up).
	WarmErrors int64
	Requests   int64 // streams that ended with [DONE]
	Window     time.Duration
	Delays     []int64 // per event, ns, sorted
	// RefDelays are the reference streams' (load.RefStreams), ns,
	// sorted; their events and errors are not in Events and Errors.
	RefDelays []int64
	Firsts    []int64 // per request, time to the first event, ns, sorted
	// ErrKinds counts the errors by kind (the first words of each).
	ErrKinds map[string]int
}

func (r *result) quantile(xs []int64, p float64) time.Duration {
	if len(xs) == 0 {
		return -1
	}
	return time.Duration(xs[int(p*float64(len(xs)-1))])
}

// P returns the p-quantile of the per-event delay.
func (r *result) P(p float64) time.Duration { return r.quantile(r.Delays, p) }

var (
	tsKey = []byte(`"ts":`)
	done  = []byte("data: [DONE]")
)

func (l load) run() result {
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	start := time.Now()
	measureFrom := start.Add(l.Warmup)
	ctx, cancel := context.WithDeadline(context.Background(), measureFrom.Add(l.Duration))
	defer cancel()
	if l.OnMeasure != nil {
		t := time.AfterFunc(l.Warmup, l.OnMeasure)
		defer t.Stop()
	}
	var (
		mu  sync.Mutex
		res result
		wg  sync.WaitGroup
		seq atomic.Int64 // requests begun, across streams
	)
	auth := make([]string, len(l.Keys))
	for i, k := range l.Keys {
		auth[i] = "Bearer " + k
	}
	total := l.Streams + l.RefStreams
	for i := 0; i < total; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ref, url := i >= l.Streams, l.URL
			if ref {
				url = l.RefURL
			}
			// Stagger the starts over half the warm-up, so the streams
			// are not in phase.
			select {
			case <-time.After(time.Duration(i) * (l.Warmup / 2) / time.Duration(total)):
			case <-ctx.Done():
				return
			}
			delays := make([]int64, 0, 1024)
			var firsts []int64
			var events, errs, warmErrs, reqs int64
			kinds := map[string]int{}
			fail := func(kind string) {
				if time.Now().Before(measureFrom) {
					warmErrs++
					return
				}
				errs++
				if len(kind) > 120 {
					kind = kind[:120]
				}
				kinds[kind]++
			}
			for ctx.Err() == nil {
				n := seq.Add(1)
				body := plainBody
				if l.ToolEvery > 0 && n%int64(l.ToolEvery) == 0 {
					body = toolBody
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if len(auth) > 0 {
					req.Header.Set("Authorization", auth[n%int64(len(auth))])
				}
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						fail(err.Error())
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				if resp.StatusCode != http.StatusOK {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					fail("HTTP " + resp.Status)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				br := bufio.NewReaderSize(resp.Body, 4096)
				first, ended := true, false
				var readErr error
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						readErr = err
						break
					}
					now := time.Now()
					if bytes.HasPrefix(line, done) {
						ended = true
						continue
					}
					i := bytes.Index(line, tsKey)
					if i < 0 {
						continue
					}
					j := i + len(tsKey)
					k := j
					for k < len(line) && line[k] >= '0' && line[k] <= '9' {
						k++
					}
					ts, _ := strconv.ParseInt(string(line[j:k]), 10, 64)
					if now.After(measureFrom) {
						delays = append(delays, now.UnixNano()-ts)
						events++
						if first {
							firsts = append(firsts, now.Sub(t0).Nanoseconds())
						}
					}
					first = false
				}
				resp.Body.Close()
				switch {
				case ended:
					if time.Now().After(measureFrom) {
						reqs++
					}
				case ctx.Err() == nil: // cut short while the load was on
					fail("stream ended without [DONE]: " + readErr.Error())
				}
			}
			mu.Lock()
			if ref {
				res.RefDelays = append(res.RefDelays, delays...)
				mu.Unlock()
				return
			}
			res.Delays = append(res.Delays, delays...)
			res.Firsts = append(res.Firsts, firsts...)
			res.Events += events
			res.Errors += errs
			res.WarmErrors += warmErrs
			res.Requests += reqs
			if res.ErrKinds == nil {
				res.ErrKinds = map[string]int{}
			}
			for k, n := range kinds {
				res.ErrKinds[k] += n
			}
			mu.Unlock()
		}(i)
	}
	<-ctx.Done()
	if l.OnEnd != nil {
		l.OnEnd()
	}
	wg.Wait()
	res.Window = l.Duration
	slices.Sort(res.Delays)
	slices.Sort(res.RefDelays)
	slices.Sort(res.Firsts)
	return res
}

// clientCmd runs the client alone and prints one line.
func clientCmd(args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	target := fs.String("url", "http://127.0.0.1:18000/v1/chat/completions", "stream URL")
	streams := fs.Int("streams", 50, "concurrent streams")
	duration := fs.Duration("duration", 10*time.Second, "measuring window")
	warm := fs.Duration("warmup", 2*time.Second, "warm-up before the window")
	label := fs.String("label", "direct", "label of the output line")
	toolEvery := fs.Int("tool-every", 4, "every Nth request declares a tool (0: none)")
	keys := fs.Int("keys", 7, "API keys sent in turn as Authorization: Bearer (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *toolEvery < 0 || *keys < 0 {
		return errors.New("-tool-every and -keys must not be negative")
	}
	r := load{URL: *target, Streams: *streams, Duration: *duration, Warmup: *warm, ToolEvery: *toolEvery, Keys: apiKeys(*keys)}.run()
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("%s events=%d ev/s=%.0f requests=%d errs=%d delay_us p50=%.1f p90=%.1f p99=%.1f p999=%.1f max=%.1f first_us p50=%.1f p99=%.1f\n",
		*label, r.Events, float64(r.Events)/duration.Seconds(), r.Requests, r.Errors,
		us(r.P(.5)), us(r.P(.9)), us(r.P(.99)), us(r.P(.999)), us(r.P(1)),
		us(r.quantile(r.Firsts, .5)), us(r.quantile(r.Firsts, .99)))
	return nil
}
