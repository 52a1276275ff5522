// Package simengine is a simulated inference engine that speaks the
// OpenAI Chat Completions and Completions APIs, streaming and not. It is
// the sidecar's default upstream when none is given, and the main fixture
// of the tests, so it behaves like an engine rather than a sleep loop:
//
//   - continuous batching: at most MaxBatch sequences decode together;
//     more wait in a queue of at most MaxQueue, and arrivals past that are
//     rejected with 429 (or RejectStatus);
//   - a request's first token comes out of the engine step that admits it,
//     and that step also pays its prefill (PrefillBase + PrefillPerToken ×
//     prompt tokens), so TTFT grows with prompt length and with queueing
//     past the batch size, and every running sequence feels the prefill of
//     the others (head-of-line blocking, as in a real engine);
//   - each decode step takes DecodeBase + DecodePerSeq × running sequences,
//     with relative Jitter, so per-token time grows with batch occupancy;
//   - a step stalls (StallDuration) with probability StallProb, like a
//     preemption or a recompute;
//   - with probability MultiTokenProb an event is held and sent together
//     with the next token(s), like vLLM's output coalescing;
//   - with probability ErrorProb a request fails mid-stream with an error
//     event after HTTP 200, as vLLM does;
//   - the usage chunk comes when stream_options.include_usage asks for it.
package simengine

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tokentap/tokentap/config"
)

// Config is the simulator section; it lives in package config (a leaf).
type Config = config.Simulator

// simEvent is what the engine hands to a request's HTTP handler.
type simEvent struct {
	tokens []int  // token indices into the vocabulary
	finish string // "stop" or "length" on the last event
	err    bool   // an engine failure: the request ends here
}

type seq struct {
	ctx       context.Context
	prompt    int
	maxTokens int
	ignoreEOS bool
	failAt    int // fail after this many tokens; -1 never
	generated int
	buffered  []int
	out       chan simEvent
	rng       *rand.Rand
}

// Engine is the continuous-batching model. Create it with NewEngine and
// stop it by cancelling the context given to Run.
type Engine struct {
	cfg     Config
	mu      sync.Mutex
	waiting []*seq
	wake    chan struct{}
	rng     *rand.Rand
	seeds   uint64

	// observable state, for tests and /metrics-like introspection
	running, queued int
}

// NewEngine returns an engine; call Run to start its step loop.
func NewEngine(cfg Config) *Engine {
	cfg = cfg.WithDefaults()
	return &Engine{cfg: cfg, wake: make(chan struct{}, 1), rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
}

// Config returns the engine's effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// submit queues a request, or reports that the queue is full.
func (e *Engine) submit(ctx context.Context, prompt, maxTokens int, ignoreEOS bool) (*seq, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.waiting) >= e.cfg.MaxQueue+max(0, e.cfg.MaxBatch-e.running) {
		return nil, false
	}
	e.seeds++
	r := rand.New(rand.NewPCG(e.cfg.Seed, e.seeds))
	s := &seq{ctx: ctx, prompt: prompt, maxTokens: maxTokens, ignoreEOS: ignoreEOS, failAt: -1,
		out: make(chan simEvent, maxTokens+2), rng: r}
	if r.Float64() < e.cfg.ErrorProb && maxTokens > 1 {
		s.failAt = 1 + r.IntN(maxTokens-1)
	}
	e.waiting = append(e.waiting, s)
	e.queued = len(e.waiting)
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return s, true
}

// Load reports the number of running and waiting sequences.
func (e *Engine) Load() (running, waiting int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running, len(e.waiting)
}

// Run steps the engine until ctx is done.
func (e *Engine) Run(ctx context.Context) {
	var running []*seq
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		e.mu.Lock()
		var prefill time.Duration
		for len(running) < e.cfg.MaxBatch && len(e.waiting) > 0 {
			s := e.waiting[0]
			e.waiting = e.waiting[1:]
			if s.ctx.Err() != nil {
				close(s.out)
				continue
			}
			running = append(running, s)
			prefill += e.cfg.PrefillBase + time.Duration(s.prompt)*e.cfg.PrefillPerToken
		}
		e.running = len(running)
		e.mu.Unlock()
		if len(running) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-e.wake:
				continue
			}
		}
		step := e.cfg.DecodeBase + time.Duration(len(running))*e.cfg.DecodePerSeq
		if e.cfg.Jitter > 0 {
			step = time.Duration(float64(step) * (1 + e.cfg.Jitter*(2*e.rng.Float64()-1)))
		}
		step += prefill
		if e.cfg.StallProb > 0 && e.rng.Float64() < e.cfg.StallProb {
			step += e.cfg.StallDuration
		}
		timer.Reset(step)
		select {
		case <-ctx.Done():
			timer.Stop()
			for _, s := range running {
				close(s.out)
			}
			return
		case <-timer.C:
		}
		kept := running[:0]
		for _, s := range running {
			if s.ctx.Err() != nil {
				close(s.out)
				continue
			}
			if e.advance(s) {
				kept = append(kept, s)
			} else {
				close(s.out)
			}
		}
		for i := len(kept); i < len(running); i++ {
			running[i] = nil
		}
		running = kept
	}
}

// advance gives s one token and reports whether it keeps running.
func (e *Engine) advance(s *seq) bool {
	if s.failAt >= 0 && s.generated >= s.failAt {
		s.out <- simEvent{tokens: s.buffered, err: true}
		return false
	}
	s.generated++
	s.buffered = append(s.buffered, s.rng.IntN(len(vocabulary)))
	finish := ""
	switch {
	case s.generated >= s.maxTokens:
		finish = "length"
	case !s.ignoreEOS && s.generated > 1 && s.rng.Float64() < e.cfg.EOSProb:
		finish = "stop"
	}
	if finish == "" && e.cfg.MultiTokenProb > 0 && s.rng.Float64() < e.cfg.MultiTokenProb {
		return true // coalesce with the next token
	}
	s.out <- simEvent{tokens: s.buffered, finish: finish}
	s.buffered = nil
	return finish == ""
}

var vocabulary = []string{
	" the", " engine", " streams", " tokens", " quickly", " and", " the", " sidecar",
	" measures", " every", " gap", " between", " them", ",", " while", " users",
	" read", " along", ".", " A", " queue", " forms", " when", " batches", " fill",
	" up", " so", " latency", " grows", " with", " load", " again",
}
