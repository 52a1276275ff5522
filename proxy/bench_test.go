package proxy

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/stream"
)

// loopReader serves the same SSE event forever, one event per Read.
type loopReader struct{ ev []byte }

func (l *loopReader) Read(p []byte) (int, error) { return copy(p, l.ev), nil }
func (l *loopReader) Close() error               { return nil }

// tokenEvent is one OpenAI chat chunk carrying one token, as the tap's
// benchmarks serve it forever.
const tokenEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

// tapModes are the tap's two modes, by benchmark name.
var tapModes = []struct {
	name  string
	strip bool
}{{"passthrough", false}, {"strip", true}}

// benchTap is a tap over tokenEvent served forever, with the real
// exporter behind it, its buffers and histogram buckets warmed up.
type benchTap struct {
	st *reqState
	tp *tap
	p  []byte
}

func newBenchTap(strip bool) *benchTap {
	st := realState(1024)
	st.rec.Arrive = time.Now()
	bt := &benchTap{st: st, tp: newTap(&loopReader{ev: []byte(tokenEvent)}, st, bodySSE, stream.FormatOpenAI, strip, 1<<20), p: make([]byte, 32<<10)}
	for i := 0; i < 2048; i++ { // warm up buffers and histogram buckets
		bt.tp.Read(bt.p)
	}
	return bt
}

// read reads the i-th event; every 1,024 events the record is reset, as
// a new request pre-sized from max_tokens would be.
func (bt *benchTap) read(i int) error {
	if i%1024 == 0 {
		bt.st.rec.Reset()
		bt.st.rec.Arrive = time.Now()
	}
	_, err := bt.tp.Read(bt.p)
	return err
}

// BenchmarkTapEvent measures the tap's hot path per event in steady state:
// one upstream read carrying one token event, timed, framed, parsed,
// recorded and observed (ITL histogram and forwarding delay, through the
// real exporter). It must report 0 allocs/op.
func BenchmarkTapEvent(b *testing.B) {
	for _, mode := range tapModes {
		b.Run(mode.name, func(b *testing.B) {
			bt := newBenchTap(mode.strip)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := bt.read(i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if bt.st.rec.TokenEvents() == 0 {
				b.Fatal("no token events recorded")
			}
		})
	}
}

// BenchmarkTapEventParallel is BenchmarkTapEvent over many streams at
// once (8 per core, each its own request and tap), every one observing
// into the same exporter's shared histograms (forward delay, and ITL under
// one label set): the cost of the instruments' cache lines moving between
// cores, which the single-stream benchmark cannot see.
func BenchmarkTapEventParallel(b *testing.B) {
	for _, mode := range tapModes {
		b.Run(mode.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				bt := newBenchTap(mode.strip)
				for i := 0; pb.Next(); i++ {
					if err := bt.read(i); err != nil {
						b.Error(err)
						return
					}
				}
				if bt.st.rec.TokenEvents() == 0 {
					b.Error("no token events recorded")
				}
			})
		})
	}
}

// pieceReader serves the same event forever, in reads of at most piece
// bytes.
type pieceReader struct {
	ev         []byte
	off, piece int
}

func (r *pieceReader) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), r.piece)], r.ev[r.off:])
	r.off = (r.off + n) % len(r.ev)
	return n, nil
}
func (r *pieceReader) Close() error { return nil }

