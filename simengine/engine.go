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
//     the others (head-of-line blocking, as in a real engine); with
//     PrefillChunkTokens (chunked prefill) a step prefills at most that
//     many prompt tokens and the first token comes with the last chunk;
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
//   - the usage chunk comes when stream_options.include_usage asks for it;
//   - the ground truth of every delay (truth.go): each step's time is
//     accounted to each sequence waiting for a token, by cause (queue,
//     another's prefill, preemption, a hiccup, a connection Dialer made
//     slow), and Truth returns it per request and per stall, keyed by the
//     client's X-Request-Id; CausesScenario mixes them all (scenario.go).
package simengine

import (
	"context"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
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

	// The prefill: prefilling from admission until its last chunk (all
	// of it, unchunked), with prefillLeft tokens to go; started once it
	// paid PrefillBase; recompute when it is a preempted sequence's;
	// chunk is this step's prefill time.
	prefilling, started, recompute bool
	prefillLeft                    int
	chunk                          time.Duration

	// The ground truth (truth.go): its entry in the log; seen once the
	// step loop has looked at it waiting; the delays accounted since its
	// arrival (until its first token) or its last token, by cause, with
	// the largest single one's ref; gapPreempted when it was preempted
	// since its last token. Under Engine.mu.
	truth        *Truth
	seen         bool
	parts        [nCauses]time.Duration
	refMax       [nCauses]time.Duration
	refs         [nCauses]string
	gapPreempted bool
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

	// the ground truth (truth.go), under mu: the log of requests (a ring
	// once full), the requests numbered, the slow connections unread
	truth     []*Truth
	truthNext int
	requests  uint64
	dials     map[string]time.Duration

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

// request is what submit needs of a request: its prompt's tokens and
// blocks (prefixKeys), its output's bounds, its client's id (validated
// or "": the engine numbers it) and the set-up delay of its connection.
type request struct {
	prompt    int
	keys      []uint64
	maxTokens int
	ignoreEOS bool
	id        string
	conn      time.Duration
}

// submit queues a request, or reports that the queue is full.
func (e *Engine) submit(ctx context.Context, prompt int, keys []uint64, maxTokens int, ignoreEOS bool) (*seq, bool) {
	return e.submitRequest(ctx, request{prompt: prompt, keys: keys, maxTokens: maxTokens, ignoreEOS: ignoreEOS})
}

func (e *Engine) submitRequest(ctx context.Context, q request) (*seq, bool) {
	prompt, keys, maxTokens, ignoreEOS := q.prompt, q.keys, q.maxTokens, q.ignoreEOS
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
	e.requests++
	if q.id == "" {
		q.id = "sim-" + strconv.FormatUint(e.requests, 10)
	}
	s.truth = &Truth{ID: q.id, Arrive: s.arrive, PromptTokens: prompt}
	s.add(cConnection, q.conn, "")
	e.logTruth(s.truth)
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

// stepCost is one sequence's prefill in a step: its chunk's time.
type stepCost struct {
	s    *seq
	cost time.Duration
}

// step is what an engine step spent its time on, for the ground truth:
// its start and end, its decode (jitter included), its hiccup
// (StallProb) and each sequence's prefill.
type step struct {
	start, end     time.Time
	decode, hiccup time.Duration
	prefill        []stepCost
	prefillTotal   time.Duration
}

// Run steps the engine until ctx is done.
//
// Each step first preempts what the KV cache cannot hold, then admits
// waiting requests while the batch and the KV cache have room, then
// prefills: every sequence still prefilling, in admission order, gets a
// chunk of the step's budget (PrefillChunkTokens; unchunked, all of its
// prompt, so the admitting step pays it whole). The step takes its
// decode, its hiccup and those prefills; at its end every running
// sequence whose prefill is done gets a token, and the truth accounts
// the step's time to each sequence still waiting for its next token.
func (e *Engine) Run(ctx context.Context) {
	var running, queued []*seq
	var cur, prev step
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	budget0 := math.MaxInt
	if e.cfg.PrefillChunkTokens > 0 {
		budget0 = e.cfg.PrefillChunkTokens
	}
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
			s.preempted, s.gapPreempted = true, true
			s.prefilling, s.started = false, false
			e.preemptions++
		}
		// Requests that arrived during the last step waited for its end:
		// its prefills first, then its hiccup; the rest of it is the
		// alignment to a step every request may pay.
		for _, s := range e.waiting {
			if !s.seen {
				s.seen = true
				e.arrivedDuring(s, &prev)
			}
		}
		// Then admission, while the batch and the KV cache have room; a
		// sequence admitted prefills every token it holds (its prompt,
		// and what it generated before a preemption: the recompute) but
		// the prompt's leading blocks the prefix cache holds.
		for len(running) < e.cfg.MaxBatch && len(e.waiting) > 0 {
			s := e.waiting[0]
			if s.ctx.Err() != nil {
				e.waiting = e.waiting[1:]
				e.m.finished("abort")
				s.truth.End = "abort"
				close(s.out)
				continue
			}
			if len(running) > 0 && used+s.kv()+len(running)+1 > e.cfg.KVCapacityTokens {
				break // no room: it waits for a sequence to finish
			}
			e.waiting = e.waiting[1:]
			running = append(running, s)
			used += s.kv()
			s.prefilling, s.recompute, s.prefillLeft = true, s.gapPreempted, max(0, s.kv()-e.lookup(s))
		}
		// The prefill chunks, in admission order, within the budget.
		cur.prefill, cur.prefillTotal = cur.prefill[:0], 0
		budget := budget0
		for _, s := range running {
			s.chunk = 0
			if !s.prefilling || (budget == 0 && s.prefillLeft > 0) {
				continue
			}
			c := min(s.prefillLeft, budget)
			s.chunk = time.Duration(c) * e.cfg.PrefillPerToken
			if !s.started {
				s.chunk += e.cfg.PrefillBase
				s.started = true
			}
			s.prefillLeft -= c
			budget -= c
			cur.prefill = append(cur.prefill, stepCost{s, s.chunk})
			cur.prefillTotal += s.chunk
		}
		queued = append(queued[:0], e.waiting...)
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
		cur.decode = e.cfg.DecodeBase + time.Duration(len(running))*e.cfg.DecodePerSeq
		if e.cfg.Jitter > 0 {
			cur.decode = time.Duration(float64(cur.decode) * (1 + e.cfg.Jitter*(2*e.rng.Float64()-1)))
		}
		cur.hiccup = 0
		if e.cfg.StallProb > 0 && e.rng.Float64() < e.cfg.StallProb {
			cur.hiccup = e.cfg.StallDuration
		}
		cur.start = time.Now()
		timer.Reset(cur.decode + cur.prefillTotal + cur.hiccup)
		select {
		case <-ctx.Done():
			timer.Stop()
			for _, s := range running {
				close(s.out)
			}
			return
		case <-timer.C:
		}
		cur.end = time.Now()
		e.mu.Lock()
		// Those left waiting all step waited for room (or, preempted,
		// for their readmission).
		for _, s := range queued {
			if s.gapPreempted || s.generated > 0 {
				s.add(cPreemption, cur.end.Sub(cur.start), "")
			} else {
				s.add(cQueue, cur.end.Sub(cur.start), "")
			}
		}
		kept := running[:0]
		for _, s := range running {
			if s.ctx.Err() != nil {
				e.m.finished("abort")
				s.truth.End = "abort"
				close(s.out)
				continue
			}
			e.account(s, &cur)
			if s.prefilling && s.prefillLeft > 0 {
				kept = append(kept, s) // its prefill goes on next step
				continue
			}
			s.prefilling, s.recompute = false, false
			if e.advance(s, cur.decode) {
				kept = append(kept, s)
			} else {
				close(s.out)
			}
		}
		for i := len(kept); i < len(running); i++ {
			running[i] = nil
		}
		running = kept
		e.running, e.kvUsed = len(running), 0
		for _, s := range running {
			e.kvUsed += s.kv()
		}
		e.mu.Unlock()
		prev, cur = cur, step{prefill: prev.prefill[:0]}
	}
}

