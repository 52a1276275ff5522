package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A burst writes the allocation profile of the sample before it, the
// one of its own sample and the heap profile; a sample over the bound
// with no profile before it, one under it, and bursts past max write
// nothing.
func TestBurstCatcher(t *testing.T) {
	n := 0
	failing := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case failing:
			http.Error(w, "no", http.StatusInternalServerError)
		case r.URL.Path == "/debug/pprof/allocs":
			n++
			w.Write([]byte("allocs-" + strconv.Itoa(n)))
		case r.URL.Path == "/debug/pprof/heap":
			w.Write([]byte("heap-" + strconv.Itoa(n)))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	b := &burstCatcher{c: srv.Client(), pprof: srv.URL, dir: dir, over: 100 * mib, max: 1}
	ctx := context.Background()
	for i, heap := range []float64{120, 50, 130, 140} { // over with nothing before; under; the burst; past max
		if err := b.after(ctx, sample{Elapsed: float64(10 * i), HeapInuse: heap * mib}); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
	}
	want := map[string]string{"allocs-before-20s.pprof": "allocs-2", "allocs-at-20s.pprof": "allocs-3", "heap-at-20s.pprof": "heap-3"}
	files, _ := os.ReadDir(dir)
	if len(files) != len(want) || b.caught != 1 {
		t.Errorf("%d files, caught %d; want %d files, 1 caught", len(files), b.caught, len(want))
	}
	for name, body := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != body {
			t.Errorf("%s: %q, %v; want %q", name, got, err, body)
		}
	}
	failing = true
	if err := b.after(ctx, sample{HeapInuse: 10 * mib}); err == nil {
		t.Error("a profile answered 500: no error")
	}
	var zero burstCatcher
	if err := zero.after(ctx, sample{HeapInuse: 500 * mib}); err != nil || zero.caught != 0 {
		t.Errorf("the zero value: %v, caught %d", err, zero.caught)
	}
}
