package prefix

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

// chain is a request's ids: a shared prefix's, then its own. Ids are
// chained: one id stands for its block and every one before it.
func chain(prefix []uint64, own ...uint64) []uint64 { return append(slices.Clone(prefix), own...) }

// Reuse within the window, by hand: a system prompt of two blocks shared
// by everyone, a conversation whose second turn extends its first.
func TestWindowReuseByHand(t *testing.T) {
	sys := []uint64{1, 2}
	tr := New(Options{Window: time.Minute})
	for i, c := range []struct {
		at     time.Duration
		ids    []uint64
		reused int
		why    string
	}{
		{0, chain(sys, 10, 11), 0, "the first request: nothing seen"},
		{time.Second, chain(sys, 20), 2, "the system prompt"},
		{2 * time.Second, chain(sys, 10, 11, 12, 13), 4, "turn 2 extends turn 1"},
		{3 * time.Second, []uint64{99, 2}, 0, "a block seen, but not after its prefix: ids are chained, so 2 here is another prefix's id"},
		{62 * time.Second, chain(sys, 10), 3, "62 s on: turn 2 was seen 60 s ago (within)"},
		{120 * time.Second, chain(sys, 10, 11), 3, "11 was last seen at 2 s, out of the window; 1, 2, 10 were refreshed at 62 s, within"},
		{300 * time.Second, chain(sys), 0, "everything expired"},
	} {
		r := tr.Observe(t0.Add(c.at), c.ids)
		if r.Blocks != len(c.ids) || r.Reused != c.reused {
			t.Errorf("request %d (%s): %d of %d reused, want %d", i, c.why, r.Reused, r.Blocks, c.reused)
		}
	}
}

// No window: nothing is reused; out-of-order arrivals are taken at the
// latest instant seen, never earlier.
func TestNoWindowAndOrder(t *testing.T) {
	tr := New(Options{})
	tr.Observe(t0, []uint64{1, 2})
	if r := tr.Observe(t0, []uint64{1, 2}); r.Reused != 0 {
		t.Fatalf("no window: %d reused", r.Reused)
	}
	tr = New(Options{Window: 10 * time.Second})
	tr.Observe(t0.Add(20*time.Second), []uint64{1})
	if r := tr.Observe(t0, []uint64{1}); r.Reused != 1 { // taken at 20 s: seen 0 s before
		t.Fatalf("an earlier arrival: %d reused, want 1", r.Reused)
	}
}

// The window's bound: past MaxIDs the oldest ids are forgotten and
// counted, and what is then missed counts as new: reuse is never
// invented, and the window does not grow past it.
func TestMaxIDsForgetsOldestCounted(t *testing.T) {
	tr := New(Options{Window: time.Hour, MaxIDs: 100})
	for i := range 10000 {
		tr.Observe(t0.Add(time.Duration(i)*time.Millisecond), []uint64{uint64(i)})
	}
	st := tr.Stats()
	if st.IDs != 100 || st.Evicted != 9900 {
		t.Fatalf("stats %+v, want 100 ids held and 9900 evicted", st)
	}
	if r := tr.Observe(t0.Add(10*time.Second), []uint64{0}); r.Reused != 0 {
		t.Fatal("an evicted id counted reused")
	}
	if r := tr.Observe(t0.Add(10*time.Second), []uint64{9999}); r.Reused != 1 {
		t.Fatal("a recent id not counted reused")
	}
	if len(tr.win.ids) > 101 {
		t.Fatalf("the window grew to %d nodes for a bound of 100 ids", len(tr.win.ids))
	}
}

// The window's memory grows with the ids it holds, never with how often
// they are seen: a workload that repeats the same prompts (issue 36's
// soak: 8 ids, a request every few ms for an hour) costs nothing per
// request once its ids are held. A queue of every sighting grew 16 bytes
// a block a request for the whole window (tens of MiB an hour).
func TestRefreshedIDsCostNothing(t *testing.T) {
	tr := New(Options{Window: time.Hour})
	ids := [8][]uint64{}
	for k := range ids {
		ids[k] = []uint64{uint64(k) + 1}
	}
	observe := func(from, n int) {
		for i := from; i < from+n; i++ {
			tr.Observe(t0.Add(time.Duration(i)*10*time.Millisecond), ids[i%len(ids)])
		}
	}
	observe(0, 1000) // every id held
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	observe(1000, 100000)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("100000 sightings of 8 held ids allocated %d bytes, want none (64 KiB of slack)", got)
	}
	if st := tr.Stats(); st.IDs != 8 || st.Evicted != 0 {
		t.Errorf("stats %+v, want 8 ids held, none evicted", st)
	}
	if r := tr.Observe(t0.Add(1100*time.Second), ids[3]); r.Reused != 1 {
		t.Error("a refreshed id not counted reused")
	}
	// Refreshed ids still expire a window after their last sighting.
	if r := tr.Observe(t0.Add(1100*time.Second+time.Hour), ids[3]); r.Reused != 1 {
		t.Error("an id seen a window ago (within) not counted reused")
	}
	if r := tr.Observe(t0.Add(1101*time.Second+time.Hour), ids[0]); r.Reused != 0 {
		t.Error("an id last seen over a window ago counted reused")
	}
	if st := tr.Stats(); st.IDs != 2 {
		t.Errorf("after the others expired: %d ids held, want 2", st.IDs)
	}
}

