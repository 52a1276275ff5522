package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"sync"
	"time"
)

// directTransport is the proxy's transport with Options.EventLoop: a
// request the event loop may carry (reqState.direct) goes to the
// upstream over a connection the transport owns, taken from its idle
// ones or dialled, so that its answer's body can be read with read(2)
// (evloop_linux.go) rather than by net/http; every other request goes
// to next. A connection whose answer the loop relayed to a clean end
// goes back to the idle ones (idleConns).
//
// Design note: net/http's Transport owns its connections and reads an
// answer's first body bytes into its own buffer with the head, where
// nothing outside it can reach them; a loop needs the socket and every
// byte after the head.
type directTransport struct {
	next   http.RoundTripper
	dialer net.Dialer
	idle   idleConns
}

// directBufSize is the size of a direct connection's read and write
// buffers: the request is written once, and the head read once.
const directBufSize = 4 << 10

// longAgo is a deadline in the past: it ends a connection's pending I/O.
var longAgo = time.Unix(1, 0)

func (d *directTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, _ := req.Context().Value(stateKey{}).(*reqState)
	if st == nil || !st.direct || req.URL.Scheme != "http" {
		return d.next.RoundTrip(req)
	}
	return d.roundTrip(req)
}

// roundTrip sends req over a new connection and reads its answer's head,
// reading past interim (1xx) answers as net/http does. It tells req's
// httptrace hooks what net/http's Transport would: GetConn, the dial's
// own (DNS, connect: net.Dialer calls them), GotConn, WroteRequest and
// GotFirstResponseByte. The request's context ends the exchange, and
// then the body's reads (directBody).
func (d *directTransport) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	trace := httptrace.ContextClientTrace(ctx)
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(addr)
	}
	c, idled := d.idle.get(addr)
	if c == nil {
		nc, err := d.dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c = nc.(*net.TCPConn)
	}
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: c, Reused: idled >= 0, WasIdle: idled >= 0, IdleTime: max(idled, 0)})
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(longAgo) })
	resp, br, err := exchange(c, req, trace)
	if !stop() && err == nil { // the context ended as the head arrived
		err = context.Cause(ctx)
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	body := &directBody{body: resp.Body, conn: c, br: br, addr: addr, pool: &d.idle, keep: !resp.Close && !req.Close}
	body.stop = context.AfterFunc(ctx, func() { c.SetReadDeadline(longAgo) })
	resp.Body = body
	return resp, nil
}

// maxHeadBytes bounds an answer's head, interim ones included, as
// net/http's Transport bounds it by default (MaxResponseHeaderBytes).
const maxHeadBytes = 10 << 20

// max1xx bounds the interim answers read before the final one, as
// net/http's Transport does.
const max1xx = 5

// exchange writes req to c and reads the answer's head, handing each
// interim (1xx) answer to the trace's Got1xxResponse (ReverseProxy's
// forwards it to the client), as net/http's Transport does.
func exchange(c net.Conn, req *http.Request, trace *httptrace.ClientTrace) (*http.Response, *bufio.Reader, error) {
	bw := bufio.NewWriterSize(c, directBufSize)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
	if err != nil {
		return nil, nil, err
	}
	head := &io.LimitedReader{R: c, N: maxHeadBytes}
	br := bufio.NewReaderSize(head, directBufSize)
	if _, err := br.Peek(1); err != nil {
		return nil, nil, err
	}
	if trace != nil && trace.GotFirstResponseByte != nil {
		trace.GotFirstResponseByte()
	}
	for n := 0; ; n++ {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			if head.N <= 0 {
				err = errors.New("proxy: the upstream's answer head is over 10 MiB")
			}
			return nil, nil, err
		}
		code := resp.StatusCode
		if code < 100 || code >= 200 || code == http.StatusSwitchingProtocols {
			head.N = math.MaxInt64 // the body: unbounded, as a stream is
			return resp, br, nil
		}
		if n == max1xx {
			return nil, nil, errors.New("proxy: too many interim (1xx) answers from the upstream")
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, nil, err
			}
		}
	}
}

