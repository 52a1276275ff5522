// Command soak is a bounded load generator for the sidecar: it keeps N
// streaming chat completions in flight against a URL for a duration,
// reads every stream to its end, and reports how many requests finished,
// how they ended, and the bytes and events it read. It uses the standard
// library only. scripts/soak.sh runs it against the sidecar in front of
// the built-in simulator (or a given upstream).
//
//	go run ./tools/soak -url http://127.0.0.1:8080 -streams 500 -duration 10m
//
// Every stream must end with "data: [DONE]" after HTTP 200; anything
// else is counted as an error, by kind. The exit status is 1 when the
// error share exceeds -max-error-ratio, or when no request finished.
//
// Three subcommands serve scripts/soak.sh's hour at 500 streams
// (docs/performance.md, "An hour at 500 streams"):
//
//	soak sample -pid PID -admin URL -out samples.csv   # RSS, heap, goroutines, descriptors every 10 s; /live/data polled every 1 s
//	    [-pprof URL -burst MiB -profiles DIR]          # and the allocation profiles of a heap burst
//	soak otlp -listen 127.0.0.1:0 -addr-file F -out otlp.json   # an OTLP/HTTP sink that counts what it is sent
//	soak report -dir WORK -warmup 5m                    # the fits and the checks; soak.png; exit 1 when a check fails
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		var err error
		switch os.Args[1] {
		case "sample":
			err = sampleCmd(os.Args[2:])
		case "otlp":
			err = otlpCmd(os.Args[2:])
		case "report":
			err = reportCmd(os.Args[2:], os.Stdout)
		default:
			load()
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak "+os.Args[1]+": "+err.Error())
			if errors.Is(err, errChecksFailed) {
				os.Exit(1)
			}
			os.Exit(2)
		}
		return
	}
	load()
}

// load is the load generator: the command without a subcommand.
func load() {
	url := flag.String("url", "http://127.0.0.1:8080", "base URL of the sidecar (the proxy listener)")
	path := flag.String("path", "/v1/chat/completions", "request path")
	streams := flag.Int("streams", 100, "concurrent streams kept in flight")
	duration := flag.Duration("duration", time.Minute, "how long to keep starting streams; streams running at the end are read to their end")
	model := flag.String("model", "soak", "model name sent")
	maxTokens := flag.Int("max-tokens", 64, "max_tokens of every request")
	reqTimeout := flag.Duration("request-timeout", 2*time.Minute, "bound on one request, stream included")
	report := flag.Duration("report", 10*time.Second, "progress line interval (0 = none)")
	maxErr := flag.Float64("max-error-ratio", 0.01, "exit 1 when errors exceed this share of finished requests")
	keys := flag.Int("keys", 0, "send \"Authorization: Bearer soak-key-N\" with N cycling over this many keys (0: no Authorization), for tenants from an API key")
	toolShare := flag.Float64("tool-share", 0, "share of requests that declare a tool (0 to 1), for an SLO with structure: required")
	summary := flag.String("summary", "", "write the final counts as JSON to this file")
	flag.Parse()
	if *streams < 1 || *duration <= 0 || *keys < 0 || *toolShare < 0 || *toolShare > 1 {
		fmt.Fprintln(os.Stderr, "soak: -streams must be at least 1, -duration positive, -keys at least 0, -tool-share within 0 to 1")
		os.Exit(2)
	}

	mix := newMix(*model, *maxTokens, *keys, *toolShare)
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        *streams,
		MaxIdleConnsPerHost: *streams,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	target := strings.TrimSuffix(*url, "/") + *path

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	deadline := time.Now().Add(*duration)
	var st stats
	start := time.Now()

	var wg sync.WaitGroup
	var seq atomic.Uint64
	for range *streams {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				body, auth, tool := mix.request(seq.Add(1) - 1)
				if tool {
					st.tools.Add(1)
				}
				st.one(ctx, client, target, body, auth, *reqTimeout)
			}
		})
	}
	done := make(chan struct{})
	if *report > 0 {
		go func() {
			t := time.NewTicker(*report)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					fmt.Printf("soak: %6.0fs ok=%d errors=%d in_flight=%d\n", time.Since(start).Seconds(), st.ok.Load(), st.errs.Load(), st.inFlight.Load())
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	tr.CloseIdleConnections()
	elapsed := time.Since(start)

	ok, errs := st.ok.Load(), st.errs.Load()
	total := ok + errs
	fmt.Printf("soak: streams=%d duration=%v elapsed=%v\n", *streams, *duration, elapsed.Round(time.Millisecond))
	fmt.Printf("soak: requests=%d ok=%d errors=%d rate=%.1f/s\n", total, ok, errs, float64(total)/elapsed.Seconds())
	fmt.Printf("soak: bytes=%d events=%d\n", st.bytes.Load(), st.events.Load())
	for _, k := range st.kinds() {
		fmt.Printf("soak: error %s: %d\n", k.name, k.n)
	}
	if *summary != "" {
		if err := writeLoadSummary(*summary, loadSummary{Streams: *streams, ElapsedSeconds: elapsed.Seconds(),
			Requests: total, OK: ok, Errors: errs, ToolRequests: st.tools.Load(), Events: st.events.Load(), Bytes: st.bytes.Load()}); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(1)
		}
	}
	if total == 0 || float64(errs) > *maxErr*float64(total) {
		fmt.Printf("soak: FAIL (errors %d of %d, allowed ratio %v)\n", errs, total, *maxErr)
		os.Exit(1)
	}
	fmt.Println("soak: OK")
}

