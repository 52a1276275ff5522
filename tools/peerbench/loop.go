package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tokentap/tokentap/internal/chunked"
)

// loopCmd is an event-loop relay: the I/O path docs/performance.md names
// as the sidecar's next step, measured here beside the bare ReverseProxy
// in the same run, before anything of the sidecar is moved onto it. It is
// a benchmark's stand-in, not a proxy to deploy: it relays each request
// to one HTTP/1.1 upstream over a new connection, and each answer's head
// as Go reads it. A chunked body (every stream) is relayed verbatim by
// one of GOMAXPROCS loops, each waiting on its streams' upstream sockets
// with epoll (level-triggered): per event one read(2) and one write(2) on
// the loop's own thread, where net/http pays a read that finds nothing, a
// goroutine parked and woken through the runtime's poller, and a write.
// The client's connection goes back to its goroutine when the body's
// last chunk is relayed (keep-alive).
func loopCmd(args []string) error {
	fs := flag.NewFlagSet("loop", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:18002", "listen address")
	to := fs.String("to", "127.0.0.1:18000", "upstream host:port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	loops := make([]*loop, runtime.GOMAXPROCS(0))
	for i := range loops {
		if loops[i], err = newLoop(); err != nil {
			return err
		}
		go func(l *loop) {
			err := l.run()
			fmt.Fprintln(os.Stderr, "peerbench loop:", err)
			os.Exit(1)
		}(loops[i])
	}
	var next atomic.Uint32
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go relayConn(c, *to, loops[next.Add(1)%uint32(len(loops))])
	}
}

// relayConn serves one client connection, request after request.
func relayConn(c net.Conn, to string, l *loop) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		if err := relayOne(c, br, to, l); err != nil {
			return
		}
	}
}

// relayOne relays one request and its answer.
func relayOne(c net.Conn, br *bufio.Reader, to string, l *loop) error {
	req, err := http.ReadRequest(br)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		return err
	}
	up, err := net.DialTimeout("tcp", to, 5*time.Second)
	if err != nil {
		return err
	}
	uw := bufio.NewWriter(up)
	fmt.Fprintf(uw, "%s %s HTTP/1.1\r\nHost: %s\r\n", req.Method, req.RequestURI, to)
	req.Header.Del("Connection")
	req.Header.Write(uw)
	fmt.Fprintf(uw, "Content-Length: %d\r\n\r\n", len(body))
	uw.Write(body)
	if err := uw.Flush(); err != nil {
		up.Close()
		return err
	}
	ubr := bufio.NewReader(up)
	resp, err := http.ReadResponse(ubr, req)
	if err != nil {
		up.Close()
		return err
	}
	cw := bufio.NewWriter(c)
	fmt.Fprintf(cw, "HTTP/1.1 %s\r\n", resp.Status)
	resp.Header.Write(cw)
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		// Not a stream: relayed through Go, and the connection closed.
		fmt.Fprintf(cw, "Connection: close\r\nContent-Length: %d\r\n\r\n", resp.ContentLength)
		_, err := io.Copy(cw, resp.Body)
		up.Close()
		if err == nil {
			err = cw.Flush()
		}
		if err == nil {
			err = errors.New("closed after a body that is not chunked")
		}
		return err
	}
	cw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	s := &relay{done: make(chan error, 1)}
	held, _ := ubr.Peek(ubr.Buffered()) // body bytes the head's read took
	cw.Write(held)
	if err := cw.Flush(); err != nil {
		up.Close()
		return err
	}
	if _, done, err := s.chunks.Decode(held); done || err != nil { // written: it decodes in place
		up.Close()
		return err
	}
	// The upstream socket leaves Go's poller (a dup, and the original
	// closed) so that its events wake only the loop; the client's stays
	// (its goroutine reads the next request from it), but it signals
	// nothing while the loop writes to it.
	if s.ufd, err = dupFD(up); err != nil {
		up.Close()
		return err
	}
	up.Close()
	if s.cfd, err = fdOf(c); err != nil {
		syscall.Close(s.ufd)
		return err
	}
	l.add(s)
	return <-s.done
}

