package capture

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/prefix"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// sharing is a scripted chat workload with known sharing: a system
// prompt of 3000 bytes shared by everyone, conversations whose turns
// extend the previous turn, one prompt sent twice, and arrivals 10 s
// apart, but the last, which comes after a gap longer than an hour.
type sharing struct {
	bodies []string
	canon  []string // each body's canonical prompt (prompt.go)
	at     []time.Duration
}

func newSharing() sharing {
	var w sharing
	system := strings.Repeat("You are a careful assistant. ", 104) // 3016 bytes
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	convs := make([][]msg, 3)
	add := func(msgs []msg, at time.Duration) {
		m, _ := json.Marshal(msgs)
		w.bodies = append(w.bodies, `{"model":"m","messages":`+string(m)+`}`)
		w.canon = append(w.canon, "messages\x00"+string(m)+"\x00")
		w.at = append(w.at, at)
	}
	at := time.Duration(0)
	for turn := range 3 {
		for c := range convs {
			if turn == 0 {
				convs[c] = []msg{{"system", system}}
			} else {
				convs[c] = append(convs[c], msg{"assistant", strings.Repeat(fmt.Sprintf("answer %d.%d ", c, turn), 150)})
			}
			convs[c] = append(convs[c], msg{"user", strings.Repeat(fmt.Sprintf("question %d.%d ", c, turn), 120)})
			add(convs[c], at)
			at += 10 * time.Second
		}
	}
	add(convs[1], at) // the same prompt again
	at += 10 * time.Second
	add(convs[2][:2], at+2*time.Hour) // the first turn again, past the window
	return w
}

// handKeys are a canonical prompt's blocks as the hand sees them: block
// i stands for the prompt's first min((i+1)·2048, len) bytes, and a last
// block shorter than 2048 bytes is its own (it ends the prompt).
func handKeys(canon string) []string {
	const block = 2048
	var keys []string
	for end := block; ; end += block {
		if end >= len(canon) {
			k := canon
			if len(canon)%block != 0 {
				k += "\x00end"
			}
			return append(keys, k)
		}
		keys = append(keys, canon[:end])
	}
}

// handReuse is the reuse and the ideal LRU caches' hits computed from
// the prompts' text: each block on its own, seen within window before,
// and a cache of blocks kept as a list, most recent first.
func handReuse(canon []string, at []time.Duration, window time.Duration, sizes []int) (blocks, reused int, hits []int) {
	seen := map[string]time.Duration{}
	caches := make([][]string, len(sizes))
	hits = make([]int, len(sizes))
	for r, c := range canon {
		keys := handKeys(c)
		blocks += len(keys)
		for _, k := range keys {
			if s, ok := seen[k]; ok && at[r]-s <= window {
				reused++
			}
		}
		for _, k := range keys {
			seen[k] = at[r]
		}
		for i, size := range sizes {
			for _, k := range keys {
				if !slices.Contains(caches[i], k) {
					break
				}
				hits[i]++
			}
			for j := len(keys) - 1; j >= 0; j-- {
				caches[i] = slices.DeleteFunc(caches[i], func(x string) bool { return x == keys[j] })
				caches[i] = slices.Insert(caches[i], 0, keys[j])
				if len(caches[i]) > size {
					caches[i] = caches[i][:size]
				}
			}
		}
	}
	return blocks, reused, hits
}

// send tracks and ends each request of w in order, arrivals from t0,
// without an engine count (the capture estimates it from the prompt's
// bytes, so that blocks are the hand's).
func (w sharing) send(c *Capture, t0 time.Time) {
	for i, b := range w.bodies {
		rec := record.New(0)
		rec.API, rec.Outcome, rec.Arrive = stream.NameChat, record.Success, t0.Add(w.at[i])
		c.Track(Request{Arrive: rec.Arrive, API: stream.NameChat, Body: []byte(b)}).End(rec, "m")
	}
}

