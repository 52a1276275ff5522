package config

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Simulator holds the built-in simulated engine's knobs; each field's
// comment gives its default (SimulatorDefaults, where the sidecar's
// configuration starts). WithDefaults fills only Model, MaxBatch,
// RejectStatus, DecodeBase, StallDuration, MaxTokens, KVCapacityTokens
// and PrefixCacheBlockTokens when zero: every other zero is taken as given (no jitter, a
// probability of 0 never happens, a zero duration takes no time,
// MaxQueue 0 queues nothing past the batch, Seed 0 is a seed).
type Simulator struct {
	Model           string        `yaml:"model"`             // "tokentap-sim"
	MaxBatch        int           `yaml:"max_batch"`         // 8
	MaxQueue        int           `yaml:"max_queue"`         // 32
	RejectStatus    int           `yaml:"reject_status"`     // 429
	PrefillBase     time.Duration `yaml:"prefill_base"`      // 10ms
	PrefillPerToken time.Duration `yaml:"prefill_per_token"` // 50µs
	DecodeBase      time.Duration `yaml:"decode_base"`       // 15ms
	DecodePerSeq    time.Duration `yaml:"decode_per_seq"`    // 1ms
	Jitter          float64       `yaml:"jitter"`            // 0.1 (relative, uniform ±)
	MultiTokenProb  float64       `yaml:"multi_token_prob"`  // 0.05
	StallProb       float64       `yaml:"stall_prob"`        // 0.002 per step
	StallDuration   time.Duration `yaml:"stall_duration"`    // 250ms
	ErrorProb       float64       `yaml:"error_prob"`        // 0.01 per request
	EOSProb         float64       `yaml:"eos_prob"`          // 0.02 per token after the first
	MaxTokens       int           `yaml:"max_tokens"`        // 64, when the request sets none
	Seed            uint64        `yaml:"seed"`              // 1
	// KVCapacityTokens is the KV cache, in tokens, shared by the running
	// sequences (prompt plus generated tokens each). When a decode step
	// needs more, the most recently admitted sequence is preempted: its
	// KV is freed, it waits at the head of the queue and recomputes its
	// prefill when readmitted, as vLLM does. Default 32768: the default
	// batch of 8 would need over 4,000 tokens per sequence to preempt.
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	// PrefixCacheBlocks is the prefix cache's size in blocks, vLLM's
	// automatic prefix caching: a prompt's leading blocks the cache holds
	// skip prefill, LRU eviction, and vLLM's prefix-cache counters on
	// /metrics (simengine/prefix.go). Default 0: off, no counters.
	PrefixCacheBlocks int `yaml:"prefix_cache_blocks"`
	// PrefixCacheBlockTokens is the tokens per block of the prefix cache
	// (512, the capture's block_size); with the cache on, a prompt's
	// tokens are the capture's count (its canonical prompt's bytes ÷ 4),
	// so that the simulator's blocks are the capture's.
	PrefixCacheBlockTokens int `yaml:"prefix_cache_block_tokens"`
	// PrefillChunkTokens is chunked prefill, vLLM's: at most this many
	// prompt tokens are prefilled per engine step, shared by the
	// sequences still prefilling in admission order, so a long prompt's
	// prefill spreads over several steps and each step delays the
	// running sequences' next tokens by one chunk at most. Default 0:
	// unchunked, a sequence's whole prefill is paid by the step that
	// admits it and every running sequence waits for it.
	PrefillChunkTokens int `yaml:"prefill_chunk_tokens"`
}

// MaxPrefixCacheBlocks and MaxPrefixCacheBlockTokens bound the prefix
// cache's settings (2^24 blocks: about 1 GiB of cache bookkeeping when
// full; a block of 2^20 tokens).
const (
	MaxPrefixCacheBlocks      = 1 << 24
	MaxPrefixCacheBlockTokens = 1 << 20
)

// MaxPrefillChunkTokens bounds PrefillChunkTokens (a chunk of 2^24
// tokens is more than any context).
const MaxPrefillChunkTokens = 1 << 24

