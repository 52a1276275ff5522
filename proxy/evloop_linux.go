//go:build linux

package proxy

import (
	"context"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tokentap/tokentap/internal/chunked"
)

// evloops is the state of a proxy's event-loop path. Its zero value is
// ready. The loop is Go's own poller: a stream's handler goroutine waits
// on its upstream socket's readiness there, with no goroutine of
// net/http's between it and the sockets (docs/design.md, "The event
// loop").
type evloops struct {
	// carried counts the answers whose body the path relayed (loopRelay
	// wrote their head).
	carried atomic.Int64
}

func (*evloops) supported() bool { return true }

func (e *evloops) streams() int64 { return e.carried.Load() }

// rawBufSize is the size of a relay's read buffer, and of the buffer the
// tap's Read fills from it: a read's body bytes always fit in one Read.
// 8 KiB is dozens of SSE events; a read that fills it is followed by
// another at once.
const rawBufSize = 8 << 10

// loopBufs are the buffers one wake of a relay uses, pooled, and held
// only while a read's bytes go through the tap's Read onto the client's
// socket: a parked stream holds none, nor does one whose tap is parsing
// (step gives them back first), so a relay that waits for a core or a
// lock there keeps nothing of the pool's. Two small objects of Go's
// size classes (raw and out together, 18 KiB; wb, 9.5 KiB), not one
// large object from the page heap.
//
// Design note: the first loop held 48 KiB through the whole wake, the
// tap's parse and a stream's end included; at a burst of load hundreds
// of relays held one each, and the pool's New took them from the page
// heap (docs/performance.md, "The second hour on the event loop").
type loopBufs struct {
	raw [rawBufSize]byte // what read(2) returned
	out [rawBufSize]byte // what the tap's Read returned
	wb  []byte           // out, framed as chunks, for one write(2)
}

var loopBufPool = sync.Pool{New: func() any { return &loopBufs{wb: make([]byte, 0, rawBufSize+64)} }}

// relay is one stream on the event-loop path: the tap it feeds, the two
// sockets, and what the client's socket did not take yet. Only the
// handler's goroutine touches it.
type relay struct {
	t       *tap
	feed    *loopFeed
	dec     chunked.Decoder
	cfd     int    // a copy of the client's socket (dupSocket)
	pending []byte // framed bytes the client's socket has not taken
	pendBuf []byte // the buffer behind pending, kept for the stream's life
	over    bool   // the tap's Read ended (with end)
	end     error  // io.EOF: the body ended; else why it broke
	caught  *panicked
}

// loopRelay carries resp's body on the event-loop path (modifyResponse):
// the head goes out, the body bytes the head's read took are relayed,
// then each upstream read is relayed as the socket becomes readable. It
// returns nil, having written nothing, when the sockets cannot be had
// (net/http's path takes the answer); errRelayed once the body was
// relayed to its end; and it panics with http.ErrAbortHandler when the
// body or the client broke, so that net/http cuts the connection as it
// does when ReverseProxy's copy fails. A panic in the tap is raised
// again here.
//
// Design note: the head is written here, before ReverseProxy's copy
// starts, because that copy flushes from a timer goroutine of its own
// (an SSE answer's flush interval is -1): a flush of ours beside it
// raced on net/http's buffer and sent the head twice.
func (p *Proxy) loopRelay(st *reqState, resp *http.Response, up *directBody) error {
	crc, err := st.client.SyscallConn()
	if err != nil {
		return nil
	}
	urc, err := up.conn.SyscallConn()
	if err != nil {
		return nil
	}
	cfd, err := dupSocket(crc)
	if err != nil {
		return nil
	}
	defer syscall.Close(cfd)
	t := st.tap
	feed := &loopFeed{up: up}
	t.body, t.looped = feed, true
	r := &relay{t: t, feed: feed, cfd: cfd}
	h := st.w.Header()
	for k, vv := range resp.Header {
		for _, v := range vv {
			h.Add(k, v)
		}
	}
	st.w.WriteHeader(resp.StatusCode)
	if p.loops.carried.Add(1) == 1 { // once: the operator sees the flag take effect
		p.log.Info("event loop: relaying streamed answers")
	}
	if err := http.NewResponseController(st.w).Flush(); err != nil {
		up.Close()
		panic(http.ErrAbortHandler)
	}
	// The request's context ends a wait for the client's socket (the
	// upstream's: directBody's own hold on the connection).
	unwatch := context.AfterFunc(st.ctx, func() { st.client.SetWriteDeadline(longAgo) })
	held, _ := up.br.Peek(up.br.Buffered()) // body bytes the head's read took
	err = r.run(crc, urc, held)
	if !unwatch() && err == nil {
		// The context ended as the stream did: the client's socket takes
		// net/http's last chunk without the deadline set for the wait.
		st.client.SetWriteDeadline(time.Time{})
	}
	if err != nil && r.caught == nil && !r.over {
		if st.ctx.Err() != nil {
			err = nil
			r.feed.b, r.feed.err = nil, context.Cause(st.ctx)
		}
		r.settle()
	}
	switch {
	case r.caught != nil:
		up.Close()
		panic(r.caught)
	case err == nil && r.over:
		err = r.end
	}
	if err == io.EOF {
		up.Keep() // the answer ended where its framing did: the connection may serve the next
	} else {
		up.Close()
	}
	if err != io.EOF {
		panic(http.ErrAbortHandler)
	}
	return errRelayed
}

