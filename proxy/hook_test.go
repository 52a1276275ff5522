package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// TestHookPerRequest: one proxy, shared by requests that each carry
// their own Hook (as the canary prober's and replay's do): each
// request's Check runs on its own record alone, its Probe labels its
// own series alone, and its Timeout bounds it in the proxy's place; a
// request with no Hook is the proxy's as always (no check, no probe).
func TestHookPerRequest(t *testing.T) {
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		if r.Header.Get("X-Stall") != "" {
			waitGone(r) // ends only when the request's timeout cuts it
			return
		}
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer us.Close()
	u, _ := url.Parse(us.URL)
	m := exporter.New(exporter.Config{})
	var sink collect
	const proxyTimeout = 30 * time.Second
	px, err := New(Options{Upstream: u, Timeout: proxyTimeout, Pipeline: pipeline.New(pipeline.Options{Live: m, Models: m.Models(), Prometheus: m, Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]string{} // record id → the hook that checked it
	send := func(name string, hk *Hook, stall bool) *record.Record {
		t.Helper()
		ctx := context.Background()
		if hk != nil {
			ctx = WithHook(ctx, hk)
		}
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", bytes.NewReader([]byte(streamBody)))
		req.Header.Set("Content-Type", "application/json")
		if stall {
			req.Header.Set("X-Stall", "1")
		}
		px.ServeHTTP(httptest.NewRecorder(), req) // Ends nil: the end stages have run when it returns
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.recs) == 0 {
			t.Fatalf("%s: no record", name)
		}
		return sink.recs[len(sink.recs)-1]
	}
	hook := func(name, probe string, timeout time.Duration) *Hook {
		return &Hook{Probe: probe, Timeout: timeout, Check: func(r *record.Record) {
			if prev, ok := checked[r.ID]; ok {
				t.Errorf("record %s checked by %s and %s", r.ID, prev, name)
			}
			checked[r.ID] = name
		}}
	}
	a := send("a", hook("a", "probe-a", 0), false)
	b := send("b", hook("b", "probe-b", 20*time.Millisecond), true)
	plain := send("plain", nil, false)
	if checked[a.ID] != "a" || checked[b.ID] != "b" || checked[plain.ID] != "" || len(checked) != 2 {
		t.Fatalf("checks %v: want a's record checked by a, b's by b, the plain one by none", checked)
	}
	if a.Outcome != record.Success || plain.Outcome != record.Success {
		t.Fatalf("outcomes %s, %s: want success", a.Outcome, plain.Outcome)
	}
	if b.Outcome != record.Timeout {
		t.Fatalf("the stalled request with its hook's 20 ms timeout: outcome %s, want timeout", b.Outcome)
	}
	if e, _ := b.E2E(); e < 20*time.Millisecond || e >= proxyTimeout {
		t.Fatalf("the timed-out request lasted %v: want its hook's 20 ms timeout, not the proxy's %v", e, proxyTimeout)
	}
	probes := map[string]bool{} // the probe label's values on every series
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "probe" {
					probes[l.GetValue()] = true
				}
			}
		}
	}
	if !probes["probe-a"] || !probes["probe-b"] || len(probes) != 3 {
		t.Fatalf("probe label values %v: want probe-a, probe-b and \"\" (the plain request's)", probes)
	}
}
