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
//     hiccup of the GPU or the host;
//   - KV cache: every running sequence holds its prompt and generated
//     tokens, at most KVCapacityTokens together. A waiting request is
//     admitted only when its tokens fit; when a decode step would need
//     more, the most recently admitted sequence is preempted (vLLM v1's
//     FCFS policy): its KV is freed, it goes back to the head of the
//     queue, and when readmitted it pays the prefill of its prompt and
//     the tokens it had generated (recompute). Its client sees a stall:
//     the wait plus the recompute;
//   - a prefix cache (PrefixCacheBlocks; off by default), vLLM's
//     automatic prefix caching: the cached leading blocks of a prompt
//     skip prefill (prefix.go);
//   - a vLLM-style /metrics (Metrics): vllm:num_requests_running,
//     vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
//     vllm:num_preemptions_total, the request outcomes and the engine-side
//     TTFT and inter-token latency histograms, and with the prefix cache
//     on vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total;
//   - with probability MultiTokenProb an event is held and sent together
//     with the next token(s), like vLLM's output coalescing;
//   - with probability ErrorProb a request fails mid-stream with an error
//     event after HTTP 200, as vLLM does;
//   - the usage chunk comes when stream_options.include_usage asks for it.
package simengine

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	keys      []uint64 // the prompt's full blocks (prefix.go); nil with the cache off
	preempted bool     // preempted at least once
	maxTokens int
	ignoreEOS bool
	failAt    int // fail after this many tokens; -1 never
	generated int
	buffered  []int
	out       chan simEvent
	rng       *rand.Rand
	arrive    time.Time // for the engine-side TTFT
	lastToken time.Time // for the engine-side inter-token latency
}

// kv is the tokens a sequence holds in the KV cache.
func (s *seq) kv() int { return s.prompt + s.generated }

// Engine is the continuous-batching model. Create it with NewEngine and
// stop it by cancelling the context given to Run.
type Engine struct {
	cfg     Config
	mu      sync.Mutex
	waiting []*seq
	wake    chan struct{}
	rng     *rand.Rand
	seeds   uint64

	// observable state, for tests and /metrics
	running, queued int
	kvUsed          int    // tokens the running sequences hold
	preemptions     uint64 // sequences preempted since the start

	// the prefix cache: nil when off; used by Run's admission, read by
	// PrefixLog and /metrics, under mu
	cache                     *prefixCache
	seed                      maphash.Seed // of the block keys
	prefixQueries, prefixHits uint64       // tokens, as vLLM counts them
	prefixLog                 []PrefixLookup
	prefixNext                int // next slot of prefixLog once full

	m *simMetrics
}

// NewEngine returns an engine; call Run to start its step loop.
func NewEngine(cfg Config) *Engine {
	cfg = cfg.WithDefaults()
	e := &Engine{cfg: cfg, wake: make(chan struct{}, 1), rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), seed: maphash.MakeSeed()}
	if cfg.PrefixCacheBlocks > 0 {
		e.cache = newPrefixCache(cfg.PrefixCacheBlocks)
	}
	e.m = newSimMetrics(e)
	return e
}

// Registry holds the engine's vLLM-style metrics (served at /metrics).
func (e *Engine) Registry() *prometheus.Registry { return e.m.reg }

// KV reports the tokens held in the KV cache, its capacity and the
// preemptions so far.
func (e *Engine) KV() (used, capacity int, preemptions uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kvUsed, e.cfg.KVCapacityTokens, e.preemptions
}

// Config returns the engine's effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// PrefixLog returns the last lookups of the prefix cache (at most
// 4096), oldest first; nil when the cache is off.
func (e *Engine) PrefixLog() []PrefixLookup {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.prefixLog) < prefixLogSize {
		return append([]PrefixLookup(nil), e.prefixLog...)
	}
	return append(append([]PrefixLookup(nil), e.prefixLog[e.prefixNext:]...), e.prefixLog[:e.prefixNext]...)
}

// PrefixCounters returns vLLM's prefix-cache counters: the tokens
// queried and the tokens hit, of requests not preempted before.
func (e *Engine) PrefixCounters() (queries, hits uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.prefixQueries, e.prefixHits
}