// directBody is the body of an answer read over a direct connection:
// net/http's reader of it over the connection's buffer (chunked, by
// length, or to the close), until an event loop takes the connection
// (offload). Close closes the connection; Keep gives it back to the
// idle ones.
type directBody struct {
	body interface {
		Read([]byte) (int, error)
		Close() error
	}
	conn *net.TCPConn
	br   *bufio.Reader
	stop func() bool // the context's hold on the connection's reads
	once sync.Once
	addr string
	pool *idleConns
	keep bool // neither side asked to close the connection after the answer
}

func (b *directBody) Read(p []byte) (int, error) { return b.body.Read(p) }

func (b *directBody) Close() error {
	b.once.Do(func() {
		b.stop()
		b.conn.Close()
	})
	return nil
}

// Keep gives the connection back to the idle ones, once its answer was
// read to its end and no byte after it, unless either side asked to
// close it or the request's context ended meanwhile (its read deadline
// is set: the connection is closed).
func (b *directBody) Keep() {
	b.once.Do(func() {
		if !b.stop() || !b.keep {
			b.conn.Close()
			return
		}
		b.pool.put(b.addr, b.conn)
	})
}

// idleConns are the direct connections kept alive between answers, by
// upstream address, the most recently used taken first, each closed
// after idleTimeout unused. At most maxIdle are kept per address. Its
// zero value is ready.
//
// Design note: net/http's Transport reads every idle connection from a
// goroutine of its own, and drops one when its engine closes it (an
// engine's keep-alive timeout: uvicorn's is 5 s). Here a connection is
// checked when it is taken instead: a socket the engine closed, or one
// with bytes no request asked for, is readable, and is closed rather
// than used. One closed by the engine in the microseconds between the
// check and the request's arrival fails that request, as it would on
// net/http's Transport (which retries no POST either); until it is
// taken or its timer fires, it waits closed on the engine's side.
type idleConns struct {
	mu     sync.Mutex
	byAddr map[string][]*idleConn
}

type idleConn struct {
	c     *net.TCPConn
	since time.Time
	timer *time.Timer
}

// maxIdle and idleTimeout are NewTransport's MaxIdleConnsPerHost and
// IdleConnTimeout.
const (
	maxIdle     = 1024
	idleTimeout = 90 * time.Second
)

// get takes the most recently kept connection to addr that is still
// open, with how long it was idle; nil and -1 when there is none.
func (p *idleConns) get(addr string) (*net.TCPConn, time.Duration) {
	for {
		p.mu.Lock()
		s := p.byAddr[addr]
		if len(s) == 0 {
			p.mu.Unlock()
			return nil, -1
		}
		ic := s[len(s)-1]
		s[len(s)-1] = nil
		p.byAddr[addr] = s[:len(s)-1]
		p.mu.Unlock()
		ic.timer.Stop() // a timer that fired meanwhile finds it taken
		if quiet(ic.c) {
			return ic.c, time.Since(ic.since)
		}
		ic.c.Close()
	}
}

// put keeps c, or closes it when addr has maxIdle already.
func (p *idleConns) put(addr string, c *net.TCPConn) {
	c.SetDeadline(time.Time{})
	ic := &idleConn{c: c, since: time.Now()}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byAddr == nil {
		p.byAddr = map[string][]*idleConn{}
	}
	if len(p.byAddr[addr]) >= maxIdle {
		c.Close()
		return
	}
	p.byAddr[addr] = append(p.byAddr[addr], ic)
	ic.timer = time.AfterFunc(idleTimeout, func() { p.expire(addr, ic) })
}

// expire closes ic, unless it was taken.
func (p *idleConns) expire(addr string, ic *idleConn) {
	p.mu.Lock()
	s := p.byAddr[addr]
	i := slices.Index(s, ic)
	if i >= 0 {
		p.byAddr[addr] = slices.Delete(s, i, i+1)
	}
	p.mu.Unlock()
	if i >= 0 {
		ic.c.Close()
	}
}
