package record

import (
	"errors"
	"io"
	"os"
	"time"
)

// Stream targets: a pipe, a FIFO, a terminal, a socket, stdout. Unlike a
// regular file, a stream can block a write for as long as its reader
// does not read, and a FIFO cannot even be opened for writing until a
// reader opens it. The writer goroutine must stay free meanwhile (Reopen
// on SIGHUP, Close at SIGTERM), so a stream's write(2) runs on a
// goroutine of its own, the pump, one batch at a time; while a batch is
// in it the writer takes nothing from the queue, which fills and then
// drops (counted) as with a slow disk: what a stuck reader costs is the
// queue (FileOptions.QueueSize records) plus one batch (maxBatchBytes
// and one record). A FIFO with no reader, at start or after its reader
// left (EPIPE), is opened again every CheckInterval, without blocking;
// the records wait in the queue meanwhile. A stream is never truncated,
// fsynced, re-created or checked for deletion; Reopen keeps a FIFO that
// the path still names (a pipe is not rotated).

// pump writes a stream's batches on its own goroutine.
type pump struct {
	work chan pumpJob  // the batch to write; closed to retire the pump
	done chan pumpDone // the result of each batch, in order
	busy bool          // owned by the writer: a batch is in the pump
}

type pumpJob struct {
	buf []byte
	n   int
}

type pumpDone struct {
	buf []byte
	err error
}

// startPump starts the pump of stream handle h. A retired pump (work
// closed) closes h after its last write.
func (f *File) startPump(h fileHandle) *pump {
	p := &pump{work: make(chan pumpJob, 1), done: make(chan pumpDone, 1)}
	go func() {
		for j := range p.work {
			start := f.clock()
			f.writeSince.Store(start.UnixNano())
			w, err := h.Write(j.buf)
			f.writeSince.Store(0)
			f.waitNanos.Add(int64(f.clock().Sub(start)))
			if err == nil && w < len(j.buf) {
				err = io.ErrShortWrite
			}
			if err == nil {
				f.written.Add(uint64(j.n))
			} else {
				f.lim.noteErr(err)
				f.writeErrors.Add(1)
				f.dropped.Add(uint64(j.n))
				f.lim.report(f, false)
			}
			p.done <- pumpDone{buf: j.buf, err: err}
		}
		_ = h.Close()
	}()
	return p
}

// send hands a batch of n records to the pump; the writer takes nothing
// more from the queue until the pump is done with it.
func (f *File) send(buf []byte, n int) {
	f.p.busy = true
	f.p.work <- pumpJob{buf: buf, n: n}
}

// pumped takes the pump's result: its buffer back, and, when the write
// failed on a FIFO (its reader left: EPIPE), the FIFO is let go and
// opened again, once a reader is there, by reconnect.
func (f *File) pumped(d pumpDone) {
	f.p.busy = false
	if cap(d.buf) <= 4*maxBatchBytes {
		f.buf = d.buf[:0]
	}
	if d.err == nil || f.std {
		return // stdout: every later write fails too, and is counted
	}
	// The pump is idle: close the FIFO now, so that a new reader never
	// opens it against this end and then reads an EOF.
	_ = f.f.Close()
	f.log.Warn("records: the pipe's reader is gone; records are queued, and dropped when the queue is full, until a reader opens it again",
		"path", f.path, "error", d.err)
	f.retire()
	f.readerSince.Store(f.clock().UnixNano())
}

// retire lets the stream go: its pump closes it after the batch it may
// be writing.
func (f *File) retire() {
	if f.p != nil {
		close(f.p.work)
		f.p = nil
	}
	f.f = nil
}

// paused reports whether the writer must leave the queue alone: a
// stream with no reader, or whose pump is busy.
func (f *File) paused() bool {
	return f.stream && (f.f == nil || (f.p != nil && f.p.busy))
}

// pumpDone is the channel of the busy pump's result, or nil.
func (f *File) pumpDone() <-chan pumpDone {
	if f.p != nil && f.p.busy {
		return f.p.done
	}
	return nil
}

// reconnect opens a FIFO that had no reader, if one is there now.
func (f *File) reconnect() {
	if f.f != nil || f.std {
		return
	}
	if err := f.openStream(); err != nil && !noReader(err) && !f.openFails {
		f.openFails = true
		f.log.Error("records: cannot open the path again; records are queued, and dropped when the queue is full", "path", f.path, "error", err)
	}
}

// openStream opens the path of a stream that has none open; a FIFO with
// no reader leaves it so (noReader).
func (f *File) openStream() error {
	h, off, regular, err := f.openPath()
	if err != nil {
		return err
	}
	f.f, f.off, f.trunc, f.lost, f.openFails = h, off, -1, false, false
	f.stream = !regular
	f.gen++
	if f.stream {
		f.p = f.startPump(h)
	}
	if since := f.readerSince.Swap(0); since != 0 {
		f.waitNanos.Add(f.clock().UnixNano() - since)
	}
	f.log.Info("records: reader connected; writing", "path", f.path)
	return nil
}

// reopenStream is Reopen for a stream: stdout, and a FIFO the path still
// names, are kept (nothing to rotate); a FIFO with no reader is tried
// now; a path that names another file now is opened in its place (the
// old stream is closed after the batch it may be writing).
func (f *File) reopenStream() error {
	if f.std {
		return nil
	}
	if f.f != nil {
		pst, err := os.Stat(f.path)
		if err == nil {
			if fst, ferr := f.f.Stat(); ferr == nil && os.SameFile(pst, fst) {
				return nil
			}
		}
		f.retire()
		f.readerSince.Store(f.clock().UnixNano())
	}
	if err := f.openStream(); err != nil && !noReader(err) {
		return err
	}
	return nil
}

// writerHandle is stdout (NewStream's writer) as a stream handle: never
// truncated, synced or closed by the File.
type writerHandle struct{ io.Writer }

func (writerHandle) Truncate(int64) error       { return errors.ErrUnsupported }
func (writerHandle) Stat() (os.FileInfo, error) { return nil, errors.ErrUnsupported }
func (writerHandle) Sync() error                { return nil }
func (writerHandle) Close() error               { return nil }

// NewStream returns a File that writes to w (the process's stdout,
// records: -) as to a stream: from a queue, on a pump goroutine, never
// blocking the request path, Reopen or Close (which gives up at its
// context's deadline, and counts what is left as dropped). The File
// never closes w. Its Stats count as OpenFile's do.
func NewStream(w io.Writer, opts FileOptions) *File {
	f := newFile("-", opts, fileHooks{})
	f.std, f.stream = true, true
	f.f = writerHandle{w}
	f.p = f.startPump(f.f)
	go f.run()
	return f
}

// waited is how long the writer has waited on a stream: in its writes,
// and for a FIFO's reader, the waits under way included.
func (f *File) waited() time.Duration {
	now := f.clock().UnixNano()
	d := f.waitNanos.Load()
	for _, s := range []int64{f.writeSince.Load(), f.readerSince.Load()} {
		if s != 0 && now > s {
			d += now - s
		}
	}
	return time.Duration(d)
}
