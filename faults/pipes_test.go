//go:build linux

package faults

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// --config naming a FIFO with no writer: the sidecar exits 2 at once,
// naming it (it used to block in open(2) before any output, past
// SIGTERM). The 30 s in runExit is the hang guard, not the bound: the
// time taken is logged.
func TestConfigFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "config.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, stderr := runExit(t, "--config", fifo)
	t.Logf("exit %d in %v: %s", code, time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
	want := "config file " + fifo + ": is a FIFO (named pipe), not a regular file"
	if code != 2 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q: want exit 2 and %q", code, stderr, want)
	}
}

// chatAnswer is a whole non-streamed chat answer.
func chatAnswer(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

// exitBound is the longest a SIGTERM may take with an idle sidecar whose
// records cannot be written: the grace period (nothing in flight: not
// used), the records close bound (app.recordsCloseBound, 10 s), and a
// margin for a busy machine.
const exitBound = 1*time.Second + 10*time.Second + 10*time.Second

// sendN sends n whole chat requests and fails unless each is answered 200.
func sendN(t *testing.T, s *sidecar, n int) {
	t.Helper()
	c := newClient(t)
	for i := range n {
		resp, _ := postAll(t, c, s.proxy, chatBody("m", false))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
}

// --records naming a FIFO with no reader: the sidecar comes up and
// serves, the records wait in memory (tokentap_records_queued), and
// SIGTERM exits within the grace period plus the records close bound,
// the records left counted as dropped.
func TestRecordsFIFONoReader(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "records.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	up := upstream(t, chatAnswer)
	s := startSidecar(t, "--upstream", up.URL, "--records", fifo, "--shutdown-grace", "1s", "--engine", "off")
	sendN(t, s, 5)
	if !waitUntil(10*time.Second, func() bool { return s.metric("tokentap_records_queued") == 5 }) {
		t.Fatalf("tokentap_records_queued %v, want the 5 records waiting", s.metric("tokentap_records_queued"))
	}
	if w := s.metric("tokentap_records_wait_seconds_total"); w <= 0 {
		t.Errorf("tokentap_records_wait_seconds_total %v: want the wait for a reader counted", w)
	}
	start := time.Now()
	s.signal(syscall.SIGTERM)
	code := s.wait(exitBound)
	t.Logf("exit %d %v after SIGTERM", code, time.Since(start).Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit %d", code)
	}
	if l := s.log.String(); !strings.Contains(l, "records dropped") || !strings.Contains(l, "dropped=5") {
		t.Errorf("the 5 records left are not reported dropped:\n%s", l)
	}
}

// --records naming a FIFO whose reader stops reading: the sidecar keeps
// serving (the records wait in the queue; past it they would be dropped
// and counted, record.TestFIFOStuckReader), a SIGHUP is handled at once
// (its log line), and SIGTERM exits within the grace period plus the
// records close bound, the records left reported dropped.
func TestRecordsFIFOStuckReader(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "records.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0) // reads nothing, ever
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	up := upstream(t, chatAnswer)
	s := startSidecar(t, "--upstream", up.URL, "--records", fifo, "--shutdown-grace", "1s", "--engine", "off")
	// A record is about 1 KB: 200 fill the pipe (64 KiB) and the
	// writer's batch stays in write(2).
	sendN(t, s, 200)
	if !waitUntil(10*time.Second, func() bool { return s.metric("tokentap_records_wait_seconds_total") > 0 }) {
		t.Fatal("tokentap_records_wait_seconds_total stays 0: the writer is not waiting on the reader")
	}
	s.signal(syscall.SIGHUP)
	if !s.log.waitFor("SIGHUP: records file reopened", 10*time.Second) {
		t.Fatal("SIGHUP not handled while the records writer is stuck")
	}
	sendN(t, s, 10) // still serving
	written, dropped := s.metric("tokentap_records_written_total"), s.metric("tokentap_records_dropped_total")
	t.Logf("written %v, dropped %v, queued %v, waited %vs", written, dropped, s.metric("tokentap_records_queued"), s.metric("tokentap_records_wait_seconds_total"))
	termDroppingRecords(t, s)
}

// --records - with a stdout pipe nobody reads (a log collector that
// stopped): the sidecar serves, SIGHUP is handled at once, and SIGTERM
// exits within the grace period plus the records close bound, though
// the write to stdout stays blocked in write(2).
func TestRecordsStdoutStuckReader(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close() // never read
	up := upstream(t, chatAnswer)
	s := startSidecarOut(t, pw, "--upstream", up.URL, "--records", "-", "--shutdown-grace", "1s", "--engine", "off")
	pw.Close() // the sidecar holds it
	sendN(t, s, 200)
	if !waitUntil(10*time.Second, func() bool {
		return s.metric("tokentap_records_wait_seconds_total") > 0 && s.metric("tokentap_records_queued") > 0
	}) {
		t.Fatal("the records writer is not waiting on stdout")
	}
	s.signal(syscall.SIGHUP)
	if !s.log.waitFor("SIGHUP: records file reopened", 10*time.Second) {
		t.Fatal("SIGHUP not handled while stdout is stuck")
	}
	sendN(t, s, 10)
	t.Logf("written %v, dropped %v, queued %v, waited %vs", s.metric("tokentap_records_written_total"), s.metric("tokentap_records_dropped_total"),
		s.metric("tokentap_records_queued"), s.metric("tokentap_records_wait_seconds_total"))
	termDroppingRecords(t, s)
}

// termDroppingRecords sends SIGTERM to a sidecar whose records reader is
// stuck or gone, and checks that it exits 0 within exitBound (the grace
// plus the records close bound, with margin) and reports the records it
// could not write as dropped.
func termDroppingRecords(t *testing.T, s *sidecar) {
	t.Helper()
	start := time.Now()
	s.signal(syscall.SIGTERM)
	code := s.wait(exitBound)
	t.Logf("exit %d %v after SIGTERM", code, time.Since(start).Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit %d", code)
	}
	if !strings.Contains(s.log.String(), "records dropped") {
		t.Errorf("the records left are not reported dropped")
	}
}
