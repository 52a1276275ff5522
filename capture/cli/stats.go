package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/tokentap/tokentap/prefix"
	"github.com/tokentap/tokentap/workload"
)

// Bounds and defaults of StatsOptions.
const (
	// MaxSizes bounds StatsOptions.Sizes: each is an ideal cache run
	// beside the others.
	MaxSizes = 8
	// MaxReplicas bounds the replicas a trace names: each has a reuse
	// window of its own.
	MaxReplicas = 1024
	// MaxBins bounds the arrival-rate series: past it the bins widen
	// (twice as wide, pairs merged).
	MaxBins = 600
	// DefaultStatsMaxIDs is StatsOptions.MaxIDs' zero value.
	DefaultStatsMaxIDs = 1 << 21
)

// DefaultSizes are the ideal caches' sizes, in blocks, when
// StatsOptions gives none: 256 to 65,536 blocks (at 512 tokens a block,
// 131,072 to 33.5 million tokens of KV cache).
var DefaultSizes = []int{256, 1024, 4096, 16384, 65536}

// StatsOptions tune Stats. The zero value counts reuse over the whole
// trace with the default sizes, bounds and 1 s bins.
type StatsOptions struct {
	// Window is how long a block stays seen (prefix.Options.Window); 0:
	// the whole trace.
	Window time.Duration
	// Sizes are the ideal LRU caches, in blocks, increasing, each 1 to
	// prefix.MaxBlocks, at most MaxSizes; nil: DefaultSizes.
	Sizes []int
	// MaxIDs bounds the ids each reuse window remembers
	// (prefix.Options.MaxIDs); 0: DefaultStatsMaxIDs.
	MaxIDs int
	// Bin is the arrival-rate bin's width, at least 1 ms (widened past
	// MaxBins); 0: 1 s.
	Bin time.Duration
	// BlockSize is the tokens per id when no line says (tokentap's
	// block_size); 0: 512.
	BlockSize int64
}

// Report is what `sidecar capture stats` says of a trace
// (docs/capture.md, "Trace statistics"); its JSON is the --json output.
type Report struct {
	File     string `json:"file"`
	Requests int64  `json:"requests"`
	// BlockSize is the tokens per id.
	BlockSize int64 `json:"block_size"`
	// DurationS is from the first arrival to the last.
	DurationS float64 `json:"duration_s"`
	// WindowS is the reuse window; nil: the whole trace.
	WindowS *float64 `json:"window_s"`
	Reuse   Reuse    `json:"reuse"`
	// Replicas are the trace's replicas, by name ("" for lines that name
	// none).
	Replicas   []Replica `json:"replicas"`
	IdealCache []Cache   `json:"ideal_cache"`
	InputLen   Dist      `json:"input_length"`
	OutputLen  Dist      `json:"output_length"`
	Arrivals   Arrivals  `json:"arrivals"`
	// ForgottenIDs counts ids the reuse windows forgot for their bound
	// before their time (reuse then missed is counted new).
	ForgottenIDs uint64 `json:"forgotten_ids"`
}

// Reuse counts prompt blocks: Reused were seen before within the window
// on any replica, Within on the request's own replica, Across on another
// replica only (Reused = Within + Across).
type Reuse struct {
	Blocks      int64   `json:"blocks"`
	Reused      int64   `json:"reused"`
	Within      int64   `json:"within_replica"`
	Across      int64   `json:"across_replicas"`
	Share       float64 `json:"share"`
	WithinShare float64 `json:"within_share"`
	AcrossShare float64 `json:"across_share"`
}

// Replica is one replica's part of Reuse.
type Replica struct {
	Name     string `json:"name"`
	Requests int64  `json:"requests"`
	Reuse
}

// Cache is one ideal LRU cache's hits: one cache in front of the whole
// trace, of SizeBlocks blocks.
type Cache struct {
	SizeBlocks int     `json:"size_blocks"`
	SizeTokens int64   `json:"size_tokens"`
	Hits       int64   `json:"hits"`
	Share      float64 `json:"share"`
}

// Dist is a length distribution. Percentiles are nearest-rank: Pp is the
// least value that at least p% of the values are at most (P50 of 1, 2,
// 3, 4 is 2). The zero value: no values.
type Dist struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   int64   `json:"p50"`
	P90   int64   `json:"p90"`
	P99   int64   `json:"p99"`
	Max   int64   `json:"max"`
}

// Arrivals is the arrival rate over time: Counts[i] requests arrived in
// [i·BinS, (i+1)·BinS) seconds after the first.
type Arrivals struct {
	BinS   float64 `json:"bin_s"`
	Counts []int64 `json:"counts"`
	// MeanRPS is (requests − 1) / DurationS (0 when the trace spans no
	// time); PeakRPS the fullest bin's count / BinS.
	MeanRPS float64 `json:"mean_rps"`
	PeakRPS float64 `json:"peak_rps"`
}

// replicaState is one replica's window and counts.
type replicaState struct {
	t   *prefix.Tracker
	out Replica
}

