package simengine

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
)

// runScenario drives sc through a Server over pipes (keep-alives off,
// connections from Engine.Dialer) in a synctest bubble, checks every
// request streamed its tokens, and returns the engine's truth.
func runScenario(t *testing.T, sc Scenario) []Truth {
	var truth []Truth
	synctest.Test(t, func(t *testing.T) {
		e := NewEngine(sc.Config)
		ctx, cancel := context.WithCancel(t.Context())
		engineDone := make(chan struct{})
		go func() { e.Run(ctx); close(engineDone) }()
		pn := NewPipes()
		srv := &http.Server{Handler: NewServer(e)}
		srv.SetKeepAlivesEnabled(false)
		serveDone := make(chan struct{})
		go func() { srv.Serve(pn); close(serveDone) }()
		tr := &http.Transport{DialContext: e.Dialer(pn.Dial, sc.ConnectDelay, sc.ConnectShare)}
		client := &http.Client{Transport: tr}
		if err := sc.Drive(client, "http://sim"); err != nil {
			t.Error(err)
		}
		truth = e.Truth()
		srv.Close()
		pn.Close()
		tr.CloseIdleConnections()
		<-serveDone
		cancel()
		<-engineDone
	})
	return truth
}

// The causes scenario gives at least 50 slow events of each cause in
// the simulator's own truth (first tokens: connection, queue,
// long_prefill_ahead; stalls: prefill_interference, preemption,
// unexplained), every Ref names a request of the log, and a slow first token without a cause is
// a request slow by its own prompt alone (L, A, B: their prefills).
func TestCausesScenario(t *testing.T) {
	sc := CausesScenario()
	if sc.Name != CausesScenarioName || len(sc.Requests) != 64*22 {
		t.Fatalf("scenario %q with %d requests", sc.Name, len(sc.Requests))
	}
	truth := runScenario(t, sc)
	if len(truth) != len(sc.Requests) {
		t.Fatalf("%d truths for %d requests", len(truth), len(sc.Requests))
	}
	byID := map[string]Truth{}
	for _, tr := range truth {
		byID[tr.ID] = tr
	}
	count := map[string]int{}
	for _, ev := range SlowEvents(truth, sc.SlowTTFT, sc.Stall) {
		count[ev.What+"/"+ev.Cause]++
		switch {
		case ev.What == "ttft" && ev.Cause == "":
			// Slow by its own prompt: a long one (L, A or B).
			if byID[ev.ID].PromptTokens < 5000 {
				t.Errorf("%s: a short prompt's first token slow with no cause: %+v", ev.ID, byID[ev.ID])
			}
		case ev.Ref != "":
			if _, ok := byID[ev.Ref]; !ok {
				t.Errorf("%+v points to no request of the log", ev)
			}
		}
	}
	var keys []string
	for k := range count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%-28s %4d", k, count[k])
	}
	for _, k := range []string{"ttft/" + CauseConnection, "ttft/" + CauseQueue, "ttft/" + CauseLongPrefillAhead,
		"stall/" + CausePrefillInterference, "stall/" + CausePreemption, "stall/" + CauseUnexplained} {
		if count[k] < 50 {
			t.Errorf("%s: %d slow events, want at least 50", k, count[k])
		}
	}
	if count["ttft/"+CausePrefillInterference] > 0 || count["stall/"+CauseLongPrefillAhead] > 0 || count["stall/"+CauseQueue] > 0 {
		t.Errorf("a cause on the wrong kind of event: %v", count)
	}
}

// A scaled scenario keeps its shape: every duration times f.
func TestScenarioScaled(t *testing.T) {
	sc := CausesScenario()
	h := sc.Scaled(0.5)
	if h.Config.DecodeBase != sc.Config.DecodeBase/2 || h.Config.PrefillPerToken != sc.Config.PrefillPerToken/2 || h.ConnectDelay != sc.ConnectDelay/2 ||
		h.SlowTTFT != sc.SlowTTFT/2 || h.Requests[25].At != sc.Requests[25].At/2 || sc.Requests[25].At == 0 || h.Requests[25].ID != sc.Requests[25].ID {
		t.Fatalf("scaled: %+v", h.Config)
	}
	if h.Config.MaxBatch != sc.Config.MaxBatch || h.Config.KVCapacityTokens != sc.Config.KVCapacityTokens {
		t.Fatal("scaling changed a count")
	}
}

// ScenarioRequest.Body's prompt is PromptTokens tokens as the server
// counts them.
func TestScenarioBodyPromptTokens(t *testing.T) {
	for _, n := range []int{1, 16, 8000} {
		var req chatRequest
		body := ScenarioRequest{PromptTokens: n, MaxTokens: 3}.Body()
		if err := json.Unmarshal([]byte(body), &req); err != nil {
			t.Fatal(err)
		}
		if got := req.promptTokens(); got != n || *req.MaxTokens != 3 || !req.Stream {
			t.Errorf("%d prompt tokens: the server counts %d", n, got)
		}
	}
}

// Drive names every request that did not come back whole: here the
// simulator's answer is right for one and the other asked a server
// that refuses it.
func TestDriveReportsEveryFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewEngine(fast())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		sim := NewServer(e)
		pn := NewPipes()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Request-Id") == "refused" {
				http.Error(w, "no", http.StatusServiceUnavailable)
				return
			}
			sim.ServeHTTP(w, r)
		})}
		go srv.Serve(pn)
		defer func() { srv.Close(); pn.Close() }()
		tr := &http.Transport{DialContext: pn.Dial}
		defer tr.CloseIdleConnections()
		sc := Scenario{Requests: []ScenarioRequest{{ID: "fine", PromptTokens: 4, MaxTokens: 3}, {At: ms, ID: "refused", PromptTokens: 4, MaxTokens: 3}}}
		err := sc.Drive(&http.Client{Transport: tr}, "http://sim")
		if err == nil || strings.Contains(err.Error(), "fine") || !strings.Contains(err.Error(), "refused: status 503, 0 tokens of 3") {
			t.Fatalf("Drive: %v", err)
		}
	})
}