// The live reuse with no file: the blocks, the reused ones and the ideal
// caches' hits at two sizes equal those the test computes from the text.
func TestLiveReuseEqualsTheHand(t *testing.T) {
	w := newSharing()
	sizes := []int{3, 8}
	c, err := Open(Options{Secret: testSecret, Reuse: &prefix.Options{Window: time.Hour, Sizes: sizes}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	w.send(c, t0)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	blocks, reused, hits := handReuse(w.canon, w.at, time.Hour, sizes)
	st := c.Stats()
	got := st.Reuse
	t.Logf("%d requests, %d blocks, %d reused, ideal-cache hits %v at sizes %v", got.Requests, got.Blocks, got.Reused, got.Hits, sizes)
	if got.Requests != uint64(len(w.bodies)) || got.Blocks != uint64(blocks) || got.Reused != uint64(reused) ||
		len(got.Hits) != 2 || got.Hits[0] != uint64(hits[0]) || got.Hits[1] != uint64(hits[1]) {
		t.Errorf("live %+v; the hand: %d blocks, %d reused, hits %v", got, blocks, reused, hits)
	}
	// The workload shares: the hand's figures are no trivial zero, and
	// the small cache holds less than the large one.
	if reused == 0 || reused == blocks || hits[0] >= hits[1] || hits[1] > reused {
		t.Errorf("the workload's sharing is not what the test means: %d blocks, %d reused, hits %v", blocks, reused, hits)
	}
	if st.Written != 0 || got.IDs == 0 || got.Forgotten != 0 {
		t.Errorf("stats %+v", st)
	}
	// The recent sums: the last line alone is within the hour before it.
	rr, ok := c.RecentReuse(t0.Add(w.at[len(w.at)-1]))
	last := handKeys(w.canon[len(w.canon)-1])
	if !ok || rr.Requests != 1 || rr.Blocks != uint64(len(last)) || rr.Reused != 0 || rr.Span != 0 {
		t.Errorf("recent %+v %v", rr, ok)
	}
	// Before the gap: every line but the last, over 100 s.
	rr, _ = c.RecentReuse(t0.Add(w.at[len(w.at)-2]))
	if rr.Requests != uint64(len(w.bodies)-1) || rr.Blocks != uint64(blocks-len(last)) || rr.Reused != uint64(reused) || rr.Span != w.at[len(w.at)-2] {
		t.Errorf("recent before the gap %+v", rr)
	}
}

// With a file, the live figures equal what package prefix computes from
// the written trace (its hash_ids and timestamps), as `sidecar capture
// stats` does; a line dropped late is neither written nor counted.
func TestLiveReuseEqualsTheTrace(t *testing.T) {
	w := newSharing()
	sizes := []int{2, 5}
	path := filepath.Join(t.TempDir(), "c.jsonl")
	c, err := Open(Options{Path: path, Secret: testSecret, Hold: 1, Settle: time.Hour, Reuse: &prefix.Options{Window: time.Hour, Sizes: sizes}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	// A request that arrived first and ends last, once two later lines
	// are past the hold of 1: late.
	rec := record.New(0)
	rec.API, rec.Outcome, rec.Arrive = stream.NameChat, record.Success, t0.Add(-time.Second)
	early := c.Track(Request{Arrive: rec.Arrive, API: stream.NameChat, Body: []byte(w.bodies[0])})
	w.send(c, t0)
	early.End(rec, "m")
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Late != 1 || st.Written != uint64(len(w.bodies)) {
		t.Fatalf("stats %+v", st)
	}
	r, cl, err := workload.Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := prefix.New(prefix.Options{Window: time.Hour, Sizes: sizes})
	var want ReuseStats
	want.Hits = make([]uint64, len(sizes))
	for {
		q, err := r.Next()
		if err != nil {
			break
		}
		ids := make([]uint64, len(q.HashIDs))
		for i, h := range q.HashIDs {
			ids[i] = uint64(h)
		}
		res := tr.Observe(time.UnixMilli(q.Timestamp), ids)
		want.Requests++
		want.Blocks += uint64(res.Blocks)
		want.Reused += uint64(res.Reused)
		for i, h := range res.Hits {
			want.Hits[i] += uint64(h)
		}
	}
	got := st.Reuse
	if got.Requests != want.Requests || got.Blocks != want.Blocks || got.Reused != want.Reused || !slices.Equal(got.Hits, want.Hits) || want.Reused == 0 {
		t.Errorf("live %+v, from the trace %+v", got, want)
	}
	blocks, reused, _ := handReuse(w.canon, w.at, time.Hour, sizes)
	if got.Blocks != uint64(blocks) || got.Reused != uint64(reused) {
		t.Errorf("live %+v; the hand %d %d", got, blocks, reused)
	}
}

// Past max_ids the oldest ids are forgotten and counted; the window
// never holds more.
func TestLiveReuseBounded(t *testing.T) {
	c, err := Open(Options{Secret: testSecret, Reuse: &prefix.Options{Window: time.Hour, MaxIDs: 10}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 20 {
		rec := record.New(0)
		rec.API, rec.Outcome, rec.Arrive = stream.NameChat, record.Success, t0.Add(time.Duration(i)*time.Second)
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":"%d %s"}]}`, i, strings.Repeat("x", 3000))
		c.Track(Request{Arrive: rec.Arrive, API: stream.NameChat, Body: []byte(body)}).End(rec, "m")
	}
	c.Close(context.Background())
	st := c.Stats().Reuse
	if st.Blocks != 40 || st.Reused != 0 || st.IDs != 10 || st.Forgotten != 30 {
		t.Errorf("stats %+v", st)
	}
}

// The live reuse adds no allocation to a line's emit once warm.
func TestReuseObserveAllocs(t *testing.T) {
	r := newReuse(prefix.Options{Window: time.Hour, Sizes: []int{4, 16}})
	c := &Capture{o: Options{Secret: testSecret, BlockTokens: 512, BytesPerToken: 4}}
	c.seed = [32]byte{1}
	rec := record.New(0)
	rec.API, rec.Outcome = stream.NameChat, record.Success
	e := &Entry{c: c, req: Request{API: stream.NameChat, Body: []byte(newSharing().bodies[4])}}
	c.o.NoMeta = true
	b := c.line(e, rec, "m")
	at := int64(0)
	r.observe(at, b)
	if a := testing.AllocsPerRun(100, func() { at += 1e9; r.observe(at, b) }); a != 0 {
		t.Errorf("observe allocates %v times", a)
	}
}

// lineItem is a line's item (Capture.line's layout) with the given
// digests, each the 8 bytes of an id and 8 zero bytes.
func lineItem(ids []uint64) []byte {
	b := make([]byte, 28, 28+len(ids)*digestBytes+1)
	binary.LittleEndian.PutUint32(b[24:], uint32(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint64(b, id)
		b = append(b, make([]byte, 8)...)
	}
	return append(b, 0)
}

// BenchmarkReuseObserve is the live reuse's cost per request
// (docs/performance.md, "Live reuse"): one line's ids counted in the
// window and in the default ideal caches (256 and 2048 blocks), with the
// mutex of the capture's emit held; prompts of 4, 16 and 64 blocks, each
// sharing its first half with the requests of its conversation (100
// conversations in turn) and its second half new.
func BenchmarkReuseObserve(b *testing.B) {
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			r := newReuse(prefix.Options{Window: time.Hour, Sizes: []int{256, 2048}})
			items := make([][]byte, 100)
			next := uint64(1 << 40)
			for k := range items {
				ids := make([]uint64, n)
				for i := range ids {
					ids[i] = uint64(k*1000 + i)
				}
				items[k] = lineItem(ids)
			}
			at := int64(0)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				it := items[i%len(items)]
				for j := n / 2; j < n; j++ { // the second half new
					next++
					binary.LittleEndian.PutUint64(it[28+j*digestBytes:], next)
				}
				at += 10_000_000 // 100 requests/s
				r.observe(at, it)
				i++
			}
		})
	}
}

// BenchmarkReuseMemory fills the window of an hour at 100 requests/s
// (360,000 requests of 8 blocks: 2 shared by everyone, 6 new) with the
// defaults (1<<20 ids, caches of 256 and 2048 blocks), past its bound,
// and reports the heap the reuse holds after a collection and the
// process's RSS (docs/performance.md, "Live reuse").
func BenchmarkReuseMemory(b *testing.B) {
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		r := newReuse(prefix.Options{Window: time.Hour, Sizes: []int{256, 2048}})
		ids := make([]uint64, 8)
		it := lineItem(ids)
		next := uint64(100)
		const requests = 3600 * 100
		for k := range requests {
			for j := range 8 {
				id := uint64(j)
				if j >= 2 {
					next++
					id = next
				}
				binary.LittleEndian.PutUint64(it[28+j*digestBytes:], id)
			}
			r.observe(int64(k)*10_000_000, it)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		st := r.stats()
		if st.IDs != prefix.DefaultMaxIDs || st.Forgotten == 0 {
			b.Fatalf("the window is not at its bound: %+v", st)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(rss())/(1<<20), "rss-MiB")
		b.ReportMetric(float64(st.IDs), "ids")
		runtime.KeepAlive(r)
	}
}

// rss is the process's resident set in bytes (Linux), 0 elsewhere.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// Options prefix.New would refuse are an error of Open, not a panic.
func TestReuseOptionsRefused(t *testing.T) {
	for _, o := range []prefix.Options{{Sizes: []int{1, 2, 3, 4, 5}}, {Sizes: []int{0}}, {Sizes: []int{prefix.MaxBlocks, 1}}} {
		if c, err := Open(Options{Secret: testSecret, Reuse: &o}); err == nil {
			c.Close(context.Background())
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := Open(Options{Secret: testSecret}); err == nil {
		t.Error("neither a file nor the reuse: no error")
	}
}