// Stats reads the trace r (named name) and reports on it.
func Stats(ctx context.Context, name string, r *workload.Reader, o StatsOptions) (*Report, error) {
	if o.Sizes == nil {
		o.Sizes = DefaultSizes
	}
	if o.MaxIDs <= 0 {
		o.MaxIDs = DefaultStatsMaxIDs
	}
	if o.Bin <= 0 {
		o.Bin = time.Second
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 512
	}
	window := o.Window
	if window <= 0 {
		window = 1 << 62 // the whole trace: longer than any trace
	}
	fleet := prefix.New(prefix.Options{Window: window, MaxIDs: o.MaxIDs})
	caches := make([]*prefix.Tracker, len(o.Sizes))
	for i, s := range o.Sizes {
		caches[i] = prefix.New(prefix.Options{Sizes: []int{s}})
	}
	hits := make([]int64, len(o.Sizes))
	replicas := map[string]*replicaState{}
	in, out := map[int64]int64{}, map[int64]int64{}
	var rep Report
	rep.File = name
	if o.Window > 0 {
		w := o.Window.Seconds()
		rep.WindowS = &w
	}
	binMs := max(o.Bin.Milliseconds(), 1)
	var counts []int64
	var first, last int64
	blockSet := false
	var ids []uint64
	for {
		if rep.Requests%4096 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		abs := req.Timestamp
		name := req.Replica
		if m := req.Tokentap; m != nil {
			if m.IDs == "fleet" && m.StartUnixMs > 0 {
				abs += m.StartUnixMs
			}
			if name == "" {
				name = m.Replica
			}
			if m.BlockSize > 0 && !blockSet {
				o.BlockSize, blockSet = m.BlockSize, true
			}
		}
		rs := replicas[name]
		if rs == nil {
			if len(replicas) == MaxReplicas {
				return nil, &workload.LineError{File: rep.File, Line: req.Line, Err: fmt.Errorf("replica %q: more than %d replicas", name, MaxReplicas)}
			}
			rs = &replicaState{t: prefix.New(prefix.Options{Window: window, MaxIDs: o.MaxIDs}), out: Replica{Name: name}}
			replicas[name] = rs
		}
		if rep.Requests == 0 {
			first, last = abs, abs
		}
		// An arrival before the latest (a trace mixing lines with and
		// without start_unix_ms) is taken as the latest, as prefix does.
		abs = max(abs, last)
		last = abs
		rep.Requests++
		at := time.UnixMilli(abs)
		ids = ids[:0]
		for _, id := range req.HashIDs {
			ids = append(ids, uint64(id))
		}
		f := fleet.Observe(at, ids)
		w := rs.t.Observe(at, ids)
		across := max(f.Reused-w.Reused, 0)
		n := int64(len(ids))
		rep.Reuse.Blocks += n
		rep.Reuse.Reused += int64(w.Reused + across)
		rep.Reuse.Within += int64(w.Reused)
		rep.Reuse.Across += int64(across)
		rs.out.Requests++
		rs.out.Blocks += n
		rs.out.Reused += int64(w.Reused + across)
		rs.out.Within += int64(w.Reused)
		rs.out.Across += int64(across)
		for i, c := range caches {
			hits[i] += int64(c.Observe(at, ids).Hits[0])
		}
		in[req.InputLength]++
		if req.HasOutputLength {
			out[req.OutputLength]++
		}
		bin := (abs - first) / binMs
		for bin >= MaxBins {
			binMs *= 2
			counts = widen(counts)
			bin = (abs - first) / binMs
		}
		for int64(len(counts)) <= bin {
			counts = append(counts, 0)
		}
		counts[bin]++
	}
	rep.BlockSize = o.BlockSize
	rep.DurationS = float64(last-first) / 1e3
	rep.Reuse.shares()
	rep.ForgottenIDs = fleet.Stats().Evicted
	for _, k := range slices.Sorted(maps.Keys(replicas)) {
		rs := replicas[k]
		rs.out.shares()
		rep.Replicas = append(rep.Replicas, rs.out)
		rep.ForgottenIDs += rs.t.Stats().Evicted
	}
	for i, s := range o.Sizes {
		rep.IdealCache = append(rep.IdealCache, Cache{SizeBlocks: s, SizeTokens: int64(s) * o.BlockSize, Hits: hits[i], Share: share(hits[i], rep.Reuse.Blocks)})
	}
	rep.InputLen, rep.OutputLen = dist(in), dist(out)
	rep.Arrivals = Arrivals{BinS: float64(binMs) / 1e3, Counts: counts}
	if counts == nil {
		rep.Arrivals.Counts = []int64{}
	}
	if rep.DurationS > 0 {
		rep.Arrivals.MeanRPS = float64(rep.Requests-1) / rep.DurationS
	}
	if len(counts) > 0 {
		rep.Arrivals.PeakRPS = float64(slices.Max(counts)) / rep.Arrivals.BinS
	}
	return &rep, nil
}

// widen merges counts' bins in pairs.
func widen(counts []int64) []int64 {
	out := counts[:0]
	for i := 0; i < len(counts); i += 2 {
		v := counts[i]
		if i+1 < len(counts) {
			v += counts[i+1]
		}
		out = append(out, v)
	}
	return out
}

func (r *Reuse) shares() {
	r.Share, r.WithinShare, r.AcrossShare = share(r.Reused, r.Blocks), share(r.Within, r.Blocks), share(r.Across, r.Blocks)
}

func share(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// dist summarises the values counted in m (value → count).
func dist(m map[int64]int64) Dist {
	var d Dist
	keys := slices.Sorted(maps.Keys(m))
	var sum float64
	for _, k := range keys {
		d.Count += m[k]
		sum += float64(k) * float64(m[k])
	}
	if d.Count == 0 {
		return d
	}
	d.Mean = sum / float64(d.Count)
	d.Max = keys[len(keys)-1]
	rank := func(p int64) int64 { // nearest rank: ceil(p/100 · n)
		want := (p*d.Count + 99) / 100
		var seen int64
		for _, k := range keys {
			seen += m[k]
			if seen >= want {
				return k
			}
		}
		return d.Max
	}
	d.P50, d.P90, d.P99 = rank(50), rank(90), rank(99)
	return d
}
