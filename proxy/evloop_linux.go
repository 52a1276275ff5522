//go:build linux

package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/tokentap/tokentap/internal/chunked"
)

// evloops is a proxy's event loops, started with the first stream they
// carry, one per GOMAXPROCS. Its zero value is ready; loops that never
// start cost nothing.
type evloops struct {
	once sync.Once
	ls   []*evloop
	err  error
	next atomic.Uint32
	// carried counts the answers whose body a loop relayed (loopRelay
	// wrote their head).
	carried atomic.Int64
}

func (*evloops) supported() bool { return true }

// pick returns the next loop, round robin.
func (e *evloops) pick() (*evloop, error) {
	e.once.Do(func() {
		for range runtime.GOMAXPROCS(0) {
			l, err := newEvloop()
			if err != nil {
				e.err = err
				return
			}
			e.ls = append(e.ls, l)
			go l.run()
		}
	})
	if len(e.ls) == 0 {
		return nil, e.err
	}
	return e.ls[e.next.Add(1)%uint32(len(e.ls))], nil
}

// rawBufSize is the size of a loop's read buffer, and of the buffer the
// tap's Read fills from it: a read's body bytes always fit in one Read.
const rawBufSize = 16 << 10

// loopBufs are the buffers one relay step uses: a loop's own, or a
// pooled set on the handler's goroutine (offRead).
type loopBufs struct {
	raw [rawBufSize]byte // what read(2) returned
	out [rawBufSize]byte // what the tap's Read returned
	wb  []byte           // out, framed as chunks, for one write(2)
}

var loopBufPool = sync.Pool{New: func() any { return &loopBufs{wb: make([]byte, 0, rawBufSize+64)} }}

// evloop is one epoll instance and the streams on it. Only its run
// goroutine touches streams and bufs.
type evloop struct {
	ep   int // the epoll instance
	wake int // an eventfd it watches: abort's, to wake it
	mu   sync.Mutex
	adds []*relay // handed over, not yet in streams
	// aborts are the streams whose request's context ended, with why.
	aborts  []abortion
	failed  error            // the loop stopped (run): it takes nothing more
	streams map[int32]*relay // by both its sockets
	bufs    loopBufs
}

type abortion struct {
	r     *relay
	cause error
}

func newEvloop() (*evloop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	l := &evloop{ep: ep, wake: -1, streams: map[int32]*relay{}, bufs: loopBufs{wb: make([]byte, 0, rawBufSize+64)}}
	wake, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		err = os.NewSyscallError("eventfd2", e)
	} else {
		l.wake = int(wake)
		err = l.watch(l.wake, syscall.EPOLL_CTL_ADD, syscall.EPOLLIN)
	}
	if err == nil {
		err = syscall.SetNonblock(ep, true)
	}
	if err != nil {
		syscall.Close(ep)
		if l.wake >= 0 {
			syscall.Close(l.wake)
		}
		return nil, err
	}
	return l, nil
}

