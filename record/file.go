package record

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrFileClosed is returned by Reopen after Close.
var ErrFileClosed = errors.New("record: records file closed")

// FileOptions configures a File. The zero value is usable.
type FileOptions struct {
	// Logger receives the file's fault reports (failed writes, dropped
	// records, reopens). nil discards them.
	Logger *slog.Logger
	// QueueSize is how many records may wait in memory between the
	// request path and the writer goroutine. When the queue is full, Write
	// drops the record and counts it. 0 (or less) means 4096.
	QueueSize int
	// Clock tells the time for rate-limiting fault logs; it must be safe
	// for concurrent use. nil means time.Now.
	Clock func() time.Time
	// CheckInterval is how often the writer re-stats the path to notice
	// that the file was renamed away or replaced, and reopens it when it
	// was; and, while the file is deleted and cannot be re-created, how
	// often it tries again. 0 (or less) means 1s.
	CheckInterval time.Duration
	// Encode, if set, turns each item queued with WriteItem into its
	// line, newline included, appended to dst, on the writer goroutine,
	// just before the batch it is in is written. fresh is true for the
	// first item bound for a file opened since the previous item was
	// encoded: the first file, a reopen (Reopen, a rename noticed) or a
	// re-creation after deletion, or the same file again when nothing of
	// it was written (a failed write into an empty file). An encoder
	// keeps per-file state (a capture's time origin) and restarts it
	// when fresh. It is called by one goroutine only. nil: items are
	// lines already, written as they are.
	Encode func(dst, item []byte, fresh bool) []byte
}

// FileStats are a File's counters since OpenFile. They only grow.
type FileStats struct {
	// Written counts records written whole to the file.
	Written uint64
	// WriteErrors counts failed write(2) calls (a full disk, an I/O
	// error...) and batches that went, or would have gone, to a deleted
	// file; one failure may lose several records, see Dropped.
	WriteErrors uint64
	// Dropped counts records that never reached the file: the queue was
	// full, their write failed, the file was deleted (and could not be
	// re-created), or they came after (or were still queued when the
	// deadline of) Close.
	Dropped uint64
	// Queued is how many records wait in memory now, at most
	// FileOptions.QueueSize.
	Queued int
	// Waited is how long the writer has waited on a stream (a pipe, a
	// FIFO, stdout: stream.go): in write(2) to a reader that did not
	// read, and for a FIFO's reader to open it, the waits under way
	// included. 0 for a regular file.
	Waited time.Duration
}

// File is a Sink that appends one JSON line per record to a file and
// survives the file's faults:
//
//   - Write never blocks the request path: records are queued and a
//     single goroutine writes them, batching what is queued into one
//     write(2). When the queue is full the record is dropped and counted.
//   - A record is written whole or not at all. When a write fails or is
//     short (ENOSPC, EIO...), the file is truncated back to its size
//     before that write, the batch's records are counted as dropped, and
//     later records are tried again: writing resumes by itself once the
//     disk has room.
//   - Reopen reopens the path (SIGHUP after logrotate's create), and the
//     writer reopens it by itself when it notices, within CheckInterval,
//     that the path was renamed away or now names another file.
//   - A deleted file is never written to: before and after each batch's
//     write the writer asks fstat whether the open file still has a link
//     (a name). Before, a deleted file is re-created at the path; after,
//     the batch went into no file and is counted as dropped, not
//     written. When the path cannot be re-created (its directory is
//     gone too), records are dropped and counted until it can, tried
//     once per CheckInterval; directories are never created.
//   - Faults are logged at most once every 10 s, with how many errors and
//     drops there were since the previous line.
//   - A stream (a FIFO at the path, or stdout with NewStream) never
//     blocks OpenFile, Reopen or Close on its reader: stream.go.
//
// A nil *File discards everything.
type File struct {
	path  string
	log   *slog.Logger
	clock func() time.Time
	check time.Duration

	// mu orders Write's send on queue against Close's close of it.
	mu     sync.RWMutex
	closed bool
	queue  chan []byte

	reopenReq chan chan error
	abort     chan struct{} // closed when Close's context expires
	done      chan struct{} // closed when the writer has exited
	closeErr  error         // set by the writer before done is closed

	written, writeErrors, dropped atomic.Uint64
	// Stream waits (stream.go), in nanoseconds: done, and the starts
	// (unix nanos; 0: none) of the pump's write and of a FIFO's wait for
	// a reader under way.
	waitNanos, writeSince, readerSince atomic.Int64

	lim faultLimiter

	// Owned by the writer goroutine.
	hooks     fileHooks
	f         fileHandle
	off       int64 // the file's size as far as we know: where the next write lands
	trunc     int64 // a size the file must be cut back to before the next write; -1 if none
	buf       []byte
	openFails bool      // the last attempt to reopen the path failed (logged once)
	statFails bool      // the last stat of the path failed oddly (logged once)
	lost      bool      // the open file is deleted and the path could not be re-created
	retryAt   time.Time // while lost: when to try the path again
	encode    func(dst, item []byte, fresh bool) []byte
	items     [][]byte // the batch's items, with encode
	gen       int64    // files opened so far (reopen counts them)
	encGen    int64    // gen of the file the encoder last encoded for; -1: none
	// stream: the open file is not a regular file (a pipe, a FIFO, a
	// terminal, stdout): written through p, never truncated or checked
	// for deletion (stream.go). f is nil while a FIFO has no reader.
	stream bool
	std    bool  // stdout (NewStream): no path
	p      *pump // the stream's pump; nil for a regular file
}

