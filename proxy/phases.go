package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/tokentap/tokentap/record"
)

// phases follows one request on its way to the upstream through
// net/http/httptrace and settles its record.Upstream, the connection
// phases of docs/measurement.md §1, when the request ends.
//
// Design note: the transport calls the hooks on several goroutines:
// GetConn and GotConn on the request's (RoundTrip's), the dial's hooks
// (DNS, connect, TLS) on a dial goroutine that net/http detaches from the
// request, so that a dial may go on after the request was handed another
// connection, or has ended, to serve a later request; WroteRequest on the
// connection's writer and GotFirstResponseByte on its reader. So each
// hook holds mu for a few instructions (a lock of this request's, taken
// a handful of times per request and never per token), and what a dial
// reports after the request had its connection (GotConn), or after the
// record was settled, is not this request's and is dropped. A request
// the transport tries again (a kept-alive connection that turned out to
// be closed) asks for a connection again (GetConn): the phases start
// over, and the record has those of the connection that carried it.
type phases struct {
	trace httptrace.ClientTrace
	clock record.Clock

	mu sync.Mutex
	// got: GotConn came for the current attempt; settled: the record
	// took the phases (settle); nothing changes after either.
	got, settled bool
	// connected and handshook: a connect (a TLS handshake) succeeded; a
	// failure reported after it is another connection's (a dial racing
	// the address families) and does not replace it.
	connected, handshook bool
	// The instants each phase began at (zero until it did); wrote is
	// when the request was written whole, firstByte the response's first
	// byte.
	getConn, dnsStart, connStart, tlsStart, wrote, firstByte time.Time
	up                                                       record.Upstream
	// conn is the connection GotConn gave, kept only when keepConn is
	// set (a request that asks to switch protocols: its half-close, in
	// upgrade.go); it is read on the request's goroutine, which GotConn
	// runs on.
	keepConn bool
	conn     net.Conn
	// wroteTo, if set, is told when the request was written whole (the
	// slow causes' registry: pipeline.Request.Sent), once per attempt.
	wroteTo func(time.Time)
}

// install sets the hooks and returns ctx with the trace. The hooks are
// bound once per request, never per token.
func (ph *phases) install(ctx context.Context, clock record.Clock, keepConn bool) context.Context {
	ph.clock, ph.keepConn = clock, keepConn
	ph.trace = httptrace.ClientTrace{
		GetConn:              ph.getConnHook,
		GotConn:              ph.gotConnHook,
		DNSStart:             ph.dnsStartHook,
		DNSDone:              ph.dnsDoneHook,
		ConnectStart:         ph.connectStartHook,
		ConnectDone:          ph.connectDoneHook,
		TLSHandshakeStart:    ph.tlsStartHook,
		TLSHandshakeDone:     ph.tlsDoneHook,
		WroteRequest:         ph.wroteRequestHook,
		GotFirstResponseByte: ph.firstByteHook,
	}
	return httptrace.WithClientTrace(ctx, &ph.trace)
}

// open reports whether a dial's report still belongs to the request;
// ph.mu must be held.
func (ph *phases) open() bool { return !ph.got && !ph.settled }

func (ph *phases) getConnHook(string) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.settled {
		return
	}
	// A first attempt, or the transport trying again: start over.
	ph.got, ph.connected, ph.handshook = false, false, false
	ph.getConn, ph.dnsStart, ph.connStart, ph.tlsStart = now, time.Time{}, time.Time{}, time.Time{}
	ph.wrote, ph.firstByte = time.Time{}, time.Time{}
	ph.up = record.Upstream{Asked: true}
}

func (ph *phases) gotConnHook(i httptrace.GotConnInfo) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.keepConn {
		ph.conn = i.Conn
	}
	if !ph.open() {
		return
	}
	ph.got = true
	ph.up.Reused = i.Reused
	if !ph.getConn.IsZero() {
		ph.up.Set(record.UpConnWait, now.Sub(ph.getConn))
	}
	if i.Reused {
		// A dial this request started served it not: its phases are
		// another connection's.
		ph.up.Known &^= record.UpDNS | record.UpConnect | record.UpTLS
	}
}

func (ph *phases) dnsStartHook(httptrace.DNSStartInfo) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && ph.dnsStart.IsZero() {
		ph.dnsStart = now
	}
}

// dnsDoneHook ends the lookup; a lookup reported inside another (a
// resolver that reports its own, under egress's) ends first, and the
// outer one's end replaces it.
func (ph *phases) dnsDoneHook(httptrace.DNSDoneInfo) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && !ph.dnsStart.IsZero() {
		ph.up.Set(record.UpDNS, now.Sub(ph.dnsStart))
	}
}

func (ph *phases) connectStartHook(network, addr string) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && ph.connStart.IsZero() {
		ph.connStart = now
	}
}

// connectDoneHook ends the connect: from the first address tried to the
// one that answered (or to the last failure, when none did).
func (ph *phases) connectDoneHook(network, addr string, err error) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && !ph.connStart.IsZero() && !ph.connected {
		ph.up.Set(record.UpConnect, now.Sub(ph.connStart))
		ph.connected = err == nil
	}
}

func (ph *phases) tlsStartHook() {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && ph.tlsStart.IsZero() {
		ph.tlsStart = now
	}
}

func (ph *phases) tlsDoneHook(_ tls.ConnectionState, err error) {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.open() && !ph.tlsStart.IsZero() && !ph.handshook {
		ph.up.Set(record.UpTLS, now.Sub(ph.tlsStart))
		ph.handshook = err == nil
	}
}

func (ph *phases) wroteRequestHook(httptrace.WroteRequestInfo) {
	now := ph.clock.Now()
	ph.mu.Lock()
	settled := ph.settled
	if !settled {
		ph.wrote = now
	}
	ph.mu.Unlock()
	if !settled && ph.wroteTo != nil {
		ph.wroteTo(now)
	}
}

func (ph *phases) firstByteHook() {
	now := ph.clock.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if !ph.settled && ph.firstByte.IsZero() {
		ph.firstByte = now
	}
}

// reached says whether the upstream was reached: the request was
// written whole, or the answer's first byte arrived (the transport may
// read an answer, and fail on it, before its writer reports the request
// written).
func (ph *phases) reached() bool {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return !ph.wrote.IsZero() || !ph.firstByte.IsZero()
}

// settle ends the phases: it returns the request's record.Upstream and
// when the request was written (zero if it was not), and drops whatever
// is reported later.
func (ph *phases) settle() (record.Upstream, time.Time) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	ph.settled = true
	up := ph.up
	if !ph.wrote.IsZero() && !ph.firstByte.IsZero() {
		// A response that began before the request was written whole (an
		// early answer, or a body the transport wrote straight to the
		// connection and answered before its writer reported it) is 0.
		up.Set(record.UpServer, max(ph.firstByte.Sub(ph.wrote), 0))
	}
	return up, ph.wrote
}