// stats are the run's counters.
type stats struct {
	ok, errs, bytes, events, inFlight atomic.Int64
	tools                             atomic.Int64 // requests sent that declared a tool

	mu    sync.Mutex
	byErr map[string]int64
}

func (s *stats) fail(kind string) {
	s.errs.Add(1)
	s.mu.Lock()
	if s.byErr == nil {
		s.byErr = map[string]int64{}
	}
	s.byErr[kind]++
	s.mu.Unlock()
}

type kind struct {
	name string
	n    int64
}

func (s *stats) kinds() []kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kind
	for k, n := range s.byErr {
		out = append(out, kind{k, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n })
	return out
}

var done = []byte("data: [DONE]")

// one sends one streaming request and reads it to its end.
func (s *stats) one(ctx context.Context, c *http.Client, target, body, auth string, timeout time.Duration) {
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		s.fail("request: " + err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
			return // interrupted: not counted
		}
		s.fail("connect: " + errClass(err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.fail(fmt.Sprintf("status %d", resp.StatusCode))
		return
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	sawDone := false
	var n, events int64
	for {
		line, err := br.ReadSlice('\n')
		n += int64(len(line))
		if len(bytes.TrimRight(line, "\r\n")) == 0 && len(line) > 0 {
			events++
		}
		if bytes.HasPrefix(line, done) {
			sawDone = true
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			s.bytes.Add(n)
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
				return
			}
			s.fail("read: " + errClass(err))
			return
		}
	}
	s.bytes.Add(n)
	s.events.Add(events)
	if !sawDone {
		s.fail("stream ended without [DONE]")
		return
	}
	s.ok.Add(1)
}

// errClass shortens an error to a bounded class for the report.
func errClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "request timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	msg := err.Error()
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return msg
}

// mix is the requests' variety: which API key each carries and which
// declare a tool. It is a function of the request's sequence number, so
// a run's mix is the same on every machine, and its set of distinct
// bodies is bounded (two per key: the capture's ids and the tenants stay
// few, as in a fleet of a few clients with fixed system prompts).
type mix struct {
	share  float64
	auths  []string    // per key: its Authorization header (none when keys is 0)
	bodies [][2]string // per key (one when keys is 0): without, with a tool
}

// toolSchema is the declared tool's parameters: a schema the structure
// check compiles once and caches. The simulator answers in text, never
// with a tool call, so each such answer passes the check.
const toolSchema = `{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}`

func newMix(model string, maxTokens, keys int, share float64) *mix {
	m := &mix{share: share}
	for i := range keys {
		m.auths = append(m.auths, fmt.Sprintf("Bearer soak-key-%02d", i))
	}
	for i := range max(keys, 1) {
		base := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"tokentap soak, client %d: write a long answer."}]`, model, maxTokens, i)
		tool := `,"tools":[{"type":"function","function":{"name":"get_weather","description":"The weather in a city.","parameters":` + toolSchema + `}}]`
		m.bodies = append(m.bodies, [2]string{base + "}", base + tool + "}"})
	}
	return m
}

// request is the n-th request's body and Authorization header (empty
// without keys), and whether it declares a tool: the requests that do
// are spread evenly, share of them in every run of 1/share.
func (m *mix) request(n uint64) (body, auth string, tool bool) {
	k := 0
	if len(m.auths) > 0 {
		k = int(n % uint64(len(m.auths)))
		auth = m.auths[k]
	}
	tool = math.Floor(float64(n+1)*m.share) > math.Floor(float64(n)*m.share)
	if tool {
		return m.bodies[k][1], auth, true
	}
	return m.bodies[k][0], auth, false
}