// fileHandle is the part of *os.File the writer uses; tests wrap it to
// inject faults.
type fileHandle interface {
	io.Writer
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Sync() error
	Close() error
}

// fileHooks let tests reach inside the writer.
type fileHooks struct {
	open        func(path string) (fileHandle, error) // nil: openAppend
	beforeWrite func()                                // called by the writer before each write(2)
	afterTick   func()                                // called by the writer after each CheckInterval's work
	reopening   func()                                // called by Reopen before it asks the writer
}

const (
	defaultQueueSize     = 4096
	defaultCheckInterval = time.Second
	faultLogEvery        = 10 * time.Second
	maxBatchBytes        = 256 << 10
)

// OpenFile opens (creating it if needed, mode 0644) the records file at
// path for appending and starts its writer goroutine. Call Close to stop
// it. The path may name a FIFO: it is opened without blocking, and, with
// no reader yet, records are queued until one opens it (stream.go).
func OpenFile(path string, opts FileOptions) (*File, error) {
	return openFile(path, opts, fileHooks{})
}

func openFile(path string, opts FileOptions, hooks fileHooks) (*File, error) {
	f := newFile(path, opts, hooks)
	h, off, regular, err := f.openPath()
	switch {
	case err == nil:
		f.f, f.off, f.stream = h, off, !regular
		if f.stream {
			f.p = f.startPump(h)
		}
	case noReader(err):
		// A FIFO with no reader yet: wait for one, tried every
		// CheckInterval (reconnect).
		f.stream = true
		f.readerSince.Store(f.clock().UnixNano())
		f.log.Warn("records: the FIFO has no reader yet; records are queued, and dropped when the queue is full, until one opens it",
			"path", path, "queue", cap(f.queue))
	default:
		return nil, fmt.Errorf("records file: %w", err)
	}
	go f.run()
	return f, nil
}

