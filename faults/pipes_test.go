//go:build linux

package faults

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// --config naming a FIFO with no writer: the sidecar exits 2 at once,
// naming it (it used to block in open(2) before any output, past
// SIGTERM). The 30 s in configCheck is the hang guard, not the bound:
// the time taken is logged.
func TestConfigFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "config.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stderr, took, _, _ := configCheck(t, fifo)
	t.Logf("exit %d in %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(stderr))
	want := "config file " + fifo + ": is a FIFO (named pipe), not a regular file"
	if code != 2 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q: want exit 2 and %q", code, stderr, want)
	}
}
