package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
)

// maxProfileBytes bounds one profile read from the sidecar's pprof
// endpoint (a heap or allocation profile of the soak's sidecar is a few
// hundred kB).
const maxProfileBytes = 64 << 20

// burstCatcher catches what allocated a burst of heap: after every
// sample it reads the sidecar's allocation profile (cumulative since
// the start), and when a sample's heap in use is over its bound it
// writes the profile taken one sample before (allocs-before-T.pprof),
// the one taken now (allocs-at-T.pprof) and the heap profile
// (heap-at-T.pprof), T the sample's elapsed seconds. What was allocated
// between the two samples:
//
//	go tool pprof -sample_index=alloc_space -base allocs-before-T.pprof allocs-at-T.pprof
//
// It writes at most max bursts. Its zero value catches nothing.
type burstCatcher struct {
	c      *http.Client
	pprof  string  // the sidecar's profiling base URL (peerbench sidecar -pprof)
	dir    string  // where the profiles go
	over   float64 // heap in use, bytes, above which a sample is a burst
	max    int
	prev   []byte // the allocation profile of the last sample
	caught int
}

// after reads the allocation profile after sample s, and writes the
// profiles when s is a burst. A profile that cannot be read or written
// is an error; the next sample tries again.
func (b *burstCatcher) after(ctx context.Context, s sample) error {
	if b.pprof == "" {
		return nil
	}
	cur, err := b.fetch(ctx, "allocs")
	if err != nil {
		return err
	}
	prev := b.prev
	b.prev = cur
	if s.HeapInuse <= b.over || b.caught >= b.max || prev == nil {
		return nil
	}
	heap, err := b.fetch(ctx, "heap")
	if err != nil {
		return err
	}
	b.caught++
	tag := fmt.Sprintf("%.0fs", s.Elapsed)
	for name, p := range map[string][]byte{"allocs-before-": prev, "allocs-at-": cur, "heap-at-": heap} {
		if err := os.WriteFile(filepath.Join(b.dir, name+tag+".pprof"), p, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "soak sample: %s: heap in use %.1f MiB, over %.1f: profiles %s/*-%s.pprof\n",
		tag, s.HeapInuse/(1<<20), b.over/(1<<20), b.dir, tag)
	return nil
}

func (b *burstCatcher) fetch(ctx context.Context, profile string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.pprof+"/debug/pprof/"+profile, nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/debug/pprof/%s: %s", profile, resp.Status)
	}
	p, err := io.ReadAll(io.LimitReader(resp.Body, maxProfileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(p) > maxProfileBytes {
		return nil, fmt.Errorf("/debug/pprof/%s: over %d bytes", profile, maxProfileBytes)
	}
	return p, nil
}
