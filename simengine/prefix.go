package simengine

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/stream"
)

// The prefix cache is vLLM's automatic prefix caching (v1) reduced to
// what decides its hits, in blocks of Config.PrefixCacheBlockTokens
// tokens:
//
//   - a prompt is cut into full blocks, and each block is keyed by a
//     chained hash of itself and every block before it, so that a key
//     stands for its whole prefix (vllm/v1/core/kv_cache_utils.py,
//     hash_block_tokens and hash_request_tokens: the parent block's hash
//     and the block's tokens; a partial last block gets no hash, so it is
//     never cached);
//   - a request's hit is the longest leading run of its blocks the cache
//     holds, at most the blocks within its first num_tokens − 1 tokens:
//     the last token is always computed, for its logits
//     (vllm/v1/core/kv_cache_manager.py, get_computed_blocks:
//     max_cache_hit_length = request.num_tokens - 1, then
//     find_longest_cache_hit);
//   - the hit tokens skip prefill, the rest are computed;
//   - eviction is LRU over blocks, and a request's blocks are touched
//     last block first, so that its head is the most recently used and
//     its tail is evicted first: vLLM frees a request's blocks in reverse
//     order onto the tail of its free-block queue and evicts from the
//     queue's head (vllm/v1/core/single_type_kv_cache_manager.py, free:
//     "free blocks in reverse order so that the tail blocks are evicted
//     first"; vllm/v1/core/block_pool.py, FreeKVCacheBlockQueue and
//     get_new_blocks);
//   - the counters are vLLM's, in tokens: every lookup of a request not
//     preempted before adds its prompt tokens to the queries and its hit
//     tokens to the hits; a readmission after a preemption looks up (and
//     its prefill shrinks) but counts apart, as vLLM's
//     PrefixCacheStats.record counts preempted requests apart from
//     vllm:prefix_cache_queries and vllm:prefix_cache_hits
//     (vllm/v1/metrics/stats.py; vllm/v1/metrics/loggers.py).
//
// The prompt's tokens and blocks are the workload capture's: its
// canonical prompt (capture.Canonical) at capture.DefaultBytesPerToken
// bytes a token, cut into blocks of block tokens × 4 bytes, so that the
// simulator and a capture with the same block size see the same blocks
// (docs/capture.md, "hash_ids"). What it leaves out (docs/measurement.md):
// the cache is its own size, not the KV blocks the running sequences
// leave free, and it pins nothing (a running request's blocks may be
// evicted); blocks enter it when the request is admitted, not as its
// prefill computes them; generated tokens are not cached.

// prefixLogSize bounds Engine.PrefixLog.
const prefixLogSize = 4096

// PrefixLookup is one lookup of the prefix cache: a request's admission.
type PrefixLookup struct {
	Blocks int // full blocks of the prompt
	Hits   int // leading blocks the cache held (and that the request could use)
	// Tokens and HitTokens are the prompt's tokens and Hits × block
	// tokens: what the counters add.
	Tokens, HitTokens int
	// Preempted is a readmission after a preemption: counted apart, not
	// in the counters.
	Preempted bool
}

// prefixKeys returns the prompt's tokens and its full blocks' keys: the
// canonical prompt of body, a request of api, at 4 bytes a token, cut
// into blocks of blockTokens tokens, each key a chained hash. A block
// counts as full when the token count covers it (the last may then be
// short of bytes: the token count is rounded up), as the capture's ids
// do; a body without a prompt the capture reads has no keys. At most
// maxTokens tokens are read: past it, tokens is more than maxTokens and
// keys are nil.
func prefixKeys(seed maphash.Seed, body []byte, api stream.Name, blockTokens, maxTokens int) (tokens int, keys []uint64) {
	n := 0
	capture.Canonical(body, api, func(p []byte) { n += len(p) })
	bpt := int(capture.DefaultBytesPerToken)
	tokens = max(1, (n+bpt-1)/bpt)
	if tokens > maxTokens {
		return tokens, nil
	}
	full := tokens / blockTokens
	if full == 0 || n == 0 { // no prompt read: no block to share (the capture's ids are then the request's own)
		return tokens, nil
	}
	keys = make([]uint64, 0, full)
	block := blockTokens * bpt
	var h maphash.Hash
	h.SetSeed(seed)
	var prev [8]byte
	fill := 0
	closeBlock := func() {
		k := h.Sum64()
		keys = append(keys, k)
		binary.LittleEndian.PutUint64(prev[:], k)
		h.Reset()
		h.Write(prev[:])
		fill = 0
	}
	capture.Canonical(body, api, func(p []byte) {
		for len(p) > 0 && len(keys) < full {
			m := min(len(p), block-fill)
			h.Write(p[:m])
			fill += m
			p = p[m:]
			if fill == block {
				closeBlock()
			}
		}
	})
	if len(keys) < full && fill > 0 { // the last, short of bytes
		closeBlock()
	}
	return tokens, keys
}

// prefixCache is an LRU set of block keys, at most size of them. Its
// nodes live in one slice that grows with the blocks inserted, never
// past size. Not safe for concurrent use.
type prefixCache struct {
	size  int
	index map[uint64]int32 // key → node
	nodes []lruNode
	head  int32 // most recent; -1 when empty
	tail  int32 // least recent, evicted first
}

type lruNode struct {
	key        uint64
	prev, next int32 // toward head, toward tail; -1 at the ends
}

func newPrefixCache(size int) *prefixCache {
	return &prefixCache{size: size, index: map[uint64]int32{}, head: -1, tail: -1}
}

// Len is the number of blocks held.
func (c *prefixCache) Len() int { return len(c.index) }

// lookup returns the longest leading run of keys the cache holds, at
// most limit. It changes nothing.
func (c *prefixCache) lookup(keys []uint64, limit int) int {
	n := 0
	for n < min(limit, len(keys)) {
		if _, ok := c.index[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch makes each key the most recent, inserting those not held, the
// last key first: after it keys[0] is the most recent and the tail of
// keys the first of them to be evicted.
func (c *prefixCache) touch(keys []uint64) {
	for i := len(keys) - 1; i >= 0; i-- {
		c.touchOne(keys[i])
	}
}

func (c *prefixCache) touchOne(k uint64) {
	if i, ok := c.index[k]; ok {
		c.unlink(i)
		c.pushFront(i)
		return
	}
	var i int32
	if len(c.nodes) < c.size {
		c.nodes = append(c.nodes, lruNode{})
		i = int32(len(c.nodes) - 1)
	} else { // full: reuse the least recent's node
		i = c.tail
		c.unlink(i)
		delete(c.index, c.nodes[i].key)
	}
	c.nodes[i].key = k
	c.index[k] = i
	c.pushFront(i)
}

func (c *prefixCache) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
}

func (c *prefixCache) pushFront(i int32) {
	c.nodes[i].prev, c.nodes[i].next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}
