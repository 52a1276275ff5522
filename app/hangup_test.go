package app

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every SIGHUP reopens, but the log says so at most once a second, each
// line counting the signals since the previous one; a failed reopen is
// an error line naming it.
func TestHangupLogRateLimited(t *testing.T) {
	var logs lockedBuffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &hangups{log: slog.New(slog.NewTextHandler(&logs, nil)), clock: func() time.Time { return now }, path: "r.jsonl"}
	for range 100 {
		h.reopened(nil)
		now = now.Add(time.Millisecond)
	}
	if got := strings.Count(logs.String(), "\n"); got != 1 || !strings.Contains(logs.String(), "signals=1") {
		t.Fatalf("100 signals in 100 ms: %d lines, want 1 with signals=1:\n%s", got, logs.String())
	}
	now = now.Add(time.Second)
	h.reopened(errors.New("permission denied"))
	h.reopened(nil) // within the second: no line
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "level=ERROR") || !strings.Contains(lines[1], "signals=100 failed=1") ||
		!strings.Contains(lines[1], "permission denied") {
		t.Fatalf("want a second line, an error counting 100 signals and 1 failure:\n%s", logs.String())
	}
}

// Through the sidecar: 50 SIGHUPs, each after a rotation (the file
// renamed away): every one reopens the path, and the log has at most one
// line per second of the test, not two per signal.
func TestHangupReopensEveryTimeLogsOnce(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	hup := make(chan os.Signal)
	var logs lockedBuffer
	a, path := startSidecarEnv(t, up.URL, func(e *Env) { e.Hangup, e.Stderr = hup, &logs })
	start := time.Now()
	const signals = 50
	for i := range signals {
		if err := os.Rename(path, fmt.Sprintf("%s.%d", path, i)); err != nil {
			t.Fatalf("rotation %d: %v (the previous SIGHUP did not reopen the path)", i, err)
		}
		hup <- syscall.SIGHUP
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, err := os.Stat(path); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("SIGHUP %d: the path was not reopened within 5 s", i)
			}
		}
	}
	took := time.Since(start)
	resp, err := post(t, a.Proxy, "m", false)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	readRecords(t, path, 1) // the request after the last rotation is in the new file
	var n int
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "reopen") {
			n++
		}
	}
	if max := 1 + int(took/hangupLogEvery); n < 1 || n > max {
		t.Fatalf("%d SIGHUPs in %v: %d log lines about reopening, want 1 to %d:\n%s", signals, took, n, max, logs.String())
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), fmt.Sprintf("records.jsonl.%d", signals-1))); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d SIGHUPs in %v: %d reopens, %d log lines", signals, took.Round(time.Millisecond), signals, n)
}
