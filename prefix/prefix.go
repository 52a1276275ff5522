// Package prefix is the arithmetic of prompt-prefix reuse (docs/measurement.md,
// "Prefix reuse"): given each request's block ids in arrival order, how many
// of its leading blocks were seen within a time window before it (the
// workload's reuse: an upper bound for any prefix cache), and how many an
// ideal LRU cache of a given size would have held (the bound at that size).
// The live reuse (package capture) and `sidecar capture stats` count with
// it, so that the two agree by construction.
//
// A block's id stands for the block and every block before it (the
// capture's chained digests; a trace's hash_ids): equal ids mean an equal
// prefix. No text is ever seen here.
package prefix

import (
	"time"
)

// Bounds and defaults of Options.
const (
	// MaxSizes bounds Options.Sizes: the ideal caches counted at once.
	MaxSizes = 4
	// MaxBlocks bounds the blocks of all ideal caches together: each
	// block held costs about 40 bytes (a map entry and a list slot).
	MaxBlocks = 1 << 22
	// DefaultMaxIDs is Options.MaxIDs' zero value.
	DefaultMaxIDs = 1 << 20
)

// Options configure a Tracker. The zero value counts no reuse (no window)
// and no ideal cache.
type Options struct {
	// Window is how long a block stays seen: a block is reused when its id
	// was seen in a request that arrived at most Window before. 0: no
	// window (every block is new).
	Window time.Duration
	// Sizes are the ideal LRU caches counted, in blocks, each above 0; at
	// most MaxSizes, MaxBlocks together (New panics past them: the caller
	// validates).
	Sizes []int
	// MaxIDs bounds the ids the window remembers; past it the oldest are
	// forgotten before their window ends (Stats.Evicted counts them: a
	// reuse then missed is counted new, never invented). 0 means
	// DefaultMaxIDs.
	MaxIDs int
}

// Result is what one request's blocks count.
type Result struct {
	// Blocks is the request's blocks: len(ids).
	Blocks int
	// Reused is its leading blocks whose id was seen within the window
	// before it.
	Reused int
	// Hits are, per Options.Sizes, its leading blocks the ideal cache of
	// that size held when it arrived.
	Hits []int
}

// Stats are a Tracker's state and counters.
type Stats struct {
	// IDs is the ids the window remembers now.
	IDs int
	// Evicted counts the ids forgotten because MaxIDs was reached.
	Evicted uint64
}

// Tracker counts reuse over requests given in arrival order. It is not
// safe for concurrent use; the zero value is not usable (New).
type Tracker struct {
	o      Options
	last   time.Time
	seen   map[uint64]int32 // id → its node in the window's list
	win    window
	caches []*lru
	hits   []int // Result.Hits' backing array, reused
	evict  uint64
}

// window is the ids the window remembers, a doubly linked list kept in
// slices, least recently seen first: as Observe's instants never go
// back, a refreshed id moves to the tail and the list stays in the
// order of the last sightings. An id held costs one node (24 bytes) and
// a map entry, however often it is seen (a queue of every sighting grew
// with the requests, not the ids, for a whole window: issue 36's soak).
// Freed nodes are kept for reuse, chained through next.
type window struct {
	list // least recently seen at the head
	ids  []uint64
	at   []int64 // when ids[i] was last seen (unix nanoseconds)
	free int32   // -1: none
}

// New returns a Tracker.
func New(o Options) *Tracker {
	if o.MaxIDs <= 0 {
		o.MaxIDs = DefaultMaxIDs
	}
	if len(o.Sizes) > MaxSizes {
		panic("prefix: too many cache sizes")
	}
	t := &Tracker{o: o, seen: map[uint64]int32{}, win: window{list: newList(), free: -1}, hits: make([]int, len(o.Sizes))}
	total := 0
	for _, s := range o.Sizes {
		if s <= 0 {
			panic("prefix: a cache size must be above 0")
		}
		total += s
		t.caches = append(t.caches, newLRU(s))
	}
	if total > MaxBlocks {
		panic("prefix: the caches together are past MaxBlocks")
	}
	return t
}

