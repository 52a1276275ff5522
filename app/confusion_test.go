package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/cause"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/engine"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/slo"
)

// recordSink keeps every finished record.
type recordSink struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (s *recordSink) Write(r *record.Record) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

// TestCausesConfusionMatrix drives the simulator's causes scenario
// (simengine.CausesScenario: queue, long prefills ahead, prefill
// interference, preemption, slow connections and engine hiccups mixed)
// through the sidecar's proxy, pipeline and attribution, under
// testing/synctest over in-memory connections (the scenario's 448 s of
// simulated time in about a second), and compares the sidecar's cause of
// every slow event with the simulator's ground truth (Engine.Truth): the
// confusion matrix, computed here, never a fixture. Each true cause must
// be given to at least 95% of its slow events, and at most 2% of the
// slow events may be given a cause the simulator did not have.
//
// The truth's slow events are matched to the sidecar's by request (the
// scenario's X-Request-Id, which the simulator keeps as its id and the
// response's first chunk ties to the record's response id) and, for a
// stall, by its start: the sidecar's stall nearest to the truth's, no
// further than half the stall threshold.
func TestCausesConfusionMatrix(t *testing.T) {
	sc := simengine.CausesScenario()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		e := simengine.NewEngine(sc.Config)
		go e.Run(ctx)
		// The engine's network, and the client's network to the sidecar.
		enginePipes, clientPipes := simengine.NewPipes(), simengine.NewPipes()
		engineSrv := &http.Server{Handler: simengine.NewServer(e)}
		go engineSrv.Serve(enginePipes)
		defer func() { engineSrv.Close(); enginePipes.Close() }()

		up, _ := url.Parse("http://sim")
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		scrape := &http.Client{Transport: &http.Transport{DialContext: enginePipes.Dial}}
		ecfg := config.Engine{Enabled: "on", Interval: 100 * time.Millisecond, Kind: string(engine.Simulator)}.WithDefaults()
		scraper := engine.New(engine.Options{Config: ecfg, Upstream: up, Client: scrape, Logger: log})
		go scraper.Run(ctx)

		sloCfg := config.SLO{StallThreshold: sc.Stall, SlowTTFT: sc.SlowTTFT}
		judge := slo.NewJudge(sloCfg)
		sink := &recordSink{}
		pipe := pipeline.New(pipeline.Options{Judge: judge, Engine: scraper, Sinks: []record.Sink{sink},
			Causes: cause.New(cause.Options{SLO: judge.Config(), MaxRunning: sc.Config.MaxBatch, Engine: scraper})})
		tr := proxy.NewTransport()
		tr.DialContext = e.Dialer(enginePipes.Dial, sc.ConnectDelay, sc.ConnectShare)
		tr.DisableKeepAlives = true
		px, err := proxy.New(proxy.Options{Upstream: up, Pipeline: pipe, Logger: log, Transport: tr, PeekBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		ids := &responseIDs{m: map[string]string{}}
		sidecar := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			px.ServeHTTP(&idWriter{ResponseWriter: w, ids: ids}, r)
		})}
		go sidecar.Serve(clientPipes)
		defer func() { sidecar.Close(); clientPipes.Close() }()

		client := &http.Client{Transport: &http.Transport{DialContext: clientPipes.Dial}}
		if err := sc.Drive(client, "http://sidecar"); err != nil {
			t.Fatalf("the scenario: %v", err)
		}
		synctest.Wait()

		truth := simengine.SlowEvents(e.Truth(), sc.SlowTTFT, sc.Stall)
		byID := map[string]*record.Record{}
		for _, r := range sink.recs {
			if id := ids.m[r.ResponseID]; id != "" {
				byID[id] = r
			}
		}
		if len(byID) != len(sc.Requests) {
			t.Fatalf("%d records tied to the scenario's %d requests", len(byID), len(sc.Requests))
		}
		confusion(t, truth, byID, sc.Stall/2)
	})
}

// responseIDs ties each response's id (the record's response_id) to
// the simulator's request id (X-Sim-Request-Id: the truth's).
type responseIDs struct {
	mu sync.Mutex
	m  map[string]string
}

// idWriter reads both off a response on its way to the client: the
// header, and the first chunk's "id".
type idWriter struct {
	http.ResponseWriter
	ids  *responseIDs
	done bool
}

func (w *idWriter) Write(b []byte) (int, error) {
	if !w.done {
		if i := strings.Index(string(b), `"id":"`); i >= 0 {
			rest := string(b[i+6:])
			if j := strings.IndexByte(rest, '"'); j >= 0 {
				w.ids.mu.Lock()
				w.ids.m[rest[:j]] = w.Header().Get("X-Sim-Request-Id")
				w.ids.mu.Unlock()
				w.done = true
			}
		}
	}
	return w.ResponseWriter.Write(b)
}

func (w *idWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *idWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// confusion computes the matrix and checks it.
func confusion(t *testing.T, truth []simengine.SlowEvent, byID map[string]*record.Record, tolerance time.Duration) {
	t.Helper()
	type key struct{ what, truth, got string }
	m := map[key]int{}
	for _, ev := range truth {
		want := ev.Cause
		if want == "" {
			want = cause.Unexplained // slow by its own work: nothing outside the engine explains it
		}
		got := "not_seen"
		if r := byID[ev.ID]; r == nil {
			got = "no_record"
		} else {
			best := time.Duration(-1)
			for _, c := range r.Causes {
				if c.What != ev.What {
					continue
				}
				d := time.Duration(0)
				if ev.What == cause.Stall {
					d = c.At.Sub(ev.At)
					if d < 0 {
						d = -d
					}
					if d > tolerance {
						continue
					}
				}
				if best < 0 || d < best {
					best, got = d, c.Cause
				}
			}
		}
		m[key{ev.What, want, got}]++
	}
	var keys []key
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.what+a.truth+a.got < b.what+b.truth+b.got
	})
	var b strings.Builder
	total, byTruth, agree, wrong, seen := 0, map[string]int{}, map[string]int{}, 0, 0
	for _, k := range keys {
		n := m[k]
		fmt.Fprintf(&b, "%-5s truth %-20s sidecar %-20s %5d\n", k.what, k.truth, k.got, n)
		total += n
		tk := k.what + "/" + k.truth
		if k.got == "not_seen" || k.got == "no_record" {
			continue
		}
		seen += n
		byTruth[tk] += n
		if k.got == k.truth {
			agree[tk] += n
		} else if k.got != cause.Unexplained {
			wrong += n
		}
	}
	t.Logf("confusion matrix (%d slow events in the truth, %d also slow at the sidecar):\n%s", total, seen, b.String())
	for tk, n := range byTruth {
		share := float64(agree[tk]) / float64(n)
		t.Logf("%-28s %4d of %4d agree (%.1f%%)", tk, agree[tk], n, 100*share)
		if n >= 50 && share < 0.95 {
			t.Errorf("%s: %.1f%% agreement, want at least 95%%", tk, 100*share)
		}
	}
	if seen == 0 || float64(wrong) > 0.02*float64(seen) {
		t.Errorf("%d of %d slow events given a cause the simulator did not have, want at most 2%%", wrong, seen)
	}
}