// newFile makes a File with opts, its writer not started.
func newFile(path string, opts FileOptions, hooks fileHooks) *File {
	if hooks.open == nil {
		hooks.open = openAppend
	}
	f := &File{
		path:      path,
		log:       opts.Logger,
		clock:     opts.Clock,
		check:     opts.CheckInterval,
		reopenReq: make(chan chan error),
		abort:     make(chan struct{}),
		done:      make(chan struct{}),
		hooks:     hooks,
		trunc:     -1,
		encode:    opts.Encode,
		encGen:    -1,
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	if f.clock == nil {
		f.clock = time.Now
	}
	if f.check <= 0 {
		f.check = defaultCheckInterval
	}
	n := opts.QueueSize
	if n <= 0 {
		n = defaultQueueSize
	}
	f.queue = make(chan []byte, n)
	return f
}

// Write marshals r on the caller's goroutine and queues the line for the
// writer. It never blocks: when the queue is full, or after Close, the
// record is dropped and counted.
func (f *File) Write(r *Record) {
	if f == nil || r == nil {
		return
	}
	line, err := r.MarshalJSON()
	if err != nil {
		f.drop(1)
		return
	}
	f.enqueue(append(line, '\n'))
}

// WriteItem queues item, which the file now owns, for FileOptions.Encode
// (without it, item must be a whole line, newline included). Like Write,
// it never blocks: when the queue is full, or after Close, the item is
// dropped and counted.
func (f *File) WriteItem(item []byte) {
	if f == nil {
		return
	}
	f.enqueue(item)
}

func (f *File) enqueue(line []byte) {
	f.mu.RLock()
	queued := false
	if !f.closed {
		select {
		case f.queue <- line:
			queued = true
		default:
		}
	}
	f.mu.RUnlock()
	if !queued {
		f.drop(1)
	}
}

// Stats returns the file's counters.
func (f *File) Stats() FileStats {
	if f == nil {
		return FileStats{}
	}
	return FileStats{Written: f.written.Load(), WriteErrors: f.writeErrors.Load(), Dropped: f.dropped.Load(),
		Queued: len(f.queue), Waited: f.waited()}
}

// Reopen writes what is queued to the file now open, then closes it and
// opens the path again (creating it, mode 0644). The sidecar calls it on
// SIGHUP, after logrotate has renamed the file away (`create` mode).
// Records whose Write returned before Reopen was called go to the old
// file. If the path cannot be opened, the old file stays in use, the
// error is returned, and the writer retries every CheckInterval if the
// path is missing or names another file. A stream (stdout, a FIFO the
// path still names) is kept as it is, and Reopen never waits on a write
// to it: reopenStream.
func (f *File) Reopen() error {
	if f == nil {
		return nil
	}
	f.mu.RLock()
	closed := f.closed
	f.mu.RUnlock()
	if closed {
		return ErrFileClosed
	}
	reply := make(chan error, 1)
	if f.hooks.reopening != nil {
		f.hooks.reopening()
	}
	select {
	case f.reopenReq <- reply:
	case <-f.done:
		return ErrFileClosed
	}
	select {
	case err := <-reply:
		return err
	case <-f.done:
		return ErrFileClosed
	}
}

// Close stops accepting records, writes those already queued, fsyncs and
// closes the file; the writer goroutine has then exited. If ctx expires
// first, Close returns ctx.Err() at once and the records still queued
// are counted as dropped; the writer drops what it holds and exits as
// soon as the write(2) it may be blocked in returns. Later calls return
// nil.
func (f *File) Close(ctx context.Context) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
		}
		return nil
	}
	f.closed = true
	close(f.queue)
	f.mu.Unlock()
	select {
	case <-f.done:
		f.lim.report(f, true)
		return f.closeErr
	case <-ctx.Done():
	}
	close(f.abort)
	// The writer drains too; each record goes to exactly one of us.
	for range f.queue {
		f.dropped.Add(1)
	}
	f.lim.report(f, true)
	return ctx.Err()
}

func (f *File) drop(n int) {
	f.dropped.Add(uint64(n))
	f.lim.report(f, false)
}

// run is the writer goroutine.
func (f *File) run() {
	defer close(f.done)
	tick := time.NewTicker(f.check)
	defer tick.Stop()
	for {
		queue := f.queue
		if f.paused() {
			queue = nil // a stream's reader is not taking them: they wait, bounded
		}
		select {
		case line, ok := <-queue:
			if !ok {
				f.finish()
				return
			}
			if _, open := f.batch(line); !open {
				f.finish()
				return
			}
		case d := <-f.pumpDone():
			f.pumped(d)
		case reply := <-f.reopenReq:
			if f.stream {
				reply <- f.reopenStream()
				continue
			}
			open := f.flushQueued(len(f.queue))
			reply <- f.reopen() // the caller logs it
			if !open {
				f.finish()
				return
			}
		case <-tick.C:
			if f.stream {
				f.reconnect()
			} else {
				f.checkPath()
			}
			f.lim.report(f, false)
			if f.hooks.afterTick != nil {
				f.hooks.afterTick()
			}
		case <-f.abort:
			f.abandon()
			return
		}
	}
}

// batch writes first and whatever else is queued, up to maxBatchBytes, in
// one write of n records. It reports false when it found the queue closed.
func (f *File) batch(first []byte) (n int, open bool) {
	buf := f.buf[:0]
	size := len(first)
	if f.encode != nil {
		f.items = append(f.items[:0], first)
	} else {
		buf = append(buf, first...)
	}
	n = 1
	open = true
collect:
	for size < maxBatchBytes {
		select {
		case line, ok := <-f.queue:
			if !ok {
				open = false
				break collect
			}
			if f.encode != nil {
				f.items = append(f.items, line)
			} else {
				buf = append(buf, line...)
			}
			size += len(line)
			n++
		default:
			break collect
		}
	}
	buf = f.write(buf, n)
	clear(f.items)
	if cap(buf) <= 4*maxBatchBytes {
		f.buf = buf[:0]
	} else {
		f.buf = nil // one huge record: do not keep its buffer
	}
	return n, open
}

// flushQueued writes at least k queued records (what was queued when a
// Reopen came), not more than a batch beyond. It reports false when it
// found the queue closed.
func (f *File) flushQueued(k int) (open bool) {
	for k > 0 {
		select {
		case line, ok := <-f.queue:
			if !ok {
				return false
			}
			n, open := f.batch(line)
			if !open {
				return false
			}
			k -= n
		default:
			return true
		}
	}
	return true
}