// SimulatorDefaults returns the simulator configuration used for zero
// fields.
func SimulatorDefaults() Simulator {
	return Simulator{
		Model: "tokentap-sim", MaxBatch: 8, MaxQueue: 32, RejectStatus: 429,
		PrefillBase: 10 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond,
		DecodeBase: 15 * time.Millisecond, DecodePerSeq: time.Millisecond,
		Jitter: 0.1, MultiTokenProb: 0.05, StallProb: 0.002, StallDuration: 250 * time.Millisecond,
		ErrorProb: 0.01, EOSProb: 0.02, MaxTokens: 64, Seed: 1, KVCapacityTokens: 32768,
		PrefixCacheBlockTokens: 512,
	}
}

// WithDefaults fills the zero fields named on Simulator from
// SimulatorDefaults (and a negative MaxQueue with 0); start from
// SimulatorDefaults to get the other defaults.
func (c Simulator) WithDefaults() Simulator {
	d := SimulatorDefaults()
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = d.MaxBatch
	}
	if c.MaxQueue < 0 {
		c.MaxQueue = 0
	}
	if c.RejectStatus == 0 {
		c.RejectStatus = d.RejectStatus
	}
	if c.DecodeBase <= 0 {
		c.DecodeBase = d.DecodeBase
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = d.MaxTokens
	}
	if c.StallDuration <= 0 {
		c.StallDuration = d.StallDuration
	}
	if c.KVCapacityTokens <= 0 {
		c.KVCapacityTokens = d.KVCapacityTokens
	}
	if c.PrefixCacheBlockTokens <= 0 {
		c.PrefixCacheBlockTokens = d.PrefixCacheBlockTokens
	}
	return c
}

// Validate lists every problem with c.
func (c Simulator) Validate() []error {
	var errs []error
	bad := func(s string) { errs = append(errs, errors.New(s)) }
	prob := func(name string, p float64) {
		if p < 0 || p > 1 || math.IsNaN(p) {
			bad(name + " must be in [0,1]")
		}
	}
	prob("simulator.jitter", c.Jitter)
	prob("simulator.multi_token_prob", c.MultiTokenProb)
	prob("simulator.stall_prob", c.StallProb)
	prob("simulator.error_prob", c.ErrorProb)
	prob("simulator.eos_prob", c.EOSProb)
	if c.MaxBatch < 0 {
		bad("simulator.max_batch must not be negative")
	}
	if c.MaxQueue < 0 {
		bad("simulator.max_queue must not be negative")
	}
	if c.KVCapacityTokens < 0 {
		bad("simulator.kv_capacity_tokens must not be negative")
	}
	if c.PrefixCacheBlocks < 0 || c.PrefixCacheBlocks > MaxPrefixCacheBlocks {
		bad(fmt.Sprintf("simulator.prefix_cache_blocks must be in [0,%d] (0: off)", MaxPrefixCacheBlocks))
	}
	if c.PrefixCacheBlockTokens < 0 || c.PrefixCacheBlockTokens > MaxPrefixCacheBlockTokens {
		bad(fmt.Sprintf("simulator.prefix_cache_block_tokens must be in [0,%d] (0: 512)", MaxPrefixCacheBlockTokens))
	}
	if c.PrefillChunkTokens < 0 || c.PrefillChunkTokens > MaxPrefillChunkTokens {
		bad(fmt.Sprintf("simulator.prefill_chunk_tokens must be in [0,%d] (0: unchunked)", MaxPrefillChunkTokens))
	}
	if c.RejectStatus != 0 && (c.RejectStatus < 400 || c.RejectStatus > 599) {
		bad("simulator.reject_status must be a 4xx or 5xx status")
	}
	for _, d := range []struct {
		n string
		v time.Duration
	}{{"prefill_base", c.PrefillBase}, {"prefill_per_token", c.PrefillPerToken}, {"decode_base", c.DecodeBase}, {"decode_per_seq", c.DecodePerSeq}, {"stall_duration", c.StallDuration}} {
		if d.v < 0 {
			bad("simulator." + d.n + " must not be negative")
		}
	}
	return errs
}
