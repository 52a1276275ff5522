package proxy

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/record"
)

// teeObs passes every live observation to the real Prometheus backend
// and counts what the tap observed; the Gap call numbered panicAt (1 is
// the first; 0: none) panics after it was observed, as a tap bug would.
type teeObs struct {
	m       *exporter.Metrics
	panicAt int

	mu             sync.Mutex
	gaps, fwds     int
	gapSum, fwdSum float64
}

type teeReq struct {
	record.Observation
	o *teeObs
}

func (o *teeObs) Begin(k record.Key) record.Observation {
	return &teeReq{Observation: o.m.Begin(k), o: o}
}

func (r *teeReq) Gap(d time.Duration) {
	r.Observation.Gap(d)
	o := r.o
	o.mu.Lock()
	o.gaps++
	o.gapSum += d.Seconds()
	n := o.gaps
	o.mu.Unlock()
	if n == o.panicAt {
		panic("observer bug")
	}
}

func (r *teeReq) ForwardDelay(d time.Duration) {
	r.Observation.ForwardDelay(d)
	o := r.o
	o.mu.Lock()
	o.fwds++
	o.fwdSum += d.Seconds()
	o.mu.Unlock()
}

// histogramCountSum returns the count and sum of a histogram over all its
// series.
func histogramCountSum(t *testing.T, m *exporter.Metrics, name string) (int, float64) {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n, sum := 0, 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				n += int(s.GetHistogram().GetSampleCount())
				sum += s.GetHistogram().GetSampleSum()
			}
		}
	}
	return n, sum
}

func contentEvents(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
	}
	return b.String()
}

// Every ITL gap and forward delay the tap observed is in the shared
// histograms once the request's record is written, however the request
// ended: whole, in strip mode, cut by the upstream mid-stream, panicked
// (the request's end stages run from the panic's recovery), or with the
// tap failed open part-way. The exporter holds a request's observations
// and adds them in arrays of 16 (exporter.Request): each case ends with
// an array part-full.
func TestLiveHistogramsCountEveryObservation(t *testing.T) {
	const usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":40}}\n\n"
	whole := contentEvents(40) + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	cut := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, contentEvents(20))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection is cut, no last chunk
	})
	cases := []struct {
		name    string
		h       http.Handler
		opts    Options
		panicAt int
		gaps    int
		failed  string // the record's TapFailed
	}{
		{"whole", sse(whole, "data: [DONE]\n\n"), Options{}, 0, 39, ""},
		{"strip mode", sse(whole, usage, "data: [DONE]\n\n"), Options{InjectUsage: true}, 0, 39, ""},
		{"cut by the upstream", cut, Options{}, 0, 19, ""},
		{"request panicked", nil, Options{Transport: panicTransport{body: contentEvents(20)}}, 0, 19, ""},
		{"tap failed open", sse(whole, "data: [DONE]\n\n"), Options{}, 20, 20, "panic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tee := &teeObs{m: exporter.New(exporter.Config{}), panicAt: c.panicAt}
			if c.h == nil {
				c.opts.Upstream, _ = url.Parse("http://127.0.0.1:1")
			}
			fs, sink := front(t, c.h, c.opts, tee)
			resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec := only(t, sink) // written after the live observers' Done
			if rec.TapFailed != c.failed {
				t.Errorf("tap failed %q, want %q", rec.TapFailed, c.failed)
			}
			tee.mu.Lock()
			defer tee.mu.Unlock()
			// A tap that panics parsing a read observes no forward delay
			// for it: here the stream may come in one read.
			if tee.gaps != c.gaps || (tee.fwds == 0 && c.failed == "") {
				t.Fatalf("the tap observed %d gaps and %d forward delays, want %d and some", tee.gaps, tee.fwds, c.gaps)
			}
			if n, sum := histogramCountSum(t, tee.m, "tokentap_inter_token_latency_seconds"); n != tee.gaps || math.Abs(sum-tee.gapSum) > 1e-9 {
				t.Errorf("ITL histogram: count %d sum %v, observed %d summing %v", n, sum, tee.gaps, tee.gapSum)
			}
			if n, sum := histogramCountSum(t, tee.m, "tokentap_forward_delay_seconds"); n != tee.fwds || math.Abs(sum-tee.fwdSum) > 1e-9 {
				t.Errorf("forward delay histogram: count %d sum %v, observed %d summing %v", n, sum, tee.fwds, tee.fwdSum)
			}
		})
	}
}