// write appends buf, which holds n whole lines (with Encode: the lines of
// the n items in f.items, encoded once the file they go to is known), to
// the file: all of it, or nothing. It returns the buffer, for reuse.
func (f *File) write(buf []byte, n int) []byte {
	if f.hooks.beforeWrite != nil {
		f.hooks.beforeWrite()
	}
	select {
	case <-f.abort:
		f.dropped.Add(uint64(n))
		return buf
	default:
	}
	if f.stream {
		f.encodeItems(&buf)
		f.send(buf, n)
		return nil // the pump's now; pumped takes it back
	}
	if (f.lost || f.deleted()) && !f.recreate() {
		f.lose(n, "records file deleted, and its path cannot be re-created")
		return buf
	}
	f.encodeItems(&buf)
	if f.trunc >= 0 {
		// A failed write left bytes that could not be cut off then.
		if err := f.f.Truncate(f.trunc); err == nil {
			f.off = f.trunc
		} else {
			// Still not: end the partial line so that ours start on a
			// line of their own.
			buf = append([]byte{'\n'}, buf...)
		}
		f.trunc = -1
	}
	w, err := f.f.Write(buf)
	if err == nil && w == len(buf) {
		f.off += int64(w)
		if f.deleted() {
			// Deleted before or while we wrote: the lines are in no file.
			f.lose(n, "records file deleted while records were written to it")
			f.recreate() // for the next batch
			return buf
		}
		f.written.Add(uint64(n))
		return buf
	}
	if err == nil {
		err = io.ErrShortWrite
	}
	// Cut the file back to its size before this write. Prefer what fstat
	// says to the tracked offset: someone may have truncated the file
	// (copytruncate) since we last wrote.
	before, regular := f.off, true
	if st, serr := f.f.Stat(); serr == nil {
		if regular = st.Mode().IsRegular(); regular {
			before = max(st.Size()-int64(w), 0)
		}
	}
	if w > 0 && regular {
		if terr := f.f.Truncate(before); terr != nil {
			f.trunc = before
			err = fmt.Errorf("%w (and truncating back to %d bytes: %v)", err, before, terr)
		}
	}
	f.off = before
	if before == 0 && f.trunc < 0 {
		f.encGen = -1 // nothing of the file was written: the next item starts it again
	}
	f.lim.noteErr(err) // before counting, so that a report sees it
	f.writeErrors.Add(1)
	f.dropped.Add(uint64(n))
	f.lim.report(f, false)
	return buf
}

// encodeItems encodes the batch's items into *buf, with Encode.
func (f *File) encodeItems(buf *[]byte) {
	if f.encode == nil {
		return
	}
	b := (*buf)[:0]
	for i, item := range f.items {
		b = f.encode(b, item, i == 0 && f.encGen != f.gen)
	}
	f.encGen = f.gen
	*buf = b
}

// lose counts a batch of n records that went, or would have gone, to a
// deleted file: one write error, n drops, logged (rate-limited) with why.
func (f *File) lose(n int, why string) {
	f.lim.noteErr(errors.New(why))
	f.writeErrors.Add(1)
	f.dropped.Add(uint64(n))
	f.lim.report(f, false)
}

// deleted reports whether the open file has been deleted: fstat says it
// has no link left, and the path does not name it (a file system that
// reports no links for a linked file is not fooled). Where fstat cannot
// tell, it reports false.
func (f *File) deleted() bool {
	st, err := f.f.Stat()
	if err != nil {
		return false // the write will say
	}
	if n, ok := links(st); !ok || n > 0 {
		return false
	}
	pst, err := os.Stat(f.path)
	return err != nil || !os.SameFile(pst, st)
}

// recreate opens the path again after the open file was deleted; while
// that keeps failing, at most once per CheckInterval. It reports whether
// a file is open at the path now.
func (f *File) recreate() bool {
	now := f.clock()
	if f.lost && now.Before(f.retryAt) {
		return false
	}
	if err := f.reopen(); err != nil {
		if !f.lost {
			f.log.Error("records file: deleted, and the path cannot be re-created; records are dropped and counted until it can",
				"path", f.path, "error", err)
		}
		f.lost, f.retryAt = true, now.Add(f.check)
		return false
	}
	f.log.Warn("records file: reopened", "path", f.path, "reason", "path removed")
	return true
}

