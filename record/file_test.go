package record

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// fileRecord is a record with id and a model name of pad bytes.
func fileRecord(id string, pad int) *Record {
	r := New(0)
	r.ID = id
	r.Traffic = "live"
	r.API = stream.NameChat
	r.Model = strings.Repeat("m", pad)
	r.Outcome = Success
	return r
}

// fileIDs reads a records file, failing the test unless every line is a
// whole JSON object, and returns the records' ids in order.
func fileIDs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("%s does not end with a newline: truncated last line %q", path, tail(b))
	}
	var ids []string
	for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if len(b) == 0 {
			break
		}
		var rec struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("%s line %d does not parse (%v): %q", path, i+1, err, tail(line))
		}
		ids = append(ids, rec.ID)
	}
	return ids
}

func tail(b []byte) []byte {
	if len(b) > 80 {
		return b[len(b)-80:]
	}
	return b
}

func idRange(prefix string, from, to int) []string {
	var ids []string
	for i := from; i < to; i++ {
		ids = append(ids, fmt.Sprintf("%s-%d", prefix, i))
	}
	return ids
}

func sameIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s: got ids %v, want %v", what, got, want)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// settle waits until the writer has dealt with all n records written so far.
func settle(t *testing.T, f *File, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d records written or dropped", n), func() bool {
		st := f.Stats()
		return st.Written+st.Dropped == uint64(n)
	})
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) lines(substr string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func testLogger() (*slog.Logger, *lockedBuffer) {
	b := &lockedBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

func closeFile(t *testing.T, f *File) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// baselineGoroutines returns a check that the goroutine count is back to
// what it is now.
func baselineGoroutines(t *testing.T) func() {
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Fatalf("goroutines: %d, baseline %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// faultyFile wraps a real file; its writes and truncations fail on demand.
type faultyFile struct {
	*os.File
	c *faultControl
}

type faultControl struct {
	failWrites atomic.Int32 // next writes to fail, after writing half their bytes
	failTruncs atomic.Int32 // next truncations to fail
	writeErr   error
	partial    atomic.Int32 // writes that failed after writing some bytes
	syncs      atomic.Int32
	dirty      atomic.Bool // written since the last sync
	closedDirt atomic.Int32
}

func take(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

func (ff *faultyFile) Write(b []byte) (int, error) {
	ff.c.dirty.Store(true)
	if take(&ff.c.failWrites) {
		n, _ := ff.File.Write(b[:len(b)/2])
		if n > 0 {
			ff.c.partial.Add(1)
		}
		return n, ff.c.writeErr
	}
	n, err := ff.File.Write(b)
	if err != nil && n > 0 {
		ff.c.partial.Add(1)
	}
	return n, err
}

func (ff *faultyFile) Truncate(size int64) error {
	if take(&ff.c.failTruncs) {
		return syscall.EIO
	}
	return ff.File.Truncate(size)
}

func (ff *faultyFile) Sync() error {
	ff.c.syncs.Add(1)
	ff.c.dirty.Store(false)
	return ff.File.Sync()
}

func (ff *faultyFile) Close() error {
	if ff.c.dirty.Load() {
		ff.c.closedDirt.Add(1)
	}
	return ff.File.Close()
}

func faultyOpen(c *faultControl) func(string) (fileHandle, error) {
	return func(path string) (fileHandle, error) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		return &faultyFile{File: f, c: c}, nil
	}
}

func TestFileBasic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	f, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := range n {
		f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
	}
	closeFile(t, f)
	sameIDs(t, "records file", fileIDs(t, path), idRange("r", 0, n))
	if st := f.Stats(); st != (FileStats{Written: n}) {
		t.Fatalf("stats %+v, want %d written and nothing else", st, n)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644&^umask() {
		t.Errorf("mode %v, want 0644 less the umask", fi.Mode().Perm())
	}
}

func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

func TestFileAppendsToExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	line, _ := fileRecord("old-0", 1).MarshalJSON()
	if err := os.WriteFile(path, append(line, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.Write(fileRecord("new-0", 1))
	closeFile(t, f)
	sameIDs(t, "records file", fileIDs(t, path), []string{"old-0", "new-0"})
}

func TestFileOpenError(t *testing.T) {
	_, err := OpenFile(filepath.Join(t.TempDir(), "no", "such", "dir", "records.jsonl"), FileOptions{})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenFile in a missing directory: %v, want ErrNotExist", err)
	}
}

func TestFileNil(t *testing.T) {
	var f *File
	f.Write(fileRecord("x", 1))
	if f.Stats() != (FileStats{}) || f.Reopen() != nil || f.Close(context.Background()) != nil {
		t.Fatal("a nil *File must discard quietly")
	}
}

// mountTmpfs mounts a tmpfs of the given size on a new directory and
// unmounts it when the test ends (after the cleanups registered later,
// which close files on it).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("disk-full test cannot run under CI=true: %s", why)
		}
		t.Skipf("SKIPPED: the disk-full test did not run: %s (run as root to test full disks; CI=true makes this a failure)", why)
	}
	if os.Geteuid() != 0 {
		skip("not root, cannot mount a tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		skip(fmt.Sprintf("mount -t tmpfs: %v: %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

func TestFileDiskFull(t *testing.T) {
	dir := mountTmpfs(t, "64k")
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 16<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "records.jsonl")
	log, logs := testLogger()
	c := &faultControl{} // no faults injected: a spy on the real writes
	f, err := openFile(path, FileOptions{Logger: log}, fileHooks{open: faultyOpen(c)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(context.Background()) })

	// Fill the disk, one write at a time.
	n := 0
	for f.Stats().WriteErrors == 0 {
		if n == 200 {
			t.Fatalf("no write error after %d records of 1.5 KB on a 64 KiB tmpfs: %+v", n, f.Stats())
		}
		f.Write(fileRecord(fmt.Sprintf("full-%d", n), 1500))
		n++
		settle(t, f, n)
	}
	// And keep writing to the full disk, in batches too.
	for range 3 {
		for range 5 {
			f.Write(fileRecord(fmt.Sprintf("full-%d", n), 1500))
			n++
		}
		settle(t, f, n)
	}
	st := f.Stats()
	t.Logf("disk full after %d records: %+v, partial writes %d", n, st, c.partial.Load())
	if st.WriteErrors == 0 || st.Dropped == 0 || st.Written+st.Dropped != uint64(n) {
		t.Fatalf("stats %+v after %d records on a full disk", st, n)
	}
	if c.partial.Load() == 0 {
		t.Fatalf("no write was short: the test did not exercise cutting a partial line")
	}
	ids := fileIDs(t, path) // every line whole
	if uint64(len(ids)) != st.Written {
		t.Fatalf("%d lines in the file, %d records counted written", len(ids), st.Written)
	}
	sameIDs(t, "records before the disk filled", ids, idRange("full", 0, len(ids)))
	if logs.lines("write failed") == 0 || !strings.Contains(logs.String(), "no space left on device") {
		t.Fatalf("no log line about the failure:\n%s", logs)
	}

	// Room again: writing resumes without Reopen or restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		f.Write(fileRecord(fmt.Sprintf("after-%d", i), 1500))
	}
	n += 3
	settle(t, f, n)
	if got := f.Stats(); got.Written != st.Written+3 || got.Dropped != st.Dropped {
		t.Fatalf("after freeing space: stats %+v, was %+v; want 3 more written", got, st)
	}
	closeFile(t, f)
	ids = fileIDs(t, path)
	sameIDs(t, "records after space came back", ids[len(ids)-3:], idRange("after", 0, 3))
}

// TestFileShortWrite injects short writes and a failed truncation.
func TestFileShortWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	c := &faultControl{writeErr: syscall.EIO}
	log, logs := testLogger()
	f, err := openFile(path, FileOptions{Logger: log}, fileHooks{open: faultyOpen(c)})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	write := func(id string) {
		f.Write(fileRecord(id, 100))
		n++
		settle(t, f, n)
	}
	write("ok-0")
	write("ok-1")

	c.failWrites.Store(2) // two short writes, each cut back
	write("lost-0")
	write("lost-1")
	if c.partial.Load() != 2 {
		t.Fatalf("%d partial writes, want 2", c.partial.Load())
	}
	sameIDs(t, "after two cut-back short writes", fileIDs(t, path), []string{"ok-0", "ok-1"})
	write("ok-2")

	// A short write whose truncation fails, and fails again before the
	// next write: the partial line is ended and the next records stand on
	// lines of their own.
	c.failWrites.Store(1)
	c.failTruncs.Store(2)
	write("lost-2")
	write("ok-3")
	write("ok-4")
	closeFile(t, f)

	if st := f.Stats(); st != (FileStats{Written: 5, WriteErrors: 3, Dropped: 3}) {
		t.Fatalf("stats %+v", st)
	}
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("want 3 lines, the stranded half line, 2 lines; got %d:\n%s", len(lines), b)
	}
	var rec struct{ ID string }
	if json.Unmarshal([]byte(lines[3]), &rec) == nil || !strings.Contains(lines[3], `"lost-2"`) {
		t.Fatalf("line 4 should be the stranded half of lost-2: %q", lines[3])
	}
	var got []string
	for i, l := range append(lines[:3:3], lines[4:]...) {
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("line %d: %v: %q", i, err, l)
		}
		got = append(got, rec.ID)
	}
	sameIDs(t, "whole records", got, []string{"ok-0", "ok-1", "ok-2", "ok-3", "ok-4"})
	if !strings.Contains(logs.String(), "input/output error") {
		t.Fatalf("the error is not logged:\n%s", logs)
	}
}

