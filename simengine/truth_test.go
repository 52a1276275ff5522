package simengine

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

const ms = time.Millisecond

// submitID queues a request with the client id id.
func submitID(t *testing.T, e *Engine, ctx context.Context, id string, prompt, maxTokens int) *seq {
	t.Helper()
	s, ok := e.submitRequest(ctx, request{prompt: prompt, maxTokens: maxTokens, ignoreEOS: true, id: id})
	if !ok {
		t.Fatalf("%s rejected", id)
	}
	return s
}

// truthOf returns id's entry of e.Truth().
func truthOf(t *testing.T, e *Engine, id string) Truth {
	t.Helper()
	for _, tr := range e.Truth() {
		if tr.ID == id {
			return tr
		}
	}
	t.Fatalf("no truth for %s in %+v", id, e.Truth())
	return Truth{}
}

// drain reads s to its end on its own goroutine and returns what it saw:
// the instant of each token event.
func drain(s *seq) <-chan []time.Time {
	c := make(chan []time.Time, 1)
	go func() {
		var at []time.Time
		for range s.out {
			at = append(at, time.Now())
		}
		c <- at
	}()
	return c
}

// quiet() with a batch of 4 (so nothing queues): S decodes alone, 25 ms a
// step (20 + 5), its first token at 45 ms (25 + its prefill 10 + 10), the
// next at 70 and 95. L (1,000 prompt tokens) arrives at 80 ms, during
// S's step 70-95, and is admitted at 95: that step decodes two (30 ms)
// and prefills L whole (10 + 1,000 ms), so S's next token comes at 1,135,
// a gap of 1,040 ms of which 1,010 are L's prefill. Q (10 tokens)
// arrives at 100, during L's step: it waits 1,035 ms for the step's end,
// of which the 1,010 of L's prefill are long_prefill_ahead (the rest is
// the step it would have waited for anyway), and is admitted at 1,135:
// 35 ms of decode (three running) + its own 20 of prefill: first token
// at 1,190, a TTFT of 1,090 ms. S's next gap (Q's admitting step) is
// 55 ms: 20 of them Q's prefill. L's own TTFT (1,055 ms) is its own
// work: no cause.
func TestUnchunkedLongPrefillStallsTheBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch = 4
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		t0 := time.Now()
		sTokens := drain(submitID(t, e, ctx, "S", 10, 6))
		time.Sleep(80 * ms)
		lTokens := drain(submitID(t, e, ctx, "L", 1000, 2))
		time.Sleep(20 * ms)
		qTokens := drain(submitID(t, e, ctx, "Q", 10, 2))
		at := <-sTokens
		<-lTokens
		<-qTokens
		var gaps []time.Duration
		for i := 1; i < len(at); i++ {
			gaps = append(gaps, at[i].Sub(at[i-1]))
		}
		if fmt.Sprint(gaps) != "[25ms 25ms 1.04s 55ms 30ms]" {
			t.Fatalf("S's gaps %v, want [25ms 25ms 1.04s 55ms 30ms]", gaps)
		}
		s := truthOf(t, e, "S")
		want := []TruthStall{
			{Start: t0.Add(95 * ms), Dur: 1040 * ms, Cause: CausePrefillInterference, Ref: "L", Excess: 1010 * ms},
			{Start: t0.Add(1135 * ms), Dur: 55 * ms, Cause: CausePrefillInterference, Ref: "Q", Excess: 20 * ms},
		}
		if fmt.Sprint(s.Stalls) != fmt.Sprint(want) || s.TTFTCause != "" || s.End != "length" {
			t.Errorf("S's truth %+v,\nwant stalls %+v", s, want)
		}
		q := truthOf(t, e, "Q")
		if q.TTFT != 1090*ms || q.TTFTCause != CauseLongPrefillAhead || q.TTFTRef != "L" ||
			fmt.Sprint(q.TTFTDelays) != fmt.Sprint([]TruthDelay{{CauseLongPrefillAhead, 1010 * ms, "L"}}) {
			t.Errorf("Q's truth %+v", q)
		}
		if l := truthOf(t, e, "L"); l.TTFT != 1055*ms || l.TTFTCause != "" || len(l.TTFTDelays) != 0 {
			t.Errorf("L's truth %+v: its own prefill is no cause", l)
		}
	})
}

