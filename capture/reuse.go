package capture

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/tokentap/tokentap/prefix"
)

// ReuseStats are the live reuse's counters (docs/capture.md, "Live
// reuse"): every line handed to the file (or, with no file, that would
// have been), in arrival order. They only grow, but IDs.
type ReuseStats struct {
	// Window and Sizes are the options in force.
	Window time.Duration
	Sizes  []int
	// Requests and Blocks are the lines counted and their blocks;
	// Reused the blocks whose id was seen within Window before.
	Requests, Blocks, Reused uint64
	// Hits are, per Sizes, the blocks the ideal LRU cache of that size
	// held (its misses are Blocks − Hits).
	Hits []uint64
	// IDs is the ids the window remembers now; Forgotten counts those
	// forgotten for its bound (prefix.Options.MaxIDs) before their
	// window ended.
	IDs       int
	Forgotten uint64
}

// ReuseRecent is the live reuse of the lines that arrived within the
// last Window (Capture.RecentReuse), from slots of Window/reuseSlots.
type ReuseRecent struct {
	// Span is the time the sums cover: from the first line they count to
	// now (at most Window plus a slot).
	Span                     time.Duration
	Requests, Blocks, Reused uint64
	Hits                     []uint64 // per ReuseStats.Sizes
}

// reuseSlots is the slots of the recent sums' window.
const reuseSlots = 60

// reuse is the live reuse's state, under Capture.mu.
type reuse struct {
	o     prefix.Options
	t     *prefix.Tracker
	ids   []uint64 // observe's, reused
	total reuseSums
	slot  time.Duration
	slots [reuseSlots]reuseSlot
}

type reuseSums struct {
	requests, blocks, reused uint64
	hits                     [prefix.MaxSizes]uint64
}

type reuseSlot struct {
	start, first int64 // unix nanoseconds; first: the slot's first line
	used         bool
	sums         reuseSums
}

// checkReuse returns an error for options prefix.New would refuse.
func checkReuse(o prefix.Options) error {
	if len(o.Sizes) > prefix.MaxSizes {
		return fmt.Errorf("capture: at most %d ideal cache sizes, got %d", prefix.MaxSizes, len(o.Sizes))
	}
	total := 0
	for _, s := range o.Sizes {
		if s <= 0 {
			return fmt.Errorf("capture: an ideal cache size must be above 0, got %d", s)
		}
		total += s
	}
	if total > prefix.MaxBlocks {
		return fmt.Errorf("capture: the ideal caches hold at most %d blocks together, got %d", prefix.MaxBlocks, total)
	}
	return nil
}

func newReuse(o prefix.Options) *reuse {
	o.Sizes = slices.Clone(o.Sizes)
	r := &reuse{o: o, t: prefix.New(o), slot: max(o.Window/reuseSlots, time.Millisecond)}
	if o.Window <= 0 {
		r.slot = time.Hour / reuseSlots
	}
	return r
}

// observe counts the line item b (layout: Capture.line) arriving at at
// (unix nanoseconds). It allocates nothing once ids has grown.
func (r *reuse) observe(at int64, b []byte) {
	n := int(binary.LittleEndian.Uint32(b[24:]))
	d := b[28:]
	r.ids = r.ids[:0]
	for i := range n {
		// A digest's first 8 bytes: collisions among 2^32 distinct
		// blocks have odds under 2^-32.
		r.ids = append(r.ids, binary.LittleEndian.Uint64(d[i*digestBytes:]))
	}
	res := r.t.Observe(time.Unix(0, at), r.ids)
	add := func(s *reuseSums) {
		s.requests++
		s.blocks += uint64(res.Blocks)
		s.reused += uint64(res.Reused)
		for i, h := range res.Hits {
			s.hits[i] += uint64(h)
		}
	}
	add(&r.total)
	start := at - at%int64(r.slot)
	s := &r.slots[(start/int64(r.slot))%reuseSlots]
	if !s.used || s.start != start {
		*s = reuseSlot{start: start, first: at, used: true}
	}
	add(&s.sums)
}

func (r *reuse) stats() ReuseStats {
	ts := r.t.Stats()
	st := ReuseStats{Window: r.o.Window, Sizes: r.o.Sizes, Requests: r.total.requests, Blocks: r.total.blocks, Reused: r.total.reused,
		Hits: slices.Clone(r.total.hits[:len(r.o.Sizes)]), IDs: ts.IDs, Forgotten: ts.Evicted}
	return st
}

// recent sums the slots of the window ending at now.
func (r *reuse) recent(now int64) ReuseRecent {
	length := int64(r.slot) * reuseSlots
	var sum reuseSums
	oldest := now
	for i := range r.slots {
		s := &r.slots[i]
		if !s.used || now-s.start >= length || s.start > now {
			continue
		}
		sum.requests += s.sums.requests
		sum.blocks += s.sums.blocks
		sum.reused += s.sums.reused
		for k := range sum.hits {
			sum.hits[k] += s.sums.hits[k]
		}
		oldest = min(oldest, s.first)
	}
	return ReuseRecent{Span: time.Duration(now - oldest), Requests: sum.requests, Blocks: sum.blocks, Reused: sum.reused,
		Hits: slices.Clone(sum.hits[:len(r.o.Sizes)])}
}

// RecentReuse returns the live reuse of the lines that arrived within
// the window before now; ok is false when the reuse is off.
func (c *Capture) RecentReuse(now time.Time) (ReuseRecent, bool) {
	if c == nil || c.reuse == nil {
		return ReuseRecent{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reuse.recent(now.UnixNano()), true
}