// Observe counts one request's prompt blocks, ids in prompt order,
// arriving at at. Requests come in arrival order; one given out of order
// is taken as arriving with the latest seen. The Result's Hits are valid
// until the next call.
func (t *Tracker) Observe(at time.Time, ids []uint64) Result {
	if at.Before(t.last) {
		at = t.last
	}
	t.last = at
	now := at.UnixNano()
	r := Result{Blocks: len(ids), Hits: t.hits}
	if t.o.Window > 0 {
		t.expire(now - int64(t.o.Window))
		// Seen ids are prefix-closed (a request that showed block i
		// showed every block before it, at the same instant), so the
		// reused blocks are a leading run.
		for _, id := range ids {
			if _, ok := t.seen[id]; !ok {
				break
			}
			r.Reused++
		}
		for _, id := range ids {
			t.see(id, now)
		}
	}
	for i, c := range t.caches {
		t.hits[i] = c.lookup(ids)
	}
	return r
}

// expire forgets the ids last seen before since.
func (t *Tracker) expire(since int64) {
	for w := &t.win; w.head >= 0 && w.at[w.head] < since; {
		t.forget(w.head)
	}
}

// see records id seen at now, forgetting the least recently seen ids
// past MaxIDs.
func (t *Tracker) see(id uint64, now int64) {
	w := &t.win
	if n, ok := t.seen[id]; ok {
		w.at[n] = now
		w.unlink(n)
		w.pushBack(n)
		return
	}
	var n int32
	if w.free >= 0 {
		n, w.free = w.free, w.next[w.free]
	} else {
		n = w.grow()
		w.ids, w.at = append(w.ids, 0), append(w.at, 0)
	}
	w.ids[n], w.at[n] = id, now
	w.pushBack(n)
	t.seen[id] = n
	for len(t.seen) > t.o.MaxIDs {
		t.forget(w.head)
		t.evict++
	}
}

// forget drops node n from the window and frees it.
func (t *Tracker) forget(n int32) {
	w := &t.win
	delete(t.seen, w.ids[n])
	w.unlink(n)
	w.next[n], w.free = w.free, n
}

// list is a doubly linked list of nodes numbered from 0, kept in slices.
type list struct {
	prev, next []int32
	head, tail int32 // -1: none
}

func newList() list { return list{head: -1, tail: -1} }

// grow adds a node, unlinked, and returns its number.
func (l *list) grow() int32 {
	l.prev, l.next = append(l.prev, -1), append(l.next, -1)
	return int32(len(l.prev) - 1)
}

func (l *list) unlink(n int32) {
	p, x := l.prev[n], l.next[n]
	if p >= 0 {
		l.next[p] = x
	} else {
		l.head = x
	}
	if x >= 0 {
		l.prev[x] = p
	} else {
		l.tail = p
	}
	l.prev[n], l.next[n] = -1, -1
}

func (l *list) pushBack(n int32) {
	l.prev[n], l.next[n] = l.tail, -1
	if l.tail >= 0 {
		l.next[l.tail] = n
	}
	l.tail = n
	if l.head < 0 {
		l.head = n
	}
}

func (l *list) pushFront(n int32) {
	l.prev[n], l.next[n] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = n
	}
	l.head = n
	if l.tail < 0 {
		l.tail = n
	}
}

// Stats returns the window's size and the ids it forgot for its bound.
func (t *Tracker) Stats() Stats { return Stats{IDs: len(t.seen), Evicted: t.evict} }

// lru is an ideal LRU cache of blocks: a map from id to a slot of a
// doubly linked list kept in slices (most recent at the head), so that a
// block held costs two int32s, an id and a map entry.
type lru struct {
	list // most recent at the head
	size int
	slot map[uint64]int32
	ids  []uint64
}

func newLRU(size int) *lru {
	return &lru{list: newList(), size: size, slot: map[uint64]int32{}}
}

// lookup returns how many leading ids the cache holds, then touches every
// id, the last first: the prefix's head ends the most recent, and a full
// cache evicts from the least recent (a prefix's tail before its head).
func (c *lru) lookup(ids []uint64) int {
	hits := 0
	for _, id := range ids {
		if _, ok := c.slot[id]; !ok {
			break
		}
		hits++
	}
	for i := len(ids) - 1; i >= 0; i-- {
		c.touch(ids[i])
	}
	return hits
}

// touch makes id the most recent, adding it (and evicting the least
// recent when full) when it is not held.
func (c *lru) touch(id uint64) {
	if s, ok := c.slot[id]; ok {
		c.unlink(s)
		c.pushFront(s)
		return
	}
	var s int32
	if len(c.ids) < c.size {
		s = c.grow()
		c.ids = append(c.ids, id)
	} else {
		s = c.tail
		c.unlink(s)
		delete(c.slot, c.ids[s])
		c.ids[s] = id
	}
	c.slot[id] = s
	c.pushFront(s)
}