// Chunked prefill of 100 tokens a step: L's 1,000 tokens take ten steps,
// and S's gaps while they run are one chunk each: 140 ms (30 of decode,
// L's 10 + 100 ms) then nine of 130 ms, where unchunked it waited
// 1,040 ms once. L's first token comes at 95 + 140 + 9 × 130 = 1,405.
func TestChunkedPrefillShrinksTheStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.PrefillChunkTokens = 4, 100
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		t0 := time.Now()
		sTokens := drain(submitID(t, e, ctx, "S", 10, 16))
		time.Sleep(80 * ms)
		lTokens := drain(submitID(t, e, ctx, "L", 1000, 2))
		at := <-sTokens
		lAt := <-lTokens
		if got := lAt[0].Sub(t0); got != 1405*ms {
			t.Errorf("L's first token at %v, want 1.405s", got)
		}
		var gaps []time.Duration
		for i := 1; i < len(at); i++ {
			gaps = append(gaps, at[i].Sub(at[i-1]))
		}
		want := "[25ms 25ms 140ms 130ms 130ms 130ms 130ms 130ms 130ms 130ms 130ms 130ms 30ms 25ms 25ms]"
		if fmt.Sprint(gaps) != want {
			t.Fatalf("S's gaps %v, want %s", gaps, want)
		}
		s := truthOf(t, e, "S")
		if len(s.Stalls) != 10 {
			t.Fatalf("S's stalls %+v, want the ten of L's chunks", s.Stalls)
		}
		for i, st := range s.Stalls {
			excess := 100 * ms
			if i == 0 {
				excess = 110 * ms
			}
			if st.Cause != CausePrefillInterference || st.Ref != "L" || st.Excess != excess || st.Dur != excess+30*ms {
				t.Errorf("stall %d: %+v, want %v of L's prefill", i, st, excess)
			}
		}
	})
}

// With chunked prefill, a short prompt admitted behind a long one waits
// for the budget L's chunks take: its first token comes after L's
// prefill, each step of the wait long_prefill_ahead.
func TestChunkedPrefillQueuesBehindTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.PrefillChunkTokens = 4, 100
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		lTokens := drain(submitID(t, e, ctx, "L", 250, 2))
		time.Sleep(ms) // L's first step (10 + 100 ms of prefill, 25 of decode) runs
		qTokens := drain(submitID(t, e, ctx, "Q", 10, 2))
		<-lTokens
		<-qTokens
		// Q arrives 1 ms into L's first step: it waits the rest (110 ms
		// of L's prefill, then 24 of the decode, alignment); then step 2
		// (L's 100 tokens, Q none: 100 + 30 ms), step 3 (L's last 50,
		// Q's 10 + 10, 30 of decode: Q's first token at 365 ms).
		q := truthOf(t, e, "Q")
		want := []TruthDelay{{CauseLongPrefillAhead, 110*ms + 130*ms + 50*ms, "L"}}
		if fmt.Sprint(q.TTFTDelays) != fmt.Sprint(want) || q.TTFT != 364*ms {
			t.Errorf("Q's truth %+v, want delays %+v and TTFT 364ms", q, want)
		}
	})
}

// MaxBatch 1, MaxQueue 2: A runs (first token at 36 ms: 25 of decode, 11
// of prefill; its five tokens end at 136); B and C arrive at 40, during a
// step that prefills nothing, and queue; D is refused. B waits the
// steps 61-136 (75 ms of queue), then runs 36 + 4 × 25 ms; C waits until
// 272: 211 ms of queue. The log has A, B and C in arrival order.
func TestQueueBoundAndQueueTruth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.MaxQueue = 1, 2
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		done := []<-chan []time.Time{drain(submitID(t, e, ctx, "A", 1, 5))}
		time.Sleep(40 * ms)
		done = append(done, drain(submitID(t, e, ctx, "B", 1, 5)), drain(submitID(t, e, ctx, "C", 1, 5)))
		if _, ok := e.submitRequest(ctx, request{prompt: 1, maxTokens: 5, id: "D"}); ok {
			t.Fatal("D accepted past the batch of 1 and the queue of 2")
		}
		if running, waiting := e.Load(); running != 1 || waiting != 2 {
			t.Fatalf("load %d running, %d waiting", running, waiting)
		}
		for _, c := range done {
			<-c
		}
		var ids []string
		for _, tr := range e.Truth() {
			ids = append(ids, tr.ID)
		}
		if fmt.Sprint(ids) != "[A B C]" {
			t.Errorf("truth log %v, want [A B C]", ids)
		}
		for _, c := range []struct {
			id         string
			queue, ttf time.Duration
		}{{"B", 75 * ms, 132 * ms}, {"C", 211 * ms, 268 * ms}} {
			tr := truthOf(t, e, c.id)
			if tr.TTFTCause != CauseQueue || fmt.Sprint(tr.TTFTDelays) != fmt.Sprint([]TruthDelay{{CauseQueue, c.queue, ""}}) || tr.TTFT != c.ttf {
				t.Errorf("%s: %+v, want %v of queue, TTFT %v", c.id, tr, c.queue, c.ttf)
			}
		}
	})
}

