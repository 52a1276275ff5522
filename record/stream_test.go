//go:build unix

package record

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mkfifo makes a FIFO in a test directory.
func mkfifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "records.fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// returnsWithin runs fn and fails the test if it has not returned
// within d: the bound on a call that must not block (not a window in
// which something must happen).
func returnsWithin(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked for %v", what, d)
	}
}

// readIDs reads n record lines from r and returns their ids.
func readIDs(t *testing.T, r io.Reader, n int) []string {
	t.Helper()
	br := bufio.NewReader(r)
	var ids []string
	for range n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d lines: %v", len(ids), err)
		}
		_, rest, _ := strings.Cut(line, `"id":"`)
		id, _, _ := strings.Cut(rest, `"`)
		ids = append(ids, id)
	}
	return ids
}

// A FIFO with no reader: OpenFile, Write, Reopen and Close's deadline
// never block on it; the records wait in the queue (counted in Queued,
// the wait in Waited) and reach the reader that opens it later, in
// order.
func TestFIFONoReader(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := mkfifo(t)
	log, logs := testLogger()
	var f *File
	returnsWithin(t, 10*time.Second, "OpenFile of a FIFO with no reader", func() {
		var err error
		if f, err = OpenFile(path, FileOptions{Logger: log, CheckInterval: time.Millisecond}); err != nil {
			t.Error(err)
		}
	})
	if f == nil {
		t.FailNow()
	}
	if !strings.Contains(logs.String(), "the FIFO has no reader yet") {
		t.Errorf("log: %s", logs)
	}
	for i := range 10 {
		f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
	}
	if st := f.Stats(); st.Queued != 10 || st.Written != 0 || st.Dropped != 0 {
		t.Fatalf("stats %+v: want the 10 queued", st)
	}
	returnsWithin(t, 10*time.Second, "Reopen with no reader", func() {
		if err := f.Reopen(); err != nil {
			t.Errorf("Reopen: %v", err)
		}
	})
	before := f.Stats().Waited
	r, err := os.Open(path) // the reader comes
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sameIDs(t, "read from the FIFO", readIDs(t, r, 10), idRange("r", 0, 10))
	settle(t, f, 10)
	if st := f.Stats(); st.Written != 10 || st.Waited < before || before <= 0 {
		t.Fatalf("stats %+v (waited %v before the reader): want 10 written and the wait counted", st, before)
	}
	f.Write(fileRecord("r-10", 10))
	sameIDs(t, "after", readIDs(t, r, 1), []string{"r-10"})
	closeFile(t, f)
	checkGoroutines()
}

// A reader that stops reading: the pipe fills, the writer's batch waits
// in the pump, the queue fills and the rest is dropped and counted;
// Write, Reopen and Close (at its deadline) return without waiting for
// the reader; memory held is the queue and one batch. Close wakes the
// stuck write, whose batch is counted as dropped: every record is
// counted once.
func TestFIFOStuckReader(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := mkfifo(t)
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a reader that never reads
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := OpenFile(path, FileOptions{QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000 // 2000 × ~1 KiB: far more than the pipe (64 KiB), a batch (256 KiB) and the queue hold
	returnsWithin(t, 10*time.Second, "Write to a stuck reader", func() {
		for i := range n {
			f.Write(fileRecord(fmt.Sprintf("r-%d", i), 1000))
			if i%64 == 0 {
				time.Sleep(time.Millisecond) // let the writer take some
			}
		}
	})
	waitFor(t, 10*time.Second, "the pump stuck and the queue full", func() bool {
		st := f.Stats()
		return st.Queued == 16 && f.writeSince.Load() != 0
	})
	returnsWithin(t, 10*time.Second, "Reopen with a write stuck", func() {
		if err := f.Reopen(); err != nil {
			t.Errorf("Reopen: %v", err)
		}
	})
	st := f.Stats()
	if st.Dropped == 0 || st.Waited <= 0 {
		t.Fatalf("stats %+v: want drops counted and the wait", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	returnsWithin(t, 10*time.Second, "Close with a write stuck", func() {
		if err := f.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close: %v, want its deadline", err)
		}
	})
	<-f.done
	settle(t, f, n) // the pump, woken by the close, counts its batch
	checkGoroutines()
	if st := f.Stats(); st.Queued != 0 || st.Dropped == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The reader leaves (EPIPE) and another comes: the records of the
// failed write are dropped and counted, the FIFO is opened again, and
// the next records reach the new reader.
func TestFIFOReaderLeavesAndComes(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := mkfifo(t)
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	log, logs := testLogger()
	f, err := OpenFile(path, FileOptions{Logger: log, CheckInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // gone before reading anything
	f.Write(fileRecord("lost", 10))
	waitFor(t, 10*time.Second, "the reader's leaving noticed", func() bool { return logs.lines("reader is gone") == 1 })
	if st := f.Stats(); st.WriteErrors != 1 || st.Dropped != 1 || st.Written != 0 {
		t.Fatalf("stats %+v", st)
	}
	f.Write(fileRecord("next", 10))
	r2, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	sameIDs(t, "the new reader", readIDs(t, r2, 1), []string{"next"})
	closeFile(t, f)
	checkGoroutines()
}

// stdout (records: -) behind a reader that stopped: the same bounds.
// NewStream never closes its writer.
func TestStreamStuckWriter(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	pr, pw := io.Pipe()
	f := NewStream(pw, FileOptions{QueueSize: 4})
	f.Write(fileRecord("r-0", 10)) // in the pump, blocked: nobody reads
	waitFor(t, 10*time.Second, "the pump stuck", func() bool { return f.writeSince.Load() != 0 })
	returnsWithin(t, 10*time.Second, "Write and Reopen on a stuck stdout", func() {
		for i := 1; i <= 100; i++ {
			f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
		}
		if err := f.Reopen(); err != nil {
			t.Errorf("Reopen: %v", err)
		}
	})
	if st := f.Stats(); st.Queued != 4 || st.Dropped != 96 || st.Written != 0 {
		t.Fatalf("stats %+v: want 4 queued, 96 dropped", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := f.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close: %v", err)
	}
	<-f.done                                     // the writer has exited; the pump is still in its write
	pr.CloseWithError(errors.New("reader gone")) // ends the write: its record is counted
	settle(t, f, 101)
	checkGoroutines()
	if st := f.Stats(); st.WriteErrors != 1 || st.Written != 0 {
		t.Fatalf("stats %+v: want the stuck write's failure counted", st)
	}
	if _, err := pw.Write([]byte("x")); err == nil || err.Error() != "reader gone" {
		t.Fatalf("the writer was closed by the File: %v", err)
	}
}

// stdout that reads: records arrive in order, Close drains them.
func TestStreamWrites(t *testing.T) {
	pr, pw := io.Pipe()
	f := NewStream(pw, FileOptions{})
	go func() {
		for i := range 100 {
			f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
		}
	}()
	sameIDs(t, "stdout", readIDs(t, pr, 100), idRange("r", 0, 100))
	closeFile(t, f)
	if st := f.Stats(); st.Written != 100 || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}