// TestFileFaultLogRateLimited: one line per 10 s, then a line with what
// happened since.
func TestFileFaultLogRateLimited(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	c := &faultControl{writeErr: syscall.ENOSPC}
	log, logs := testLogger()
	path := filepath.Join(t.TempDir(), "records.jsonl")
	var ticks atomic.Int64
	f, err := openFile(path, FileOptions{Logger: log, Clock: clock, CheckInterval: 5 * time.Millisecond},
		fileHooks{open: faultyOpen(c), afterTick: func() { ticks.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFile(t, f)
	// ticksPass waits until the writer has done n more rounds of its
	// periodic work (each could have logged a line).
	ticksPass := func(n int64) {
		t.Helper()
		from := ticks.Load()
		waitFor(t, 10*time.Second, "the writer's ticks", func() bool { return ticks.Load() >= from+n })
	}
	c.failWrites.Store(5)
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
		settle(t, f, i+1)
		now.Add(int64(time.Second))
	}
	ticksPass(3) // inside the 10 s
	if got := logs.lines("write failed"); got != 1 {
		t.Fatalf("%d fault lines within 10 s, want 1:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "write_errors=1 dropped=1") {
		t.Fatalf("first line should count 1 error, 1 drop:\n%s", logs)
	}
	now.Add(int64(6 * time.Second)) // 11 s after the first line
	waitFor(t, 2*time.Second, "the summary line", func() bool { return logs.lines("write failed") == 2 })
	if !strings.Contains(logs.String(), "write_errors=4 dropped=4") || !strings.Contains(logs.String(), "no space left on device") {
		t.Fatalf("summary should count the 4 later errors and name the error:\n%s", logs)
	}
	ticksPass(3)
	if got := logs.lines("write failed"); got != 2 {
		t.Fatalf("%d fault lines, want 2 (nothing new to report):\n%s", got, logs)
	}
}

func TestFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	f, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		f.Write(fileRecord(fmt.Sprintf("a-%d", i), 10))
	}
	// No waiting: records whose Write returned before Reopen go to the
	// old file.
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		f.Write(fileRecord(fmt.Sprintf("b-%d", i), 10))
	}
	closeFile(t, f)
	sameIDs(t, "rotated file", fileIDs(t, path+".1"), idRange("a", 0, 100))
	sameIDs(t, "new file", fileIDs(t, path), idRange("b", 0, 100))
	if st := f.Stats(); st != (FileStats{Written: 200}) {
		t.Fatalf("stats %+v", st)
	}
}

