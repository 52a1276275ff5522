package simengine

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/stream"
)

// order returns the cache's keys from the most to the least recent.
func (c *prefixCache) order() []uint64 {
	var ks []uint64
	for i := c.head; i >= 0; i = c.nodes[i].next {
		ks = append(ks, c.nodes[i].key)
	}
	return ks
}

// A hit is the leading run of blocks held, capped by the limit; a hole
// ends it.
func TestPrefixCacheLookupIsALeadingRun(t *testing.T) {
	c := newPrefixCache(10)
	c.touch([]uint64{1, 2, 3, 5})
	for _, tc := range []struct {
		keys  []uint64
		limit int
		want  int
	}{
		{[]uint64{1, 2, 3, 4, 5}, 5, 3}, // 4 missing: 5 does not count
		{[]uint64{1, 2, 3}, 2, 2},       // the limit (num_tokens − 1)
		{[]uint64{2, 3}, 5, 2},          // held keys, whatever their position before
		{[]uint64{9, 1, 2}, 5, 0},       // a miss first: nothing
		{nil, 5, 0},
	} {
		if got := c.lookup(tc.keys, tc.limit); got != tc.want {
			t.Errorf("lookup(%v, %d) = %d, want %d", tc.keys, tc.limit, got, tc.want)
		}
	}
	if got := c.order(); !slices.Equal(got, []uint64{1, 2, 3, 5}) {
		t.Errorf("lookup changed the order: %v", got)
	}
}

// A request's blocks are touched last block first: its head ends the
// most recent, its tail the first evicted; a block touched again moves to
// the front; the cache never holds more than its size.
func TestPrefixCacheLRUTailsFirst(t *testing.T) {
	c := newPrefixCache(5)
	c.touch([]uint64{1, 2, 3})
	if got := c.order(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("after [1 2 3]: %v, want head first", got)
	}
	c.touch([]uint64{4, 5})
	if got := c.order(); !slices.Equal(got, []uint64{4, 5, 1, 2, 3}) {
		t.Fatalf("after [4 5]: %v", got)
	}
	// Full: [1 6] evicts the least recent, the first request's tail (3),
	// then 2, and 1 moves to the front.
	c.touch([]uint64{1, 6, 7})
	if got := c.order(); !slices.Equal(got, []uint64{1, 6, 7, 4, 5}) || c.Len() != 5 {
		t.Fatalf("after [1 6 7]: %v (%d held), want [1 6 7 4 5]", got, c.Len())
	}
	if c.lookup([]uint64{1, 2, 3}, 3) != 1 {
		t.Error("the evicted tail still hits")
	}
	for i := range uint64(100) {
		c.touch([]uint64{100 + i})
	}
	if c.Len() != 5 || len(c.nodes) != 5 || len(c.order()) != 5 {
		t.Errorf("%d held, %d nodes, want 5", c.Len(), len(c.nodes))
	}
	if got := c.order(); !slices.Equal(got, []uint64{199, 198, 197, 196, 195}) {
		t.Errorf("after 100 singles: %v", got)
	}
}

// A request longer than the cache keeps its head (touched last).
func TestPrefixCacheLongRequestKeepsItsHead(t *testing.T) {
	c := newPrefixCache(3)
	c.touch([]uint64{1, 2, 3, 4, 5})
	if got := c.order(); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("%v, want the head [1 2 3]", got)
	}
}

// The cache is off by default: no lookups, no counters on /metrics,
// today's token count.
func TestPrefixCacheOffByDefault(t *testing.T) {
	e := NewEngine(Config{})
	if e.cache != nil || e.Config().PrefixCacheBlocks != 0 || e.Config().PrefixCacheBlockTokens != 512 {
		t.Fatalf("defaults: cache %v, %+v", e.cache != nil, e.Config())
	}
	rec := httptest.NewRecorder()
	NewServer(e).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), "prefix_cache") {
		t.Error("prefix-cache series with the cache off")
	}
	if e.PrefixLog() != nil {
		t.Error("a prefix log with the cache off")
	}
}

