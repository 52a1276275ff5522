package simengine

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Scenario is a named workload for the simulator with the settings it
// needs: a test drives Requests (Drive: each at its At, with its ID in
// X-Request-Id) through a client whose connections come from
// Engine.Dialer(…, ConnectDelay, ConnectShare) to a Server of
// NewEngine(Config) with keep-alives off (under testing/synctest, over
// Pipes), then compares what it measured with Engine.Truth (SlowEvents
// cuts the slow events out of it with SlowTTFT and Stall as the
// thresholds).
type Scenario struct {
	Name   string
	Config Config
	// ConnectDelay and ConnectShare are Engine.Dialer's: the set-up delay
	// of a share of the new connections.
	ConnectDelay time.Duration
	ConnectShare float64
	// SlowTTFT and Stall are the thresholds the scenario is built around:
	// a first token later than SlowTTFT, a gap longer than Stall is slow.
	SlowTTFT, Stall time.Duration
	// Requests in the order of At.
	Requests []ScenarioRequest
}

// ScenarioRequest is one request of a Scenario: sent At after the
// scenario's start, with ID as its X-Request-Id, a streamed completion
// (Body) of PromptTokens prompt tokens (as the simulator counts them,
// its prefix cache off) and exactly MaxTokens output tokens.
type ScenarioRequest struct {
	At                      time.Duration
	ID                      string
	PromptTokens, MaxTokens int
}

// ScenarioPath is where a ScenarioRequest is sent.
const ScenarioPath = "/v1/completions"

// Body is the request's JSON body: a streamed completion whose prompt is
// PromptTokens tokens at the simulator's 4 bytes a token (the quotes
// count), with ignore_eos and usage.
func (r ScenarioRequest) Body() string {
	return fmt.Sprintf(`{"model":"tokentap-sim","prompt":"%s","max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`,
		strings.Repeat("x", max(0, 4*r.PromptTokens-2)), r.MaxTokens)
}

// CausesScenarioName names CausesScenario.
const CausesScenarioName = "causes"

// CausesScenario mixes every cause of a slow first token or stall that
// the simulator models, each in episodes of its own that the next does
// not overlap, 64 rounds of 6 s (384 s of the simulator's time: run it
// under testing/synctest, or Scaled). Each round:
//
//   - at 0 s, queue: four requests fill the batch of 4 (16 prompt
//     tokens, 40 output tokens: about 0.6 s), two more come 50 ms later
//     and wait for them (about 0.5 s of queue each);
//   - at 1 s, a long prefill: S streams (16 prompt tokens, 40 output),
//     L (8,000 prompt tokens: 405 ms of prefill, unchunked) comes at
//     1.1 s, and Q (16 tokens) at 1.11 s: S stalls for L's prefill
//     (prefill_interference, Ref L) and Q's first token waits for it
//     (long_prefill_ahead, Ref L); L's own first token is slow by its
//     own prefill, which is no cause (TTFTCause "");
//   - at 2 s, preemption: A and B (5,950 prompt tokens, 80 output) fill
//     the KV cache of 12,000 tokens as they generate: B is preempted
//     after about 50 tokens, waits for A to finish and recomputes (a
//     preemption stall of its own), and A's gap while B is first
//     admitted is prefill_interference (Ref B); B's first token waits
//     for A's prefill (long_prefill_ahead, Ref A);
//   - from 4.5 s, connection: eight short requests 150 ms apart.
//
// Every 4th connection (ConnectShare 0.25; with keep-alives off, every
// request dials) waits 250 ms to be set up: the calm requests that get
// one are slow by their connection alone; in the other episodes the
// delay adds to their own causes and shifts when they arrive, which is
// part of the mix. The engine hiccups (StallProb 0.003 a step, 250 ms):
// a running sequence's gap that nothing else explains is unexplained.
// There is no jitter, no coalescing, no error, no natural end.
// Thresholds: 150 ms for both. In the simulator's own truth
// (TestCausesScenario) its slow events are, by cause: first tokens 303
// connection, 144 queue, 100 long_prefill_ahead, 4 to 6 unexplained and
// 92 slow by their own long prompt (no cause); stalls 191 or 192
// prefill_interference, 128 preemption, 109 or 110 unexplained. (Drive
// sends the requests due at one instant 1 µs apart, so on a fake clock
// they dial in their order and the counts stay the same from run to
// run; in real time a few move by one or two.)
func CausesScenario() Scenario {
	cfg := Config{
		Model: "tokentap-sim", MaxBatch: 4, MaxQueue: 64, RejectStatus: 429,
		PrefillBase: 5 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond,
		DecodeBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond,
		StallProb: 0.003, StallDuration: 250 * time.Millisecond, MaxTokens: 16, Seed: 1, KVCapacityTokens: 12000,
	}
	sc := Scenario{Name: CausesScenarioName, Config: cfg, ConnectDelay: 250 * time.Millisecond, ConnectShare: 0.25,
		SlowTTFT: 150 * time.Millisecond, Stall: 150 * time.Millisecond}
	const rounds, round = 64, 7 * time.Second
	for r := range rounds {
		t0 := time.Duration(r) * round
		add := func(at time.Duration, name string, prompt, out int) {
			sc.Requests = append(sc.Requests, ScenarioRequest{At: t0 + at, ID: fmt.Sprintf("r%02d-%s", r, name), PromptTokens: prompt, MaxTokens: out})
		}
		for i := range 6 {
			add(0, fmt.Sprintf("hog%d", i), 16, 30)
		}
		add(50*time.Millisecond, "wait0", 16, 4)
		add(50*time.Millisecond, "wait1", 16, 4)
		add(1500*time.Millisecond, "S", 16, 40)
		add(1600*time.Millisecond, "L", 8000, 4)
		add(1610*time.Millisecond, "Q", 16, 4)
		add(2450*time.Millisecond, "C", 16, 160)
		add(2500*time.Millisecond, "A", 5950, 80)
		add(2501*time.Millisecond, "B", 5950, 80)
		for i := range 8 {
			add(5500*time.Millisecond+time.Duration(i)*150*time.Millisecond, fmt.Sprintf("conn%d", i), 16, 4)
		}
	}
	return sc
}