// watch changes what the loop watches fd for (op: EPOLL_CTL_*).
func (l *evloop) watch(fd, op int, events uint32) error {
	if err := syscall.EpollCtl(l.ep, op, fd, &syscall.EpollEvent{Events: events, Fd: int32(fd)}); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// relay is one stream on a loop: the tap it feeds, the two sockets
// (copies of the connections' own: closing them closes nothing of
// net/http's), and what the client's socket did not take yet. The
// handler's goroutine sets it up and waits on done; from add to done
// only the loop touches it.
type relay struct {
	t       *tap
	feed    *loopFeed
	dec     chunked.Decoder
	loop    *evloop
	ufd     int
	cfd     int
	pending []byte // framed bytes the client's socket has not taken
	pendBuf []byte // the buffer behind pending, kept for the stream's life
	// waiting: the loop watches the client's socket for room (pending),
	// and not the upstream's.
	waiting  bool
	over     bool  // the tap's Read ended (with end)
	end      error // io.EOF: the body ended; else why it broke
	finished bool  // done is closed
	result   error // what offRead returns
	caught   *panicked
	done     chan struct{}
	unwatch  func() bool // stops the request context's abort
	// added: add gave it to the loop; early: the context ended before
	// (both under the loop's mu).
	added bool
	early error
}

// loopRelay carries resp's body on a loop (modifyResponse): the head goes
// out, the body bytes the head's read took are relayed here, then the
// loop carries the stream while this goroutine waits. It returns nil,
// having written nothing, when the sockets or a loop cannot be had
// (net/http's path takes the answer); errRelayed once the body was
// relayed to its end; and it panics with http.ErrAbortHandler when the
// body or the client broke, so that net/http cuts the connection as it
// does when ReverseProxy's copy fails. A panic on the loop is raised
// here.
//
// Design note: the head is written here, before ReverseProxy's copy
// starts, because that copy flushes from a timer goroutine of its own
// (an SSE answer's flush interval is -1): a flush of ours beside it
// raced on net/http's buffer and sent the head twice.
func (p *Proxy) loopRelay(st *reqState, resp *http.Response, up *directBody) error {
	l, err := p.loops.pick()
	if err != nil {
		return nil
	}
	cfd, err := dupSocket(st.client)
	if err != nil {
		return nil
	}
	ufd, err := dupSocket(up.conn)
	if err != nil {
		syscall.Close(cfd)
		return nil
	}
	t := st.tap
	feed := &loopFeed{up: up}
	t.body, t.looped = feed, true
	r := &relay{t: t, feed: feed, loop: l, ufd: ufd, cfd: cfd, done: make(chan struct{})}
	h := st.w.Header()
	for k, vv := range resp.Header {
		for _, v := range vv {
			h.Add(k, v)
		}
	}
	st.w.WriteHeader(resp.StatusCode)
	if p.loops.carried.Add(1) == 1 { // once: the operator sees the flag take effect
		p.log.Info("event loop: relaying streamed answers", "loops", len(p.loops.ls))
	}
	if err := http.NewResponseController(st.w).Flush(); err != nil {
		r.close()
		panic(http.ErrAbortHandler)
	}
	held, _ := up.br.Peek(up.br.Buffered()) // body bytes the head's read took
	up.Close()                              // the loop has its copy of the socket
	b := loopBufPool.Get().(*loopBufs)
	full, err := r.step(held, nil, b)
	loopBufPool.Put(b)
	if r.caught == nil && err == nil && !(r.over && !full) {
		r.unwatch = context.AfterFunc(st.ctx, func() { l.abort(r, context.Cause(st.ctx)) })
		if err = l.add(r, full); err != nil { // the context ended, or the loop failed
			r.unwatch()
			t.noteErr(err, t.now())
		} else {
			<-r.done
			err = r.result
		}
	}
	if !r.finished {
		r.close()
	}
	switch {
	case r.caught != nil:
		panic(r.caught)
	case err == nil && r.over:
		err = r.end
	}
	if err != io.EOF {
		panic(http.ErrAbortHandler)
	}
	return errRelayed
}

// dupSocket returns a copy (dup(2), close-on-exec) of c's socket. The
// copy shares the socket's non-blocking mode, so read(2) and write(2) on
// it return at once.
func dupSocket(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
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

// step relays one upstream read (raw; upErr: the read's failure): its
// body bytes go through the tap, and what the tap's Read returns goes to
// the client, framed as chunks, in one write. Once written, the tap
// parses what was forwarded (forward first, parse after). full reports
// that the client's socket took only part (the rest is pending); err is
// errClientWrite when writing failed. A panic in the tap is caught into
// r.caught.
func (r *relay) step(raw []byte, upErr error, b *loopBufs) (full bool, err error) {
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
		wb := r.drain(b)
		if len(wb) > 0 {
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
		}
		r.t.afterForward()
		if r.over || !r.t.holdsOut() {
			return false, nil
		}
		// Parsing failed in strip mode: what was held is released.
	}
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

// close closes the stream's sockets.
func (r *relay) close() {
	syscall.Close(r.ufd)
	syscall.Close(r.cfd)
}

// add hands r to the loop. Its upstream socket is watched for reads, or,
// when the client's socket is full (full), the client's for room.
func (l *evloop) add(r *relay, full bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case r.early != nil:
		return r.early
	case l.failed != nil:
		return l.failed
	}
	fd, events := r.ufd, uint32(syscall.EPOLLIN)
	if full {
		r.waiting = true
		fd, events = r.cfd, syscall.EPOLLOUT
	}
	if err := l.watch(fd, syscall.EPOLL_CTL_ADD, events); err != nil {
		return err
	}
	l.adds = append(l.adds, r)
	r.added = true
	return nil
}

// abort ends r for its request's context (the client went away, the
// deadline, the sidecar's shutdown), on the loop: the tap notes cause as
// the body's failure, as net/http's reader of it would return it.
func (l *evloop) abort(r *relay, cause error) {
	l.mu.Lock()
	if !r.added { // before add: add refuses it
		r.early = cause
		l.mu.Unlock()
		return
	}
	l.aborts = append(l.aborts, abortion{r, cause})
	l.mu.Unlock()
	one := uint64(1)
	rawIO(syscall.SYS_WRITE, l.wake, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// run relays the loop's streams for the process's life.
//
// Design note: the loop waits in Go's own poller, on the epoll instance
// itself (readable when a socket it watches is), and asks it with a
// timeout of 0. It asks again before it waits only when there may be
// more than it was told: a full list of events, or a read that filled
// its buffer (the socket may hold more, and a level-triggered socket
// that stays ready makes no new edge for Go's poller, which watches the
// instance edge-triggered). Anything that becomes ready meanwhile does
// make one: one epoll_wait(2) per wake, not two. A goroutine blocked in epoll_wait(2) instead kept the
// runtime's monitor waking every 20 µs and its processor handed between
// threads: more CPU than the read it saved (docs/performance.md, "The
// event-loop path, measured").
func (l *evloop) run() {
	f := os.NewFile(uintptr(l.ep), "epoll")
	rc, err := f.SyscallConn()
	if err == nil {
		evs := make([]syscall.EpollEvent, 256)
		err = rc.Read(func(fd uintptr) bool {
			for {
				n, werr := syscall.EpollWait(int(fd), evs, 0)
				switch {
				case werr == syscall.EINTR:
					continue
				case werr != nil:
					err = os.NewSyscallError("epoll_wait", werr)
					return true
				case n == 0:
					return false // wait in Go's poller
				}
				l.take()
				more := n == len(evs)
				for _, ev := range evs[:n] {
					if int(ev.Fd) == l.wake {
						l.woken()
					} else if r := l.streams[ev.Fd]; r != nil && l.handle(r, int(ev.Fd) == r.cfd) {
						more = true
					}
				}
				if !more {
					return false
				}
			}
		})
	}
	// Not reached while the process runs: the epoll instance does not
	// fail. Were it to, its streams end as broken, and it takes no more.
	l.mu.Lock()
	l.failed = fmt.Errorf("proxy: event loop stopped: %w", err)
	l.mu.Unlock()
	l.take()
	for _, r := range l.streams {
		if !r.finished {
			r.feed.err = l.failed
			l.finish(r, nil)
		}
	}
}

// take moves the streams handed over into streams.
func (l *evloop) take() {
	l.mu.Lock()
	for _, r := range l.adds {
		l.streams[int32(r.ufd)] = r
		l.streams[int32(r.cfd)] = r
	}
	clear(l.adds)
	l.adds = l.adds[:0]
	l.mu.Unlock()
}

// woken ends the streams aborted since the last wake.
func (l *evloop) woken() {
	var n [8]byte
	rawIO(syscall.SYS_READ, l.wake, n[:])
	l.mu.Lock()
	aborts := l.aborts
	l.aborts = nil
	l.mu.Unlock()
	for _, a := range aborts {
		if !a.r.finished {
			a.r.feed.b, a.r.feed.err = nil, a.cause
			l.finish(a.r, nil)
		}
	}
}

// handle serves one ready socket of r's: the client's (client) with
// room for what is pending, else the upstream's. It reports whether the
// upstream's may hold more than it read (its read filled the buffer).
func (l *evloop) handle(r *relay, client bool) (more bool) {
	if client {
		if !r.waiting {
			return
		}
		n, err := rawIO(syscall.SYS_WRITE, r.cfd, r.pending)
		if err == syscall.EAGAIN || err == syscall.EINTR {
			return
		}
		if err != nil {
			l.finish(r, errClientWrite)
			return
		}
		if r.pending = r.pending[n:]; len(r.pending) > 0 {
			return
		}
		r.pending = nil
		// Written: the tap parses it, and may have more (a step with
		// no new bytes).
		full, err := r.step(nil, nil, &l.bufs)
		switch {
		case r.caught != nil || err != nil || (r.over && !full):
			l.finish(r, err)
		case !full:
			l.setWaiting(r, false)
		}
		return
	}
	n, err := rawIO(syscall.SYS_READ, r.ufd, l.bufs.raw[:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return
	case err != nil:
		n, err = 0, os.NewSyscallError("read", err)
	case n == 0:
		err = io.ErrUnexpectedEOF // closed before the last chunk
	}
	more = n == len(l.bufs.raw)
	full, werr := r.step(l.bufs.raw[:n], err, &l.bufs)
	switch {
	case r.caught != nil || werr != nil || (r.over && !full):
		l.finish(r, werr)
	case full: // watch the client's socket for room, not the upstream's
		l.setWaiting(r, true)
	}
	return more
}

// setWaiting moves what the loop watches of r: the client's socket for
// room (waiting), or the upstream's for reads. A failure ends r.
func (l *evloop) setWaiting(r *relay, waiting bool) {
	r.waiting = waiting
	from, to, events := r.cfd, r.ufd, uint32(syscall.EPOLLIN)
	if waiting {
		from, to, events = r.ufd, r.cfd, syscall.EPOLLOUT
	}
	err := l.watch(from, syscall.EPOLL_CTL_DEL, 0)
	if err == nil {
		err = l.watch(to, syscall.EPOLL_CTL_ADD, events)
	}
	if err != nil {
		r.feed.err = err
		l.finish(r, nil)
	}
}

// finish ends r on the loop: its sockets unwatched and closed, and its
// handler woken with what its Read returns: werr (a failed write to the
// client), else how the tap's Read ended. A stream that had not ended
// (its context, a failure of the loop's) has its tap read the feed's
// error first, so that the tap notes it.
func (l *evloop) finish(r *relay, werr error) {
	if !r.over && r.caught == nil && werr == nil {
		func() {
			defer func() {
				if v := recover(); v != nil {
					r.caught = &panicked{v: v, stack: debug.Stack()}
				}
			}()
			r.drain(&l.bufs) // what it returns is not forwarded
		}()
	}
	if r.waiting {
		l.watch(r.cfd, syscall.EPOLL_CTL_DEL, 0)
	} else {
		l.watch(r.ufd, syscall.EPOLL_CTL_DEL, 0)
	}
	delete(l.streams, int32(r.ufd))
	delete(l.streams, int32(r.cfd))
	if r.unwatch != nil {
		r.unwatch()
	}
	r.close()
	r.finished = true
	r.result = r.end
	if werr != nil {
		r.result = werr
	}
	close(r.done)
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