// The KV preemption of TestPreemptionWhenKVFull in the truth: the
// preempted sequence's long gap is a preemption stall whose duration is
// the gap its client saw, and a sequence whose step recomputed it has a
// preemption stall pointing to it.
func TestPreemptionTruth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.KVCapacityTokens = 4, 30
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		ids := []string{"P0", "P1", "P2"}
		var done []<-chan []time.Time
		for _, id := range ids {
			done = append(done, drain(submitID(t, e, ctx, id, 5, 8)))
		}
		seen := map[string][]time.Time{}
		for i, c := range done {
			seen[ids[i]] = <-c
		}
		if _, _, p := e.KV(); p == 0 {
			t.Fatal("no preemption")
		}
		var victim string
		for _, id := range ids {
			tr := truthOf(t, e, id)
			for _, st := range tr.Stalls {
				if st.Cause != CausePreemption {
					continue
				}
				if st.Ref == "" { // its own preemption: the gap its client saw
					victim = id
					found := false
					for i := 1; i < len(seen[id]); i++ {
						found = found || (seen[id][i-1].Equal(st.Start) && seen[id][i].Sub(seen[id][i-1]) == st.Dur)
					}
					if !found || st.Excess <= 0 {
						t.Errorf("%s's preemption stall %+v is no gap its client saw (%v)", id, st, seen[id])
					}
				}
			}
		}
		if victim == "" {
			t.Fatal("no sequence has a preemption stall of its own")
		}
	})
}

// The truth log keeps the last 4096 requests, oldest first.
func TestTruthLogBounded(t *testing.T) {
	e := NewEngine(quiet())
	for i := range truthLogSize + 3 {
		e.logTruth(&Truth{ID: fmt.Sprint(i)})
	}
	ts := e.Truth()
	if len(ts) != truthLogSize || ts[0].ID != "3" || ts[len(ts)-1].ID != fmt.Sprint(truthLogSize+2) {
		t.Fatalf("%d entries, first %s last %s", len(ts), ts[0].ID, ts[len(ts)-1].ID)
	}
}

// Engine.Dialer over loopback, the server's keep-alives off so every
// request dials: with share 0.5 the 2nd and 4th connections wait 40 ms
// (the client's wait for its connection says so), and those requests'
// truth has a connection delay of 40 ms. The client's X-Request-Id is
// the id and comes back in X-Sim-Request-Id; one unusable (a space in
// it) is replaced by the engine's own.
func TestDialerConnectionTruth(t *testing.T) {
	e := NewEngine(fast())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	srv := httptest.NewUnstartedServer(NewServer(e))
	srv.Config.SetKeepAlivesEnabled(false)
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: e.Dialer((&net.Dialer{}).DialContext, 40*ms, 0.5)}}
	ids := []string{"c1", "c2", "c3", "c4", "bad id"}
	for i, id := range ids {
		var getConn, gotConn time.Time
		trace := &httptrace.ClientTrace{GetConn: func(string) { getConn = time.Now() }, GotConn: func(httptrace.GotConnInfo) { gotConn = time.Now() }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "POST", srv.URL+"/v1/completions",
			strings.NewReader(`{"prompt":"hi","max_tokens":2,"stream":true}`))
		req.Header.Set("X-Request-Id", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := id
		if id == "bad id" {
			want = "sim-5"
		}
		if got := resp.Header.Get("X-Sim-Request-Id"); got != want {
			t.Errorf("request %d: X-Sim-Request-Id %q, want %q", i, got, want)
		}
		if slow := i%2 == 1; slow && gotConn.Sub(getConn) < 40*ms {
			t.Errorf("request %d: waited %v for its connection, want at least 40ms", i, gotConn.Sub(getConn))
		}
	}
	ts := e.Truth()
	if len(ts) != 5 {
		t.Fatalf("%d truths", len(ts))
	}
	for i, tr := range ts {
		var want []TruthDelay
		if i%2 == 1 {
			want = []TruthDelay{{CauseConnection, 40 * ms, ""}}
		}
		if fmt.Sprint(tr.TTFTDelays) != fmt.Sprint(want) {
			t.Errorf("%s: delays %+v, want %+v", tr.ID, tr.TTFTDelays, want)
		}
	}
}

func TestValidRequestID(t *testing.T) {
	for id, ok := range map[string]bool{"a": true, "req-0001_x.y": true, "": false, "a b": false, "é": false,
		strings.Repeat("x", 128): true, strings.Repeat("x", 129): false, "a\x00": false} {
		if validRequestID(id) != ok {
			t.Errorf("validRequestID(%q) = %v", id, !ok)
		}
	}
}

// Every step hiccups (StallProb 1, 1 s): each of a lone sequence's 39
// gaps is a stall of 1.025 s, 1 s of it unexplained; the first 32 are
// kept, 7 counted.
func TestHiccupStallsAndTheirBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.StallProb = 1
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		<-drain(submitID(t, e, ctx, "H", 1, 40))
		h := truthOf(t, e, "H")
		if len(h.Stalls) != maxTruthStalls || h.StallsDropped != 39-maxTruthStalls {
			t.Fatalf("%d stalls kept, %d dropped", len(h.Stalls), h.StallsDropped)
		}
		for _, st := range h.Stalls {
			if st.Cause != CauseUnexplained || st.Excess != time.Second || st.Dur != 1025*ms || st.Ref != "" {
				t.Fatalf("stall %+v", st)
			}
		}
		// Its first token waited for its own step's hiccup too.
		if h.TTFTCause != CauseUnexplained || h.TTFT != 1036*ms {
			t.Errorf("TTFT %v cause %q", h.TTFT, h.TTFTCause)
		}
	})
}