// Scaled returns sc with every duration (the engine's costs, the
// connection delay, the thresholds, the requests' instants) multiplied
// by f: a scenario to run in real time, faster (f < 1) or more robust to
// a busy machine (f > 1). The causes stay the same where the machine
// keeps to the scaled steps.
func (sc Scenario) Scaled(f float64) Scenario {
	s := func(d *time.Duration) { *d = time.Duration(float64(*d) * f) }
	c := &sc.Config
	for _, d := range []*time.Duration{&c.PrefillBase, &c.PrefillPerToken, &c.DecodeBase, &c.DecodePerSeq, &c.StallDuration,
		&sc.ConnectDelay, &sc.SlowTTFT, &sc.Stall} {
		s(d)
	}
	reqs := make([]ScenarioRequest, len(sc.Requests))
	for i, r := range sc.Requests {
		s(&r.At)
		reqs[i] = r
	}
	sc.Requests = reqs
	return sc
}

// Drive sends sc's requests through client to base (the simulator's
// Server, or a proxy in front of it), each at its At after the call
// (time.Sleep: under testing/synctest, the bubble's clock), with its ID
// in X-Request-Id, reads each answer whole (at most 1 MiB) and returns
// once all have ended: an error for each request that did not stream
// its MaxTokens tokens with a 200 and its ID back in X-Sim-Request-Id.
func (sc Scenario) Drive(client *http.Client, base string) error {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(sc.Requests))
	var same time.Duration // requests before this one at its instant, in µs
	for i, r := range sc.Requests {
		// Requests due at one instant go 1 µs apart, in their order: on a
		// fake clock (testing/synctest) each has dialed before the next
		// starts, so which connection is slow does not depend on the
		// order goroutines run in.
		if i > 0 && r.At == sc.Requests[i-1].At {
			same += time.Microsecond
		} else {
			same = 0
		}
		time.Sleep(time.Until(start.Add(r.At + same)))
		wg.Go(func() { errs[i] = r.send(client, base) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// send sends r and checks its answer.
func (r ScenarioRequest) send(client *http.Client, base string) error {
	req, err := http.NewRequest("POST", base+ScenarioPath, strings.NewReader(r.Body()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", r.ID)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", r.ID, err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	tokens := 0
	var f stream.Framer
	f.Feed(b, func(ev *stream.Event) {
		var c stream.Chunk
		stream.ParseOpenAI(ev.Data, &c)
		if c.Output {
			tokens++
		}
	})
	if id := resp.Header.Get("X-Sim-Request-Id"); err != nil || resp.StatusCode != 200 || tokens != r.MaxTokens || id != r.ID {
		return fmt.Errorf("%s: status %d, %d tokens of %d, X-Sim-Request-Id %q, read error %v", r.ID, resp.StatusCode, tokens, r.MaxTokens, id, err)
	}
	return nil
}

// SlowEvent is a slow first token or stall in the ground truth: What is
// "ttft" or "stall", ID the request's, At the stall's start (the
// request's arrival at the engine for a first token), Dur the first
// token's time from the client's connecting (the connection's set-up
// delay plus Truth.TTFT) or the stall's, Cause and Ref the truth's (""
// for a first token slow by the request's own work alone).
type SlowEvent struct {
	What, ID   string
	At         time.Time
	Dur        time.Duration
	Cause, Ref string
}

// SlowEvents returns the first tokens later than slowTTFT and the gaps
// longer than stall in ts, with their true causes, in the order of ts.
func SlowEvents(ts []Truth, slowTTFT, stall time.Duration) []SlowEvent {
	var out []SlowEvent
	for _, t := range ts {
		ttft := t.TTFT
		for _, d := range t.TTFTDelays {
			if d.Cause == CauseConnection {
				ttft += d.Dur
			}
		}
		if t.TTFT > 0 && ttft > slowTTFT {
			out = append(out, SlowEvent{What: "ttft", ID: t.ID, At: t.Arrive, Dur: ttft, Cause: t.TTFTCause, Ref: t.TTFTRef})
		}
		for _, s := range t.Stalls {
			if s.Dur > stall {
				out = append(out, SlowEvent{What: "stall", ID: t.ID, At: s.Start, Dur: s.Dur, Cause: s.Cause, Ref: s.Ref})
			}
		}
	}
	return out
}