// BenchmarkTapLargeEvent is BenchmarkTapEvent for an event of 32 KiB (a
// tool-call delta) that arrives in reads of copyBufSize, as ReverseProxy
// reads it: the case in which strip mode held every byte of the event
// until its end (below the hold bound) and copies it three more times. One
// op is one event.
func BenchmarkTapLargeEvent(b *testing.B) {
	args := strings.Repeat(`{\"k\":\"vvvvvvvvvv\"},`, 32<<10/20)
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` +
		args + `"}}]},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for _, strip := range []bool{false, true} {
		name := "passthrough"
		if strip {
			name = "strip"
		}
		b.Run(name, func(b *testing.B) {
			st := realState(1024)
			st.rec.Arrive = time.Now()
			tp := newTap(&pieceReader{ev: ev, piece: copyBufSize}, st, bodySSE, stream.FormatOpenAI, strip, 1<<20)
			p := make([]byte, copyBufSize)
			var got int64
			event := func() {
				for want := got + int64(len(ev)); got < want; {
					n, err := tp.Read(p)
					if err != nil {
						b.Fatal(err)
					}
					got += int64(n)
				}
			}
			for range 64 {
				event()
			}
			b.SetBytes(int64(len(ev)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%1024 == 0 {
					st.rec.Reset()
					st.rec.Arrive = time.Now()
				}
				event()
			}
			b.StopTimer()
			if st.rec.TokenEvents() == 0 || st.rec.TapFailed != "" {
				b.Fatalf("%d token events, tap_failed %q", st.rec.TokenEvents(), st.rec.TapFailed)
			}
		})
	}
}

// lockstep is an upstream that writes one event each time it is told to,
// on one long stream, so that each event's latency can be measured alone.
type lockstep struct{ trigger chan struct{} }

func (l *lockstep) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	ev := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n"
	for {
		select {
		case <-l.trigger:
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

type path struct {
	name    string
	up      *lockstep
	br      *bufio.Reader
	body    io.Closer
	samples []time.Duration
}

func (p *path) event(b *testing.B) {
	t0 := time.Now()
	p.up.trigger <- struct{}{}
	for {
		line, err := p.br.ReadString('\n')
		if err != nil {
			b.Fatal(err)
		}
		if line == "\n" {
			break
		}
	}
	p.samples = append(p.samples, time.Since(t0))
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkLoopbackAddedLatency measures, in one run, the latency of one
// event from the upstream's write to the client's read through a bare
// httputil.ReverseProxy and through the sidecar (usage injection on, so
// the strip path is the one measured), interleaving the two so that
// machine noise hits both alike. It reports the medians and the sidecar's
// added latency per event.
func BenchmarkLoopbackAddedLatency(b *testing.B) {
	mk := func(name string, h func(*url.URL) http.Handler) *path {
		up := &lockstep{trigger: make(chan struct{})}
		us := httptest.NewServer(up)
		b.Cleanup(us.Close)
		u, _ := url.Parse(us.URL)
		fs := httptest.NewServer(h(u))
		b.Cleanup(fs.Close)
		resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { resp.Body.Close() })
		return &path{name: name, up: up, br: bufio.NewReader(resp.Body), body: resp.Body}
	}
	bare := mk("bare", func(u *url.URL) http.Handler {
		return &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1}
	})
	side := mk("sidecar", func(u *url.URL) http.Handler {
		m := exporter.New(exporter.Config{})
		p, err := New(Options{Upstream: u, Pipeline: pipeline.New(pipeline.Options{Live: m, Models: m.Models(), Prometheus: m}), InjectUsage: true})
		if err != nil {
			b.Fatal(err)
		}
		return p
	})
	for i := 0; i < 200; i++ { // warm up
		bare.event(b)
		side.event(b)
	}
	bare.samples, side.samples = bare.samples[:0], side.samples[:0]
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			bare.event(b)
			side.event(b)
		} else {
			side.event(b)
			bare.event(b)
		}
	}
	b.StopTimer()
	mb, ms := median(bare.samples), median(side.samples)
	b.ReportMetric(float64(mb.Nanoseconds())/1e3, "bare-µs/event")
	b.ReportMetric(float64(ms.Nanoseconds())/1e3, "sidecar-µs/event")
	b.ReportMetric(float64((ms-mb).Nanoseconds())/1e3, "added-µs/event")
	b.ReportMetric(float64(ms)/float64(mb), "sidecar/bare")
}
