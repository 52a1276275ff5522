//go:build linux

package faults

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Loss always counted: the records directory is deleted under load (800
// streamed requests, 16 at a time), then recreated, and 50 requests
// follow. No record goes into
// the deleted file: those that cannot be written are dropped and
// counted, so written + dropped = requests and written = the lines the
// file held when it was deleted plus the lines of the new file (see
// below for the one batch that may race the test's stop).
//
// The sidecar is stopped (SIGSTOP) for the instant of the deletion, so
// that the lines the deleted file held are known exactly; requests are in
// flight across it. A batch that races the deletion is record's unit test
// (TestFileDeletedDuringWriteCountedDropped).
func TestRecordsDirDeleted(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "records")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "records.jsonl")
	up := upstream(t, quickStream)
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	c := newClient(t)

	const sent, after, workers, deleteAt, recreateAt = 800, 50, 16, 200, 500
	// The worker whose request is the deleteAt-th or recreateAt-th to
	// finish hands over to the test's goroutine and waits; the other
	// workers go on.
	milestone, ack := make(chan struct{}), make(chan struct{})
	var done, next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= sent {
					return
				}
				resp, _, err := postRead(c, s.proxy, chatBody(fmt.Sprintf("m-%d", i), true))
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("request %d: %v %v", i, err, resp)
				}
				if n := done.Add(1); n == deleteAt || n == recreateAt {
					milestone <- struct{}{}
					<-ack
				}
			}
		})
	}
	var linesAtDeletion int
	for i := range 2 { // in the order they come
		<-milestone
		switch i {
		case 0:
			s.signal(syscall.SIGSTOP)
			waitStopped(t, s.pid)
			linesAtDeletion = len(readRecords(t, path))
			err := os.RemoveAll(dir)
			s.signal(syscall.SIGCONT)
			if err != nil {
				t.Fatal(err)
			}
		case 1:
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		ack <- struct{}{}
	}
	wg.Wait()
	// Within a second (its retry interval) the writer re-creates the file
	// in the recreated directory, traffic or not; then 50 more requests.
	if !waitUntil(5*time.Second, func() bool { _, err := os.Stat(path); return err == nil }) {
		t.Fatal("the records file was not re-created within 5 s of its directory")
	}
	for i := range after {
		if resp, _, err := postRead(c, s.proxy, chatBody(fmt.Sprintf("after-%d", i), true)); err != nil || resp.StatusCode != 200 {
			t.Errorf("after-%d: %v", i, err)
		}
	}
	const total = sent + after
	var written, dropped float64
	if !waitUntil(10*time.Second, func() bool {
		written, dropped = s.metric("tokentap_records_written_total"), s.metric("tokentap_records_dropped_total")
		return written+dropped >= total
	}) {
		t.Fatalf("written %v + dropped %v after 10 s, want %d", written, dropped, total)
	}
	// Records written once the directory is back reach the new file within
	// a second (the writer's retry interval), and nothing else is pending.
	var now []rec
	waitUntil(3*time.Second, func() bool {
		now = readRecords(t, path)
		return linesAtDeletion+len(now) >= int(written)
	})
	t.Logf("%d requests: written %v (%d lines in the file when it was deleted, %d in the new one), dropped %v",
		total, written, linesAtDeletion, len(now), dropped)
	if written+dropped != total {
		t.Errorf("written %v + dropped %v = %v, want %d requests", written, dropped, written+dropped, total)
	}
	// Exactly equal, unless the stop fell between a batch's write and the
	// writer's fstat after it: that batch is then in the lines counted at
	// the deletion but dropped (never the other way round). A batch holds
	// at most the records of the requests in flight.
	if lines := linesAtDeletion + len(now); int(written) > lines || lines-int(written) > workers {
		t.Errorf("written %v, but the files hold %d + %d lines", written, linesAtDeletion, len(now))
	}
	if dropped == 0 || len(now) < after {
		t.Errorf("want records dropped while the directory was gone (%v) and the last %d in the new file (%d)", dropped, after, len(now))
	}
	if w := s.metric("tokentap_records_write_errors_total"); w == 0 {
		t.Error("tokentap_records_write_errors_total is 0")
	}
	if !s.log.waitFor("records file: deleted, and the path cannot be re-created", 2*time.Second) {
		t.Error("the loss is not logged")
	}
}

// waitStopped waits until every thread of process pid is stopped
// (kill(2) returns before a SIGSTOP has taken effect).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	if !waitUntil(5*time.Second, func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return false
		}
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				return false
			}
			// The state follows the command name's closing parenthesis.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("process %d did not stop within 5 s", pid)
	}
}