// lookup looks s's blocks up in the prefix cache and touches them, and
// returns the tokens it need not prefill. Called with e.mu held.
func (e *Engine) lookup(s *seq) int {
	if e.cache == nil {
		return 0
	}
	bt := e.cfg.PrefixCacheBlockTokens
	hits := e.cache.lookup(s.keys, (s.prompt-1)/bt)
	e.cache.touch(s.keys)
	l := PrefixLookup{Blocks: len(s.keys), Hits: hits, Tokens: s.prompt, HitTokens: hits * bt, Preempted: s.preempted}
	if !s.preempted {
		e.prefixQueries += uint64(l.Tokens)
		e.prefixHits += uint64(l.HitTokens)
	}
	if len(e.prefixLog) < prefixLogSize {
		e.prefixLog = append(e.prefixLog, l)
	} else {
		e.prefixLog[e.prefixNext] = l
		e.prefixNext = (e.prefixNext + 1) % prefixLogSize
	}
	return l.HitTokens
}

// submit queues a request, or reports that the queue is full; keys are
// its prompt's blocks (prefixKeys).
func (e *Engine) submit(ctx context.Context, prompt int, keys []uint64, maxTokens int, ignoreEOS bool) (*seq, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.waiting) >= e.cfg.MaxQueue+max(0, e.cfg.MaxBatch-e.running) {
		return nil, false
	}
	e.seeds++
	r := rand.New(rand.NewPCG(e.cfg.Seed, e.seeds))
	// Room for every event the sequence can produce unread, so that the
	// step loop never waits on a handler; max_tokens is the client's
	// claim (2^63-1 overflowed the +2), so the room is bounded by what
	// the KV cache can hold (only a lone sequence generates past it).
	room := min(maxTokens, e.cfg.KVCapacityTokens) + 2
	s := &seq{ctx: ctx, prompt: prompt, keys: keys, maxTokens: maxTokens, ignoreEOS: ignoreEOS, failAt: -1,
		out: make(chan simEvent, room), rng: r, arrive: time.Now()}
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
		// The running sequences first: each needs one more token of KV
		// this step; past the capacity the newest is preempted (its KV
		// freed, back to the head of the queue), never the last one.
		used := 0
		for _, s := range running {
			used += s.kv()
		}
		for len(running) > 1 && used+len(running) > e.cfg.KVCapacityTokens {
			s := running[len(running)-1]
			running[len(running)-1] = nil
			running = running[:len(running)-1]
			used -= s.kv()
			e.waiting = append([]*seq{s}, e.waiting...)
			s.preempted = true
			e.preemptions++
		}
		// Then admission, while the batch and the KV cache have room; the
		// admitting step pays the prefill of every token the sequence
		// holds (its prompt, and what it generated before a preemption)
		// but the prompt's leading blocks the prefix cache holds.
		var prefill time.Duration
		for len(running) < e.cfg.MaxBatch && len(e.waiting) > 0 {
			s := e.waiting[0]
			if s.ctx.Err() != nil {
				e.waiting = e.waiting[1:]
				e.m.finished("abort")
				close(s.out)
				continue
			}
			if len(running) > 0 && used+s.kv()+len(running)+1 > e.cfg.KVCapacityTokens {
				break // no room: it waits for a sequence to finish
			}
			e.waiting = e.waiting[1:]
			running = append(running, s)
			used += s.kv()
			prefill += e.cfg.PrefillBase + time.Duration(s.kv()-e.lookup(s))*e.cfg.PrefillPerToken
		}
		e.running, e.queued, e.kvUsed = len(running), len(e.waiting), used
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
				e.m.finished("abort")
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
		e.mu.Lock()
		e.running, e.kvUsed = len(running), 0
		for _, s := range running {
			e.kvUsed += s.kv()
		}
		e.mu.Unlock()
	}
}

// advance gives s one token and reports whether it keeps running.
func (e *Engine) advance(s *seq) bool {
	if s.failAt >= 0 && s.generated >= s.failAt {
		s.out <- simEvent{tokens: s.buffered, err: true}
		e.m.finished("error")
		return false
	}
	s.generated++
	s.buffered = append(s.buffered, s.rng.IntN(len(vocabulary)))
	e.m.token(s, time.Now())
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
	if finish != "" {
		e.m.finished(finish)
	}
	return finish == ""
}

var vocabulary = []string{
	" the", " engine", " streams", " tokens", " quickly", " and", " the", " sidecar",
	" measures", " every", " gap", " between", " them", ",", " while", " users",
	" read", " along", ".", " A", " queue", " forms", " when", " batches", " fill",
	" up", " so", " latency", " grows", " with", " load", " again",
}