// checkPath reopens the path when it no longer names the open file.
func (f *File) checkPath() {
	if f.lost || f.deleted() {
		f.recreate()
		return
	}
	pst, err := os.Stat(f.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		if !f.statFails {
			f.statFails = true
			f.log.Warn("records file: cannot check the path", "path", f.path, "error", err)
		}
		return
	}
	f.statFails = false
	if err == nil {
		if fst, ferr := f.f.Stat(); ferr == nil && os.SameFile(pst, fst) {
			return
		}
	}
	// The open file still has a name (renamed away): it may be written
	// to until the path can be opened.
	why := "path replaced by another file"
	if err != nil {
		why = "path removed"
	}
	if rerr := f.reopen(); rerr != nil {
		if !f.openFails {
			f.log.Error("records file: cannot reopen; still writing to the old file under its new name", "path", f.path, "reason", why, "error", rerr)
		}
		f.openFails = true
		return
	}
	f.log.Warn("records file: reopened", "path", f.path, "reason", why)
}

// reopen opens the path and, if that worked, closes the file open until
// now. A stream found at the path is written through a pump from now on.
func (f *File) reopen() error {
	h, off, regular, err := f.openPath()
	if err != nil {
		return err
	}
	if f.trunc >= 0 {
		_ = f.f.Truncate(f.trunc) // last try on the old file
	}
	if err := f.f.Close(); err != nil {
		f.log.Warn("records file: closing the old file", "path", f.path, "error", err)
	}
	f.f, f.off, f.trunc, f.lost = h, off, -1, false
	if f.stream = !regular; f.stream {
		f.p = f.startPump(h)
	}
	f.gen++
	if f.openFails {
		f.openFails = false
		f.log.Info("records file: reopened after failures", "path", f.path)
	}
	return nil
}

// openPath opens the path, and says its size and whether it is a
// regular file (not a stream).
func (f *File) openPath() (fileHandle, int64, bool, error) {
	h, err := f.hooks.open(f.path)
	if err != nil {
		return nil, 0, false, err
	}
	st, err := h.Stat()
	if err != nil {
		h.Close()
		return nil, 0, false, err
	}
	if !st.Mode().IsRegular() {
		return h, 0, false, nil
	}
	return h, st.Size(), true, nil
}

// finish ends a drained writer: fsync and close. A stream's last batch
// is waited for (until Close's deadline: abort), neither synced nor
// closed by the writer (its pump closes it).
func (f *File) finish() {
	if f.stream {
		if done := f.pumpDone(); done != nil {
			select {
			case d := <-done:
				f.pumped(d)
			case <-f.abort:
				f.abandon()
				return
			}
		}
		f.retire()
		return
	}
	if f.trunc >= 0 {
		_ = f.f.Truncate(f.trunc)
	}
	err := f.f.Sync()
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		f.closeErr = fmt.Errorf("records file: %w", err)
	}
}

// abandon ends a writer whose Close gave up: the rest is dropped. A
// stream is closed, which wakes a write parked on a FIFO: its pump then
// counts that batch as dropped. (A write to stdout may stay blocked in
// write(2) until the process exits, its batch counted as neither;
// nothing waits for it.)
func (f *File) abandon() {
	for range f.queue {
		f.dropped.Add(1)
	}
	if f.stream {
		if h := f.f; h != nil {
			f.retire()
			_ = h.Close()
		}
		return
	}
	if f.trunc >= 0 {
		_ = f.f.Truncate(f.trunc)
	}
	f.closeErr = f.f.Close()
}

// faultLimiter writes at most one fault line per faultLogEvery, saying
// what was lost since the previous line.
type faultLimiter struct {
	next    atomic.Int64 // unix nanos before which nothing is logged
	mu      sync.Mutex
	errs    uint64 // WriteErrors at the last line
	drops   uint64 // Dropped at the last line
	lastErr error  // the latest write error
}

// noteErr keeps the latest write error for the next line.
func (l *faultLimiter) noteErr(err error) {
	l.mu.Lock()
	l.lastErr = err
	l.mu.Unlock()
}

// report logs the errors and drops since the last line, if any, when the
// limit allows or when final.
func (l *faultLimiter) report(f *File, final bool) {
	now := f.clock()
	if !final && now.UnixNano() < l.next.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !final && now.UnixNano() < l.next.Load() {
		return
	}
	errs, drops := f.writeErrors.Load()-l.errs, f.dropped.Load()-l.drops
	if errs == 0 && drops == 0 {
		return
	}
	l.errs += errs
	l.drops += drops
	l.next.Store(now.Add(faultLogEvery).UnixNano())
	if errs > 0 {
		f.log.Error("records file: write failed, records dropped", "path", f.path,
			"write_errors", errs, "dropped", drops, "error", l.lastErr)
	} else {
		f.log.Warn("records file: records dropped (queue full or closed)", "path", f.path, "dropped", drops)
	}
}