// run relays the stream until its body ends or breaks (r.over), the
// client's socket fails (errClientWrite), or a wait for either socket
// fails (the request's context ended: the wait's error). The first
// bytes are held, read with the head.
func (r *relay) run(crc, urc syscall.RawConn, held []byte) error {
	var werr error
	write := func(uintptr) bool { // the client's socket has room: pending goes out
		n, err := rawIO(syscall.SYS_WRITE, r.cfd, r.pending)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			return false
		case err != nil:
			werr = errClientWrite
			return true
		}
		r.pending = r.pending[n:]
		return len(r.pending) == 0
	}
	var full bool
	read := func(fd uintptr) bool { // the upstream's socket is readable
		for {
			b := loopBufPool.Get().(*loopBufs)
			n, err := rawIO(syscall.SYS_READ, int(fd), b.raw[:])
			switch {
			case err == syscall.EAGAIN || err == syscall.EINTR:
				loopBufPool.Put(b)
				return false
			case err != nil:
				n, err = 0, os.NewSyscallError("read", err)
			case n == 0:
				err = io.ErrUnexpectedEOF // closed before the last chunk
			}
			full, werr = r.step(b, b.raw[:n], err)
			if r.caught != nil || werr != nil || r.over || full {
				return true
			}
			// A read that did not fill the buffer took all the socket
			// held: the poller, edge-triggered, reports the next bytes.
			if n < rawBufSize {
				return false
			}
		}
	}
	full, werr = r.step(loopBufPool.Get().(*loopBufs), held, nil)
	for r.caught == nil && werr == nil && !(r.over && !full) {
		if full {
			if err := crc.Write(write); err != nil {
				return err
			}
			if werr != nil {
				break
			}
			r.pending = nil
			// Written: the tap parses it, and may have more (a step with
			// no new bytes).
			full, werr = r.step(loopBufPool.Get().(*loopBufs), nil, nil)
			continue
		}
		if err := urc.Read(read); err != nil {
			return err
		}
	}
	return werr
}

// dupSocket returns a copy (close-on-exec) of rc's socket, which stays
// valid while the relay writes to it, whatever net/http does with its
// own. The copy shares the socket's non-blocking mode, so write(2) on
// it returns at once.
func dupSocket(rc syscall.RawConn) (int, error) {
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			derr = os.NewSyscallError("fcntl", e)
			return
		}
		fd = int(r)
	}); err != nil {
		return -1, err
	}
	return fd, derr
}

// settle lets the tap note how a stream that did not end broke (the
// feed's error): what its Read returns is not forwarded.
func (r *relay) settle() {
	defer func() {
		if v := recover(); v != nil {
			r.caught = &panicked{v: v, stack: debug.Stack()}
		}
	}()
	b := loopBufPool.Get().(*loopBufs)
	r.drain(b)
	loopBufPool.Put(b)
}

// step relays one upstream read (raw; upErr: the read's failure) with
// b, which it gives back to the pool: raw may be b.raw. The read's body
// bytes go through the tap, and what the tap's Read returns goes to the
// client, framed as chunks, in one write. Once written, b goes back and
// the tap parses what was forwarded (forward first, parse after; the tap
// parses its own copy). full reports that the client's socket took only
// part (the rest is pending, copied out of b); err is errClientWrite
// when writing failed. A panic in the tap is caught into r.caught (b is
// then left to the collector).
func (r *relay) step(b *loopBufs, raw []byte, upErr error) (full bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			r.caught = &panicked{v: v, stack: debug.Stack()}
			full, err = false, nil
		}
	}()
	data, fin, derr := r.dec.Decode(raw)
	r.feed.b = data
	switch {
	case fin:
		r.feed.err = io.EOF
	case derr != nil:
		r.feed.err = derr
	case upErr != nil:
		r.feed.err = upErr
	}
	for {
		full, err = r.send(r.drain(b))
		r.feed.b = nil // drained: nothing points into b
		loopBufPool.Put(b)
		if full || err != nil {
			return full, err
		}
		r.t.afterForward()
		if r.over || !r.t.holdsOut() {
			return false, nil
		}
		// Parsing failed in strip mode: what was held is released.
		b = loopBufPool.Get().(*loopBufs)
	}
}

// send writes wb to the client's socket, and keeps what it did not take
// in pending (full).
func (r *relay) send(wb []byte) (full bool, err error) {
	if len(wb) == 0 {
		return false, nil
	}
	n, werr := rawIO(syscall.SYS_WRITE, r.cfd, wb)
	if werr == syscall.EAGAIN || werr == syscall.EINTR {
		n, werr = 0, nil
	}
	if werr != nil {
		return false, errClientWrite
	}
	if n < len(wb) {
		r.pendBuf = append(r.pendBuf[:0], wb[n:]...)
		r.pending = r.pendBuf
		return true, nil
	}
	return false, nil
}

// drain calls the tap's Read until it has nothing more, and frames what
// it returned.
func (r *relay) drain(b *loopBufs) []byte {
	wb := b.wb[:0]
	for !r.over {
		n, err := r.t.Read(b.out[:])
		wb = chunked.AppendChunk(wb, b.out[:n])
		if err == errAgain {
			break
		}
		if err != nil {
			r.over, r.end = true, err
		}
	}
	b.wb = wb
	return wb
}

// rawIO is read(2) or write(2) on a non-blocking descriptor, which
// returns at once, so without telling the scheduler
// (syscall.RawSyscall): a syscall.Read let the runtime's monitor take
// the loop's processor while the loop ran.
func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
