package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/workload"
)

// inProcess is a RoundTripper that serves each request with a handler
// on a goroutine of its own, the response streamed through a pipe: no
// socket, so it runs in a synctest bubble.
type inProcess struct{ h http.Handler }

type pipeWriter struct {
	h      http.Header
	pw     *io.PipeWriter
	status int
	ready  chan struct{}
}

func (w *pipeWriter) Header() http.Header { return w.h }
func (w *pipeWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
		close(w.ready)
	}
}
func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}
func (w *pipeWriter) Flush() {}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{h: http.Header{}, pw: pw, ready: make(chan struct{})}
	sreq := req.Clone(req.Context())
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.h.ServeHTTP(w, sreq)
		w.WriteHeader(http.StatusOK)
		pw.Close()
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		<-done
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: w.status, Status: http.StatusText(w.status), Header: w.h, Body: pr,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: req, ContentLength: -1}, nil
}

// simulator starts the simulated engine for the test: its handler, and
// a stop function.
func simulator(t *testing.T, cfg config.Simulator) (*simengine.Engine, http.Handler) {
	t.Helper()
	eng := simengine.NewEngine(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return eng, simengine.NewServer(eng)
}

// loopback serves h on a loopback port for the test.
func loopback(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// traceLine is a tokentap capture's line, as the capture writes it.
func traceLine(ts, in, out int64, ids []int64, meta *workload.Meta) string {
	b, _ := json.Marshal(workload.Entry{Timestamp: ts, InputLength: in, OutputLength: out, HashIDs: ids, Tokentap: meta})
	return string(b) + "\n"
}

// scriptedTrace is n requests, Poisson arrivals at rate per second (in
// milliseconds, as a capture writes them), 3 system prompts of 2
// blocks shared across requests, 2-turn conversations (the second turn
// shares its first's blocks), input 600-1600 tokens, output 8-40, and
// production latencies in tokentap's member.
func scriptedTrace(n int, rate float64, seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	t := 0.0
	next := int64(100)
	for i := 0; i < n; i++ {
		sys := int64(rng.IntN(3)) * 2 // ids 0-5: the system prompts' two blocks each
		in := int64(600 + rng.IntN(1000))
		ids := []int64{sys, sys + 1}
		for int64(len(ids))*DefaultBlockSize < in {
			ids = append(ids, next)
			next++
		}
		ttft, tpot := 50+rng.Float64()*100, 10+rng.Float64()*5
		meta := &workload.Meta{API: "chat", Model: "tokentap-sim", Stream: true, Outcome: "success", InputLengthFrom: "engine",
			OutputLengthFrom: "engine", TTFTMs: &ttft, TPOTMs: &tpot, SLO: map[string]string{"chat": "met"}}
		b.WriteString(traceLine(int64(t), in, int64(8+rng.IntN(33)), ids, meta))
		if i%2 == 0 && i+1 < n { // the conversation's second turn: the first's prompt, and more
			t += rng.ExpFloat64() / rate * 1000
			i++
			ids2 := append(append([]int64{}, ids...), next)
			next++
			b.WriteString(traceLine(int64(t), int64(len(ids))*DefaultBlockSize+100, int64(8+rng.IntN(33)), ids2, meta))
		}
		t += rng.ExpFloat64() / rate * 1000
	}
	return b.String()
}

func openString(s string) func() (*workload.Reader, io.Closer, error) {
	return func() (*workload.Reader, io.Closer, error) {
		return workload.NewReader(strings.NewReader(s), workload.ReaderOptions{Name: "trace.jsonl"}), io.NopCloser(nil), nil
	}
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func describe(s Step) string {
	return fmt.Sprintf("scheduled %d sent %d not sent %v answered %d failed %v lengths %d/%d (unknown %d, lines %v) lag %+v",
		s.Scheduled, s.Sent, s.NotSent, s.Answered, s.Failed, s.LengthChecked-s.LengthMismatch, s.LengthChecked, s.LengthUnknown, s.MismatchLines, s.Lag)
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
