package record

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// linesIn counts the whole lines of the files at paths (a missing file
// has none).
func linesIn(t *testing.T, paths ...string) int {
	t.Helper()
	n := 0
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			n += len(fileIDs(t, p))
		}
	}
	return n
}

// A records file deleted between batches is re-created at the path
// before the next batch: nothing goes into the deleted file, nothing is
// lost. No tick helps (CheckInterval is an hour).
func TestFileDeletedRecreatedBeforeWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	log, logs := testLogger()
	f, err := OpenFile(path, FileOptions{Logger: log, CheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFile(t, f)
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("a-%d", i), 10))
	}
	settle(t, f, 5)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("b-%d", i), 10))
	}
	settle(t, f, 10)
	sameIDs(t, "re-created file", fileIDs(t, path), idRange("b", 0, 5))
	if st := f.Stats(); st != (FileStats{Written: 10}) {
		t.Fatalf("stats %+v, want 10 written (5 in the deleted file before it was deleted, 5 in the new one)", st)
	}
	if logs.lines("reopened") != 1 || !strings.Contains(logs.String(), "path removed") {
		t.Fatalf("want one line about re-creating the removed path:\n%s", logs)
	}
}

// deletingFile removes its path just before one armed write: the batch
// lands in a file that no longer has a name.
type deletingFile struct {
	*os.File
	path  string
	armed *atomic.Bool
}

func (d *deletingFile) Write(b []byte) (int, error) {
	if d.armed.CompareAndSwap(true, false) {
		_ = os.Remove(d.path)
	}
	return d.File.Write(b)
}

// A batch written to a file deleted under the writer's feet is counted
// as dropped (and one write error), not written; the next batch goes to
// the re-created file.
func TestFileDeletedDuringWriteCountedDropped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	var armed atomic.Bool
	open := func(p string) (fileHandle, error) {
		h, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		return &deletingFile{File: h, path: p, armed: &armed}, nil
	}
	log, logs := testLogger()
	f, err := openFile(path, FileOptions{Logger: log, CheckInterval: time.Hour}, fileHooks{open: open})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFile(t, f)
	f.Write(fileRecord("a-0", 10))
	settle(t, f, 1)
	armed.Store(true)
	f.Write(fileRecord("lost-0", 10))
	settle(t, f, 2)
	if st := f.Stats(); st != (FileStats{Written: 1, WriteErrors: 1, Dropped: 1}) {
		t.Fatalf("stats %+v: the record written into the deleted file must be dropped, not written", st)
	}
	f.Write(fileRecord("b-0", 10))
	settle(t, f, 3)
	sameIDs(t, "re-created file", fileIDs(t, path), []string{"b-0"})
	if st := f.Stats(); st.Written != 2 || st.Dropped != 1 {
		t.Fatalf("stats %+v", st)
	}
	waitFor(t, 2*time.Second, "the loss to be logged", func() bool {
		return strings.Contains(logs.String(), "records file deleted while records were written to it")
	})
}

// With its directory gone too, the path cannot be re-created: records
// are dropped and counted (never written to the deleted file), the path
// is tried again once per CheckInterval (by the injected clock), and
// writing resumes when the directory is back. Written equals the lines
// in the files.
func TestFileDirectoryDeleted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "records")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "records.jsonl")
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	var opens atomic.Int32
	open := func(p string) (fileHandle, error) {
		opens.Add(1)
		return openAppend(p)
	}
	log, logs := testLogger()
	f, err := openFile(path, FileOptions{Logger: log, Clock: clock, CheckInterval: time.Hour}, fileHooks{open: open})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFile(t, f)
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("a-%d", i), 10))
	}
	settle(t, f, 5)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		f.Write(fileRecord(fmt.Sprintf("lost-%d", i), 10))
		settle(t, f, 6+i)
	}
	st := f.Stats()
	if st.Written != 5 || st.Dropped != 10 || st.WriteErrors == 0 {
		t.Fatalf("stats %+v: want 5 written, 10 dropped", st)
	}
	if o := opens.Load(); o != 2 {
		t.Errorf("%d opens: want the first and one try within the interval", o)
	}
	if logs.lines("the path cannot be re-created; records are dropped") != 1 {
		t.Errorf("want one line saying the path cannot be re-created:\n%s", logs)
	}

	// The directory is back, but the next try is not due yet.
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.Write(fileRecord("early-0", 10))
	settle(t, f, 16)
	if _, err := os.Stat(path); err == nil {
		t.Fatal("the path was re-created before the interval")
	}
	now.Add(int64(time.Hour))
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("b-%d", i), 10))
	}
	settle(t, f, 21)
	sameIDs(t, "re-created file", fileIDs(t, path), idRange("b", 0, 5))
	st = f.Stats()
	if st.Written != 10 || st.Dropped != 11 {
		t.Fatalf("stats %+v: want 10 written, 11 dropped", st)
	}
	if got := linesIn(t, path); got+5 != int(st.Written) { // 5 went to the first file before it was deleted
		t.Fatalf("%d lines in the new file, written %d", got, st.Written)
	}
}
