package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"
)

// The event loop (Options.EventLoop; docs/design.md, "The event loop").
// A streamed answer that the loop may carry is read from its upstream
// socket with read(2) and written to its client's socket with write(2)
// by the handler's goroutine, which waits for either socket on Go's own
// poller (syscall.RawConn) with no goroutine of net/http's between it
// and the sockets. On net/http's path every token event also costs a
// read that finds nothing besides the one that finds the event, and
// net/http's buffers and Transport goroutines. What the tap does with
// each read is the same on both paths: the relay feeds it the read's
// bytes (loopFeed) and forwards what its Read returns; the request
// settles as on net/http's path (loopRelay returns or panics as
// ReverseProxy's copy would end).
//
// What the loop may carry (reqState.direct, offloadable): a streamed
// request (its body read whole) over HTTP/1.1 from a plain TCP client
// connection, to a plain http:// upstream, answered 2xx with a chunked
// SSE or NDJSON body and no trailers. Everything else, and everything on
// a system other than Linux, takes net/http's path.

// LoopStreams is how many streamed answers the event loop relayed
// (Options.EventLoop): 0 without it.
func (p *Proxy) LoopStreams() int64 {
	if p.loops == nil {
		return 0
	}
	return p.loops.streams()
}

// errAgain is a loop feed's "no more bytes yet": the tap's Read returns
// it as it came, and notes nothing.
var errAgain = errors.New("proxy: no more bytes yet")

// errRelayed is modifyResponse's error once a loop relayed the body to
// its end (loopRelay): ReverseProxy copies nothing more, and its error
// handler leaves the request to settle.
var errRelayed = errors.New("proxy: relayed on an event loop")

// errClientWrite: writing to the client failed on the loop. The tap
// notes nothing (net/http's path: ReverseProxy's write failed), so the
// record says cancelled (outcome).
var errClientWrite = errors.New("proxy: writing to the client failed")

// loopFeed is the tap's body while a loop carries the stream: the body
// bytes of the loop's last read, then errAgain, or the body's end.
type loopFeed struct {
	b   []byte
	err error // the body's end: io.EOF, or why it broke
	up  *directBody
}

func (f *loopFeed) Read(p []byte) (int, error) {
	if len(f.b) > 0 {
		n := copy(p, f.b)
		f.b = f.b[n:]
		return n, nil
	}
	if f.err != nil {
		return 0, f.err
	}
	return 0, errAgain
}

// Close closes the upstream connection.
func (f *loopFeed) Close() error { return f.up.Close() }

type connKey struct{}

// ConnContext is an http.Server's ConnContext for a server whose handler
// is a Proxy with Options.EventLoop: it keeps each client connection in
// its requests' context, where the loop finds its socket.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// clientConn is a client connection whose socket the loop may write to.
type clientConn interface {
	syscall.Conn
	SetWriteDeadline(time.Time) error
}

// clientSocket returns r's client connection as a socket the loop may
// write to: a plain TCP connection (a wrapper that hands out its socket
// through syscall.Conn counts; TLS does not), or nil.
func clientSocket(r *http.Request) clientConn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	if sc, ok := c.(clientConn); ok && c.LocalAddr().Network() == "tcp" {
		return sc
	}
	return nil
}

// directable reports whether the loop may carry r's answer, should it
// stream (reqState.direct): the body read whole and asking for a stream,
// HTTP/1.1 from a TCP client whose socket the loop can reach, not a
// protocol switch, to an http:// upstream.
func (p *Proxy) directable(st *reqState, r *http.Request, switching bool) bool {
	return p.loops != nil && p.loops.supported() && st.info.Whole && st.info.Stream && !switching &&
		r.ProtoMajor == 1 && r.ProtoMinor >= 1 && p.opts.Upstream.Scheme == "http" && st.client != nil
}

// offloadable reports whether the loop takes resp's body (body, before
// the tap wrapped it): a direct connection's 2xx answer with a body,
// chunked, streamed, no trailers announced.
func offloadable(resp *http.Response, body io.Reader, kind bodyKind) (*directBody, bool) {
	db, ok := body.(*directBody)
	ok = ok && kind.streamed() && resp.StatusCode >= 200 && resp.StatusCode < 300 &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusResetContent &&
		len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked" && len(resp.Trailer) == 0 &&
		resp.Request.Method != http.MethodHead
	return db, ok
}