// othersCause is the cause of s's wait for another sequence o's prefill:
// a preempted sequence's recompute is the preemption's; else, before
// s's first token, a prefill ahead, after it, interference.
func othersCause(s, o *seq) int {
	switch {
	case o.recompute:
		return cPreemption
	case s.generated == 0:
		return cLongPrefillAhead
	}
	return cPrefillInterference
}

// account adds the step st to the wait of s, a running sequence: the
// other sequences' prefills, the hiccup, and, when s is still
// prefilling and got no chunk (the budget went to those ahead), the
// whole step; e.mu held.
func (e *Engine) account(s *seq, st *step) {
	var top *seq
	for _, p := range st.prefill {
		if p.s == s {
			continue
		}
		s.add(othersCause(s, p.s), p.cost, p.s.truth.ID)
		if top == nil || p.cost > top.chunk {
			top = p.s
		}
	}
	s.add(cUnexplained, st.hiccup, "")
	if s.prefilling && s.chunk == 0 && top != nil {
		s.add(othersCause(s, top), st.decode, top.truth.ID)
	}
}

// arrivedDuring accounts to s, which arrived during step st, the rest of
// that step: its prefills first (each cause in proportion to its part),
// then its hiccup; e.mu held.
func (e *Engine) arrivedDuring(s *seq, st *step) {
	if !s.arrive.After(st.start) || !s.arrive.Before(st.end) {
		return
	}
	rest := st.end.Sub(s.arrive)
	lp := min(rest, st.prefillTotal)
	for _, p := range st.prefill {
		if p.s != s {
			s.add(othersCause(s, p.s), time.Duration(float64(lp)*float64(p.cost)/float64(st.prefillTotal)), p.s.truth.ID)
		}
	}
	s.add(cUnexplained, min(rest-lp, st.hiccup), "")
}

// advance gives s one token, produced by a step whose decode took
// decode, and reports whether it keeps running; e.mu held.
func (e *Engine) advance(s *seq, decode time.Duration) bool {
	if s.failAt >= 0 && s.generated >= s.failAt {
		s.out <- simEvent{tokens: s.buffered, err: true}
		e.m.finished("error")
		s.truth.End = "error"
		return false
	}
	s.generated++
	s.buffered = append(s.buffered, s.rng.IntN(len(vocabulary)))
	now := time.Now()
	s.truthToken(now, decode)
	e.m.token(s, now)
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
		s.truth.End = finish
	}
	return finish == ""
}

var vocabulary = []string{
	" the", " engine", " streams", " tokens", " quickly", " and", " the", " sidecar",
	" measures", " every", " gap", " between", " them", ",", " while", " users",
	" read", " along", ".", " A", " queue", " forms", " when", " batches", " fill",
	" up", " so", " latency", " grows", " with", " load", " again",
}
