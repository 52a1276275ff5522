package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeProc is a /proc/PID directory: a status file and n descriptors.
func fakeProc(t *testing.T, status string, n int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "fd"), 0o755)
	for i := range n {
		os.WriteFile(filepath.Join(dir, "fd", string(rune('a'+i))), nil, 0o644)
	}
	return dir
}

func TestTakeSample(t *testing.T) {
	page := exposition + "process_cpu_seconds_total 12.5\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(page))
	}))
	defer srv.Close()
	proc := fakeProc(t, "Name:\tsidecar\nVmRSS:\t2048 kB\n", 5)
	s, err := takeSample(context.Background(), srv.Client(), proc, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	want := sample{RSS: 2 * mib, HeapInuse: 50 * mib, Goroutines: 1512, FDs: 5, Live: 102, CPU: 12.5}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	// A page without the runtime's series, a missing process, a refused
	// scrape: each an error, no sample.
	page = strings.ReplaceAll(exposition, "go_goroutines 1512", "")
	if _, err := takeSample(context.Background(), srv.Client(), proc, srv.URL); err == nil || !strings.Contains(err.Error(), "go_goroutines") {
		t.Errorf("no go_goroutines: err %v", err)
	}
	if _, err := takeSample(context.Background(), srv.Client(), filepath.Join(proc, "gone"), srv.URL); err == nil {
		t.Error("a missing process: no error")
	}
	if _, err := takeSample(context.Background(), srv.Client(), proc, srv.URL+"/x"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a 404: err %v", err)
	}
}

func TestLiveOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("since") {
		case "":
			w.Write([]byte(`{"seq":41,"records":[{"id":"x"}],"capacity":100}`))
		case "41":
			w.Write([]byte(`{"seq":41,"unchanged":true,"records":[]}`))
		default:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	d, code, err := liveOnce(context.Background(), srv.Client(), srv.URL+"/live/data?n=30")
	if err != nil || code != 200 || d.Seq != 41 || d.Unchanged {
		t.Errorf("first poll: %+v %d %v", d, code, err)
	}
	d, code, err = liveOnce(context.Background(), srv.Client(), srv.URL+"/live/data?since=41&n=30")
	if err != nil || code != 200 || !d.Unchanged {
		t.Errorf("unchanged poll: %+v %d %v", d, code, err)
	}
	if _, code, err := liveOnce(context.Background(), srv.Client(), srv.URL+"/live/data?since=7"); err != nil || code != 503 {
		t.Errorf("busy: %d %v", code, err)
	}
}