// The simulator's prompt is the capture's canonical prompt: its tokens
// are the bytes ÷ 4 rounded up, its blocks those bytes cut every
// block tokens × 4 bytes (the capture's blocks), full blocks only, each
// key standing for its whole prefix; JSON spacing changes nothing.
func TestPrefixKeysAreTheCapturesBlocks(t *testing.T) {
	seed := maphash.MakeSeed()
	const bt = 4 // 16 bytes a block
	body := func(text string, spaced bool) []byte {
		if spaced {
			return []byte(`{ "model" : "m", "messages" : [ { "role" : "user", "content" : "` + text + `" } ] }`)
		}
		return []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`)
	}
	canon := func(b []byte) []byte {
		var c []byte
		capture.Canonical(b, stream.NameChat, func(p []byte) { c = append(c, p...) })
		return c
	}
	a := body(strings.Repeat("a", 64), false)
	n := len(canon(a))
	tokens, keys := prefixKeys(seed, a, stream.NameChat, bt, 1<<20)
	if tokens != (n+3)/4 || len(keys) != tokens/bt {
		t.Fatalf("%d canonical bytes: %d tokens, %d keys; want %d, %d", n, tokens, len(keys), (n+3)/4, (n+3)/4/bt)
	}
	if _, k := prefixKeys(seed, body(strings.Repeat("a", 64), true), stream.NameChat, bt, 1<<20); !slices.Equal(k, keys) {
		t.Error("spacing changed the keys")
	}
	// A different character: the keys before its block are equal, every
	// key from its block on differs (chained); in the partial last block
	// (not cached) it changes no key.
	for _, text := range []string{strings.Repeat("a", 63) + "b", "b" + strings.Repeat("a", 63), strings.Repeat("a", 30) + "b" + strings.Repeat("a", 33)} {
		b := body(text, false)
		_, kb := prefixKeys(seed, b, stream.NameChat, bt, 1<<20)
		d := slices.Index(canon(b), 'b') / (4 * bt)
		if len(kb) != len(keys) || !slices.Equal(kb[:min(d, len(kb))], keys[:min(d, len(kb))]) {
			t.Fatalf("%s: keys %x and %x: want the first %d equal", text, keys, kb, d)
		}
		for i := d; i < len(kb); i++ {
			if kb[i] == keys[i] {
				t.Errorf("%s: key %d equal after a different block %d", text, i, d)
			}
		}
	}
	// Past maxTokens: the count, no keys.
	if tk, k := prefixKeys(seed, a, stream.NameChat, bt, 10); tk != tokens || k != nil {
		t.Errorf("over the bound: %d tokens, %d keys", tk, len(k))
	}
	// A completions prompt is its own member.
	if tk, _ := prefixKeys(seed, []byte(`{"prompt":"xy"}`), stream.NameCompletions, bt, 1<<20); tk != (len("prompt\x00\"xy\"\x00")+3)/4 {
		t.Errorf("completions: %d tokens", tk)
	}
}

// The token count rounds up, so the last full block may be short of
// bytes (1 to 3 bytes): it is hashed as it is, as the capture's last id
// is, and it counts as full.
func TestPrefixKeysShortLastBlock(t *testing.T) {
	seed := maphash.MakeSeed()
	const bt = 4
	for extra := range 40 {
		b := []byte(`{"prompt":"` + strings.Repeat("x", extra) + `"}`)
		var n int
		capture.Canonical(b, stream.NameCompletions, func(p []byte) { n += len(p) })
		tokens, keys := prefixKeys(seed, b, stream.NameCompletions, bt, 1<<20)
		if tokens != (n+3)/4 || len(keys) != tokens/bt {
			t.Errorf("%d bytes: %d tokens, %d keys", n, tokens, len(keys))
		}
	}
}

// testLRU is the test's own ideal cache: a list of prefixes, most recent
// first.
type testLRU struct {
	size int
	held []string
}

func (l *testLRU) request(blocks []string, limit int) int {
	hits := 0
	for hits < min(limit, len(blocks)) && slices.Contains(l.held, blocks[hits]) {
		hits++
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		if j := slices.Index(l.held, blocks[i]); j >= 0 {
			l.held = slices.Delete(l.held, j, j+1)
		}
		l.held = slices.Insert(l.held, 0, blocks[i])
		if len(l.held) > l.size {
			l.held = l.held[:l.size]
		}
	}
	return hits
}

// scripted is a workload with known sharing: two system prompts shared
// by everyone, and conversations whose turns each extend the one before
// (a user message, then the answer, then the next user message).
func scripted() [][]byte {
	systems := []string{strings.Repeat("You are a careful assistant. ", 9), strings.Repeat("Answer in French, briefly. ", 7)}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var out [][]byte
	convs := make([][]msg, 6)
	for i := range convs {
		convs[i] = []msg{{"system", systems[i%2]}}
	}
	for turn := range 3 {
		for i := range convs {
			convs[i] = append(convs[i], msg{"user", fmt.Sprintf("Conversation %d, turn %d: %s", i, turn, strings.Repeat("tell me more ", 3+i))})
			b, _ := json.Marshal(map[string]any{"model": "sim", "max_tokens": 2, "ignore_eos": true, "messages": convs[i]})
			out = append(out, b)
			convs[i] = append(convs[i], msg{"assistant", strings.Repeat("the engine streams tokens ", 2+turn)})
		}
	}
	// Repeats of whole prompts: every block but the one holding the last
	// token hits.
	return append(out, out[0], out[7])
}

// Over a scripted workload with known sharing, the simulator's lookups
// (blocks, hits) and its counters equal the test's own LRU over the
// same blocks: the capture's canonical prompt cut into block tokens × 4
// bytes, each block keyed by its whole prefix; at a size that holds
// everything and at one that evicts.
func TestPrefixCacheMatchesAnLRUOverTheWorkload(t *testing.T) {
	const bt = 16
	reqs := scripted()
	for _, size := range []int{1000, 40} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.PrefixCacheBlocks, cfg.PrefixCacheBlockTokens = size, bt
				e := NewEngine(cfg)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				go e.Run(ctx)
				srv := NewServer(e)
				lru := &testLRU{size: size}
				var want []PrefixLookup
				var queries, hits uint64
				for i, b := range reqs {
					var canon []byte
					capture.Canonical(b, stream.NameChat, func(p []byte) { canon = append(canon, p...) })
					tokens := (len(canon) + 3) / 4
					var blocks []string
					for j := range tokens / bt {
						blocks = append(blocks, string(canon[:min((j+1)*bt*4, len(canon))]))
					}
					h := lru.request(blocks, (tokens-1)/bt)
					want = append(want, PrefixLookup{Blocks: len(blocks), Hits: h, Tokens: tokens, HitTokens: h * bt})
					queries += uint64(tokens)
					hits += uint64(h * bt)

					rec := httptest.NewRecorder()
					srv.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(string(b))))
					var r struct {
						Usage struct {
							PromptTokens int `json:"prompt_tokens"`
						} `json:"usage"`
					}
					if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != http.StatusOK {
						t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
					}
					if r.Usage.PromptTokens != tokens {
						t.Errorf("request %d: usage prompt_tokens %d, want the capture's %d", i, r.Usage.PromptTokens, tokens)
					}
				}
				got := e.PrefixLog()
				if !slices.Equal(got, want) {
					t.Errorf("lookups:\n got %v\nwant %v", got, want)
				}
				q, h := e.PrefixCounters()
				if q != queries || h != hits || h == 0 {
					t.Errorf("counters: queries %d hits %d, want %d %d", q, h, queries, hits)
				}
				mq := counter(t, e, "vllm:prefix_cache_queries_total")
				mh := counter(t, e, "vllm:prefix_cache_hits_total")
				if mq != float64(queries) || mh != float64(hits) {
					t.Errorf("/metrics: queries %v hits %v, want %d %d", mq, mh, queries, hits)
				}
				t.Logf("size %d: hit rate %.3f (%d/%d tokens)", size, float64(h)/float64(q), h, q)
			})
		})
	}
}

// counter is the value of a counter family on the engine's /metrics.
func counter(t *testing.T, e *Engine, name string) float64 {
	t.Helper()
	fams, err := e.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s on /metrics", name)
	return 0
}

// Cached tokens skip prefill: with quiet()'s 1 ms a prompt token, a
// 100-token prompt of 6 blocks of 16 takes 25 + 10 + 100 ms to its first
// token cold, 25 + 10 + 4 ms when its 6 blocks (96 tokens) are cached,
// and 25 + 10 + 68 ms when only its first 2 are; without the cache,
// 135 ms every time.
func TestPrefillShrinksWithAHit(t *testing.T) {
	for _, on := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			cfg := quiet()
			if on {
				cfg.PrefixCacheBlocks, cfg.PrefixCacheBlockTokens = 100, 16
			}
			e := NewEngine(cfg)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go e.Run(ctx)
			for i, c := range []struct {
				keys []uint64
				ttft time.Duration
			}{
				{[]uint64{1, 2, 3, 4, 5, 6}, 135 * time.Millisecond},
				{[]uint64{1, 2, 3, 4, 5, 6}, 39 * time.Millisecond},
				{[]uint64{1, 2, 9, 10, 11, 12}, 103 * time.Millisecond},
			} {
				if !on {
					c.ttft = 135 * time.Millisecond
				}
				start := time.Now()
				s, ok := e.submit(ctx, 100, c.keys, 3, true)
				if !ok {
					t.Fatal("rejected")
				}
				if ttft, _, _ := firstAndRest(s, start); ttft != c.ttft {
					t.Errorf("cache %v, request %d: ttft %v, want %v", on, i, ttft, c.ttft)
				}
			}
		})
	}
}

// A readmission after a preemption looks its blocks up again (its own
// blocks, cached at its first admission, hit) but counts apart, as
// vLLM's PrefixCacheStats does: the counters hold the first admissions
// only.
func TestPreemptedLookupsCountApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.KVCapacityTokens = 4, 30
		cfg.PrefixCacheBlocks, cfg.PrefixCacheBlockTokens = 100, 4
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		var seqs []*seq
		for i := range uint64(3) {
			s, ok := e.submit(ctx, 5, []uint64{i + 1}, 8, true)
			if !ok {
				t.Fatal("rejected")
			}
			seqs = append(seqs, s)
		}
		for _, s := range seqs {
			for range s.out {
			}
		}
		_, _, preemptions := e.KV()
		log := e.PrefixLog()
		if preemptions == 0 || len(log) != 3+int(preemptions) {
			t.Fatalf("%d preemptions, %d lookups: %+v", preemptions, len(log), log)
		}
		for i, l := range log {
			first := i < 3
			if l.Preempted == first || l.Blocks != 1 || l.Tokens != 5 || (first && l.Hits != 0) || (!first && l.Hits != 1) {
				t.Errorf("lookup %d: %+v", i, l)
			}
		}
		if q, h := e.PrefixCounters(); q != 15 || h != 0 {
			t.Errorf("counters: queries %d hits %d, want 15 and 0 (first admissions only)", q, h)
		}
	})
}
