package config

import (
	"fmt"
	"slices"
	"time"

	"github.com/tokentap/tokentap/prefix"
)

// Reuse is the live prefix reuse section (docs/capture.md, "Live
// reuse"): the share of the live prompts' blocks seen within a window,
// and what ideal LRU caches of declared sizes would have held, counted
// from the capture's block ids.
//
// The zero value is auto: on where the capture is on (capture.file),
// off otherwise; then a window of 1 h, ideal caches of 256 and 2048
// blocks, and prefix.DefaultMaxIDs ids remembered.
type Reuse struct {
	// Enabled is auto (on with the capture), on (with or without the
	// capture's file) or off; empty: auto.
	Enabled string `yaml:"enabled"`
	// Window is how long a block stays seen; 0: 1h.
	Window time.Duration `yaml:"window"`
	// CacheBlocks are the ideal LRU caches' sizes, in blocks of
	// capture.block_size tokens; empty: 256 and 2048.
	CacheBlocks []int `yaml:"cache_blocks"`
	// MaxIDs bounds the ids the window remembers; past it the oldest are
	// forgotten and counted; 0: prefix.DefaultMaxIDs.
	MaxIDs int `yaml:"max_ids"`
}

// Defaults of Reuse's zero fields.
const (
	DefaultReuseWindow = time.Hour
	// MaxReuseWindow bounds reuse.window; memory is bounded by max_ids
	// whatever the window.
	MaxReuseWindow = 7 * 24 * time.Hour
	// MaxReuseIDs bounds reuse.max_ids: about 80 bytes an id.
	MaxReuseIDs = 1 << 23
)

// DefaultCacheBlocks is reuse.cache_blocks' zero value.
func DefaultCacheBlocks() []int { return []int{256, 2048} }

// On reports whether the live reuse is on, given whether the capture's
// file is set.
func (r Reuse) On(captureFile bool) bool {
	switch r.Enabled {
	case "on":
		return true
	case "", "auto":
		return captureFile
	}
	return false
}

// Options returns the tracker's options, defaults filled in.
func (r Reuse) Options() prefix.Options {
	o := prefix.Options{Window: r.Window, Sizes: slices.Clone(r.CacheBlocks), MaxIDs: r.MaxIDs}
	if o.Window == 0 {
		o.Window = DefaultReuseWindow
	}
	if len(o.Sizes) == 0 {
		o.Sizes = DefaultCacheBlocks()
	}
	if o.MaxIDs == 0 {
		o.MaxIDs = prefix.DefaultMaxIDs
	}
	return o
}

// Validate returns one error per problem; captureFile says whether the
// capture's file is set.
func (r Reuse) Validate(captureFile bool) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch r.Enabled {
	case "", "auto", "on", "off":
	default:
		bad("reuse.enabled: must be auto, on or off, got %q", r.Enabled)
	}
	given := r.Window != 0 || r.CacheBlocks != nil || r.MaxIDs != 0
	if given && !r.On(captureFile) {
		bad("reuse: settings given but the live reuse is off (reuse.enabled: on, or a capture.file with enabled auto)")
	}
	if r.Window < 0 || r.Window > MaxReuseWindow || (r.Window > 0 && r.Window < time.Second) {
		bad("reuse.window: must be 1s to %v (0: 1h), got %v", MaxReuseWindow, r.Window)
	}
	if len(r.CacheBlocks) > prefix.MaxSizes {
		bad("reuse.cache_blocks: at most %d sizes (each is a label value), got %d", prefix.MaxSizes, len(r.CacheBlocks))
	}
	total := 0
	for i, s := range r.CacheBlocks {
		if s <= 0 {
			bad("reuse.cache_blocks[%d]: must be above 0 blocks, got %d", i, s)
		}
		if slices.Contains(r.CacheBlocks[:i], s) {
			bad("reuse.cache_blocks[%d]: %d is given twice", i, s)
		}
		total += max(s, 0)
	}
	if total > prefix.MaxBlocks {
		bad("reuse.cache_blocks: at most %d blocks together (about 40 bytes each), got %d", prefix.MaxBlocks, total)
	}
	if r.MaxIDs < 0 || r.MaxIDs > MaxReuseIDs {
		bad("reuse.max_ids: must be 0 to %d (0: %d; about 80 bytes an id), got %d", MaxReuseIDs, prefix.DefaultMaxIDs, r.MaxIDs)
	}
	return errs
}