// TestFileReopenWritesQueuedFirst: records queued behind a slow write
// when Reopen is called still go to the old file.
func TestFileReopenWritesQueuedFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	reopening := make(chan struct{}, 1)
	hooks := fileHooks{beforeWrite: func() {
		if armed.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-release
		}
	}, reopening: func() { reopening <- struct{}{} }}
	f, err := openFile(path, FileOptions{}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 8 {
		armed.Store(true)
		prefix := fmt.Sprintf("x%d", round)
		f.Write(fileRecord(prefix+"-0", 10))
		<-entered // the writer is stuck on x-0
		for i := 1; i < 20; i++ {
			f.Write(fileRecord(fmt.Sprintf("%s-%d", prefix, i), 10))
		}
		if err := os.Rename(path, fmt.Sprintf("%s.%d", path, round)); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Reopen() }()
		<-reopening // Reopen waits on the stuck writer
		release <- struct{}{}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	closeFile(t, f)
	for round := range 8 {
		sameIDs(t, fmt.Sprintf("rotated file %d", round), fileIDs(t, fmt.Sprintf("%s.%d", path, round)), idRange(fmt.Sprintf("x%d", round), 0, 20))
	}
	if ids := fileIDs(t, path); len(ids) != 0 {
		t.Fatalf("the current file holds %v, want nothing", ids)
	}
}