// refLRU is the test's own ideal cache: a slice of ids, most recent
// first, a request's hits its leading ids held, then its ids moved to the
// front, its first id first in the list, and the list cut at the size.
type refLRU struct {
	size int
	list []uint64
}

func (c *refLRU) observe(ids []uint64) int {
	hits := 0
	for _, id := range ids {
		if !slices.Contains(c.list, id) {
			break
		}
		hits++
	}
	rest := slices.DeleteFunc(slices.Clone(c.list), func(x uint64) bool { return slices.Contains(ids, x) })
	c.list = append(slices.Clone(ids), rest...)
	if len(c.list) > c.size {
		c.list = c.list[:c.size]
	}
	return hits
}

// The ideal caches agree with the test's own LRU, request by request, on
// a random workload with sharing (system prompts, conversations that
// grow), at sizes from smaller than one request to larger than the
// workload.
func TestIdealCacheAgreesWithReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{3, 17, 64, 5000}
	tr := New(Options{Window: time.Minute, Sizes: sizes})
	refs := make([]*refLRU, len(sizes))
	for i, s := range sizes {
		refs[i] = &refLRU{size: s}
	}
	next := uint64(1000)
	systems := [][]uint64{{1, 2}, {3, 4, 5}, {6}}
	convs := map[int][]uint64{}
	total := make([]int, len(sizes))
	blocks := 0
	for i := range 3000 {
		conv := rng.IntN(40)
		ids := convs[conv]
		if ids == nil || rng.IntN(4) == 0 { // a new conversation
			ids = slices.Clone(systems[rng.IntN(len(systems))])
		}
		for range 1 + rng.IntN(3) {
			ids = append(ids, next)
			next++
		}
		convs[conv] = ids
		r := tr.Observe(t0.Add(time.Duration(i)*time.Millisecond), ids)
		blocks += r.Blocks
		for k := range sizes {
			want := refs[k].observe(ids)
			if r.Hits[k] != want {
				t.Fatalf("request %d, cache of %d: %d hits, the reference %d", i, sizes[k], r.Hits[k], want)
			}
			total[k] += want
		}
	}
	// The bound grows with the size, and the largest cache holds every
	// block seen: its hits are the window's reuse here (all within it).
	for k := 1; k < len(sizes); k++ {
		if total[k] < total[k-1] {
			t.Fatalf("hits by size %v: not monotone", total)
		}
	}
	t.Logf("blocks %d, hits by size %v: %v", blocks, sizes, total)
}

// The unbounded cache and the window agree when the window holds every
// request: both are "seen before".
func TestLargestCacheIsTheWindowsReuse(t *testing.T) {
	tr := New(Options{Window: time.Hour, Sizes: []int{1 << 16}})
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		n := 1 + rng.IntN(6)
		ids := make([]uint64, n)
		for j := range ids {
			ids[j] = uint64(j*100 + rng.IntN(3)) // few distinct prefixes: much reuse
			if j > 0 {
				ids[j] += ids[j-1] * 1000
			}
		}
		r := tr.Observe(t0.Add(time.Duration(i)*time.Second), ids)
		if r.Hits[0] != r.Reused {
			t.Fatalf("request %d: cache hits %d, window reuse %d", i, r.Hits[0], r.Reused)
		}
	}
}

func TestBadOptionsPanic(t *testing.T) {
	for _, o := range []Options{{Sizes: []int{0}}, {Sizes: []int{1, 2, 3, 4, 5}}, {Sizes: []int{MaxBlocks, 1}}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%+v: no panic", o)
				}
			}()
			New(o)
		}()
	}
}

// BenchmarkObserve: one request of 8 blocks (4 shared with others) with
// a one-hour window and two ideal caches: the live reuse's cost per
// request (docs/performance.md).
func BenchmarkObserve(b *testing.B) {
	tr := New(Options{Window: time.Hour, Sizes: []int{4096, 32768}})
	rng := rand.New(rand.NewPCG(5, 6))
	ids := make([]uint64, 8)
	next := uint64(1 << 32)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		sys := uint64(rng.IntN(8))
		for j := range 4 {
			ids[j] = sys*10 + uint64(j)
		}
		for j := 4; j < 8; j++ {
			ids[j] = next
			next++
		}
		tr.Observe(t0.Add(time.Duration(i)*time.Millisecond), ids)
		i++
	}
}