// dupFD returns a duplicate of c's socket.
func dupFD(c net.Conn) (int, error) {
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := sc.Control(func(f uintptr) { fd, derr = syscall.Dup(int(f)) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// fdOf returns c's socket (non-blocking, as Go keeps it).
func fdOf(c net.Conn) (int, error) {
	sc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	err = sc.Control(func(f uintptr) { fd = int(f) })
	return fd, err
}

// relay is one stream's body on a loop.
type relay struct {
	ufd, cfd int
	chunks   chunked.Decoder
	pending  []byte // read, not yet written to the client (it was full)
	ended    bool   // the last chunk is in pending
	done     chan error
}

// loop is one epoll instance and the streams on it; run owns streams.
type loop struct {
	ep      int
	adds    chan *relay
	streams map[int32]*relay // by upstream socket, and by client socket while one waits to write
}

func newLoop() (*loop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &loop{ep: ep, adds: make(chan *relay, 8192), streams: map[int32]*relay{}}, nil
}

// add hands s to the loop: queued before its socket is watched, so that
// the loop knows it when the socket first wakes it.
func (l *loop) add(s *relay) {
	l.adds <- s
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(s.ufd)}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, s.ufd, &ev); err != nil {
		// The loop keeps its entry, never woken for it, until a later
		// stream's socket takes the same number and replaces it.
		syscall.Close(s.ufd)
		s.done <- err
	}
}

// run relays the loop's streams until its epoll instance fails.
//
// Design note: the loop waits in Go's own poller, on the epoll instance
// itself (readable when a socket it watches is), and asks it with a
// timeout of 0. A goroutine blocked in epoll_wait(2) instead kept the
// runtime's monitor waking every 20 µs and its processor handed between
// threads: more CPU than the read it saved.
func (l *loop) run() error {
	if err := syscall.SetNonblock(l.ep, true); err != nil {
		return err
	}
	f := os.NewFile(uintptr(l.ep), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	evs := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 32<<10)
	var werr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.EpollWait(int(fd), evs, 0)
			switch {
			case err == syscall.EINTR:
				continue
			case err != nil:
				werr = err
				return true
			case n == 0:
				return false // wait in Go's poller
			}
		drain:
			for {
				select {
				case s := <-l.adds:
					l.streams[int32(s.ufd)] = s
				default:
					break drain
				}
			}
			for _, ev := range evs[:n] {
				s := l.streams[ev.Fd]
				if s == nil {
					continue
				}
				if int(ev.Fd) == s.cfd {
					l.flush(s)
					continue
				}
				l.read(s, buf)
			}
		}
	})
	if err == nil {
		err = werr
	}
	return err
}

// read relays what the upstream socket holds.
func (l *loop) read(s *relay, buf []byte) {
	nr, err := rawIO(syscall.SYS_READ, s.ufd, buf)
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return
	case err != nil:
		l.end(s, err)
		return
	case nr == 0:
		l.end(s, io.ErrUnexpectedEOF)
		return
	}
	p := buf[:nr]
	nw, werr := rawIO(syscall.SYS_WRITE, s.cfd, p)
	if werr == syscall.EAGAIN || werr == syscall.EINTR {
		nw, werr = 0, nil
	}
	if werr == nil && nw < nr {
		s.pending = append(s.pending[:0], p[nw:]...)
	}
	_, done, serr := s.chunks.Decode(p) // after the write: it decodes in place
	switch {
	case serr != nil:
		l.end(s, serr)
	case werr != nil:
		l.end(s, werr)
	case nw < nr: // the client's socket is full: hold the rest, stop reading until it drains
		s.ended = done
		l.streams[int32(s.cfd)] = s
		ev := syscall.EpollEvent{Events: 0, Fd: int32(s.ufd)}
		syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, s.ufd, &ev)
		ev = syscall.EpollEvent{Events: syscall.EPOLLOUT, Fd: int32(s.cfd)}
		if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, s.cfd, &ev); err != nil {
			l.end(s, err)
		}
	case done:
		l.end(s, nil)
	}
}

// flush writes what s holds to its client, once its socket has room.
func (l *loop) flush(s *relay) {
	nw, err := rawIO(syscall.SYS_WRITE, s.cfd, s.pending)
	if err == syscall.EAGAIN || err == syscall.EINTR {
		return
	}
	if err != nil {
		l.end(s, err)
		return
	}
	s.pending = s.pending[nw:]
	if len(s.pending) > 0 {
		return
	}
	syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, s.cfd, nil)
	delete(l.streams, int32(s.cfd))
	if s.ended {
		l.end(s, nil)
		return
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(s.ufd)}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, s.ufd, &ev); err != nil {
		l.end(s, err)
	}
}

// end stops relaying s: its upstream socket is closed and its client's
// connection goes back to its goroutine (err nil: for the next request).
func (l *loop) end(s *relay, err error) {
	if _, waiting := l.streams[int32(s.cfd)]; waiting {
		syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, s.cfd, nil)
		delete(l.streams, int32(s.cfd))
	}
	syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, s.ufd, nil)
	delete(l.streams, int32(s.ufd))
	syscall.Close(s.ufd)
	s.done <- err
}

// rawIO is read(2) or write(2) on a non-blocking socket, which returns at
// once, so without telling the scheduler (syscall.RawSyscall): a
// syscall.Read let the runtime's monitor take the loop's processor
// while the loop ran.
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