func TestFileDeletionNoticed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	log, logs := testLogger()
	f, err := OpenFile(path, FileOptions{Logger: log, CheckInterval: 20 * time.Millisecond})
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
	waitFor(t, 2*time.Second, "the deleted file to be recreated", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("b-%d", i), 10))
	}
	settle(t, f, 10)
	sameIDs(t, "recreated file", fileIDs(t, path), idRange("b", 0, 5))
	if logs.lines("reopened") != 1 || !strings.Contains(logs.String(), "path removed") {
		t.Fatalf("want one log line about reopening a removed path:\n%s", logs)
	}

	// The path renamed away and replaced by another file.
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the replaced file to be reopened", func() bool {
		return strings.Contains(logs.String(), "path replaced by another file")
	})
	for i := range 5 {
		f.Write(fileRecord(fmt.Sprintf("c-%d", i), 10))
	}
	settle(t, f, 15)
	sameIDs(t, "replacement file", fileIDs(t, path), idRange("c", 0, 5))
	sameIDs(t, "renamed file", fileIDs(t, path+".old"), idRange("b", 0, 5))
	if logs.lines("reopened") != 2 {
		t.Fatalf("want exactly two reopen lines:\n%s", logs)
	}
	if st := f.Stats(); st != (FileStats{Written: 15}) {
		t.Fatalf("stats %+v", st)
	}
}

// blockingHooks returns hooks whose first write blocks until release is
// closed; entered receives when it does.
func blockingHooks() (h fileHooks, entered <-chan struct{}, release chan struct{}) {
	in := make(chan struct{}, 1)
	release = make(chan struct{})
	var once sync.Once
	h.beforeWrite = func() {
		once.Do(func() {
			in <- struct{}{}
			<-release
		})
	}
	return h, in, release
}

func TestFileQueueFull(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := filepath.Join(t.TempDir(), "records.jsonl")
	hooks, entered, release := blockingHooks()
	log, logs := testLogger()
	f, err := openFile(path, FileOptions{Logger: log, QueueSize: 4}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(fileRecord("r-0", 10))
	<-entered // the writer holds r-0 and is stuck

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 1000; i++ {
			f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Write blocked on a stuck writer")
	}
	if st := f.Stats(); st.Dropped != 996 || st.Written != 0 {
		t.Fatalf("stats %+v, want 996 dropped (1000 minus a queue of 4)", st)
	}
	if logs.lines("records dropped") != 1 || !strings.Contains(logs.String(), "dropped=") {
		t.Fatalf("want one rate-limited line about the drops:\n%s", logs)
	}
	close(release)
	closeFile(t, f)
	sameIDs(t, "records file", fileIDs(t, path), idRange("r", 0, 5))
	if st := f.Stats(); st != (FileStats{Written: 5, Dropped: 996}) {
		t.Fatalf("stats %+v", st)
	}
	checkGoroutines()
}

func TestFileCloseDrainsAndSyncs(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := filepath.Join(t.TempDir(), "records.jsonl")
	c := &faultControl{}
	f, err := openFile(path, FileOptions{QueueSize: 1000}, fileHooks{open: faultyOpen(c)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
	}
	closeFile(t, f) // at once: the queue is drained
	sameIDs(t, "records file", fileIDs(t, path), idRange("r", 0, 1000))
	if c.syncs.Load() == 0 || c.closedDirt.Load() != 0 {
		t.Fatalf("%d fsyncs, closed with unsynced writes %d times: want the last write fsynced", c.syncs.Load(), c.closedDirt.Load())
	}
	checkGoroutines() // the writer has exited

	f.Write(fileRecord("late", 10)) // must not panic
	if st := f.Stats(); st != (FileStats{Written: 1000, Dropped: 1}) {
		t.Fatalf("stats %+v, want the late record dropped", st)
	}
	if err := f.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := f.Reopen(); !errors.Is(err, ErrFileClosed) {
		t.Fatalf("Reopen after Close: %v", err)
	}
	sameIDs(t, "records file after", fileIDs(t, path), idRange("r", 0, 1000))
}

func TestFileCloseDeadline(t *testing.T) {
	checkGoroutines := baselineGoroutines(t)
	path := filepath.Join(t.TempDir(), "records.jsonl")
	hooks, entered, release := blockingHooks()
	f, err := openFile(path, FileOptions{}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(fileRecord("r-0", 10))
	<-entered
	for i := 1; i < 4; i++ {
		f.Write(fileRecord(fmt.Sprintf("r-%d", i), 10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := f.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close on a stuck writer: %v, want the deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v with a 50ms deadline", d)
	}
	if st := f.Stats(); st.Dropped != 3 {
		t.Fatalf("stats %+v, want the 3 queued records dropped", st)
	}
	close(release) // the stuck write returns: the writer drops it and exits
	<-f.done
	if st := f.Stats(); st != (FileStats{Dropped: 4}) {
		t.Fatalf("stats %+v", st)
	}
	checkGoroutines()
}

// TestFileConcurrent: many writers, a reopen storm, nothing lost.
func TestFileConcurrent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "records.jsonl")
	f, err := OpenFile(path, FileOptions{QueueSize: 1 << 16, CheckInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				f.Write(fileRecord(fmt.Sprintf("g%d-%d", g, i), 50))
			}
		})
	}
	for i := range 5 {
		if err := os.Rename(path, fmt.Sprintf("%s.%d", path, i)); err != nil {
			t.Fatal(err)
		}
		if err := f.Reopen(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	closeFile(t, f)
	files, _ := filepath.Glob(path + "*")
	seen := map[string]int{}
	for _, p := range files {
		for _, id := range fileIDs(t, p) {
			seen[id]++
		}
	}
	if len(seen) != 8*500 {
		t.Fatalf("%d distinct records in %d files, want %d", len(seen), len(files), 8*500)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("record %s written %d times", id, k)
		}
	}
	if st := f.Stats(); st != (FileStats{Written: 8 * 500}) {
		t.Fatalf("stats %+v", st)
	}
}

var _ Sink = (*File)(nil)
