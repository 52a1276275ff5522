package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Protocol switches (docs/measurement.md §3, "Upgrades"). A 101 Switching
// Protocols answer (a WebSocket) is not tapped: its body, the upstream
// connection, goes to httputil.ReverseProxy untouched, which splices it
// with the client's hijacked connection, and the request is recorded once,
// as api "upgrade", when the splice ends. Only its end is watched, on the
// upstream side (upstreamConn): the bytes are neither parsed nor timed.

// upgradeType is the protocol a request or a response asks to switch to
// (its Upgrade header, when Connection lists "upgrade"), or "".
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

// declineH2C drops a request's offer to switch to cleartext HTTP/2
// (Upgrade: h2c, as curl --http2 sends on http URLs): an engine that took
// it would turn the request into an unmeasured tunnel, and the request is
// served as HTTP/1.1 instead, which RFC 9110 §7.8 allows any party to do.
func declineH2C(r *http.Request) {
	if strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), "h2c") {
		r.Header.Del("Upgrade") // ReverseProxy drops what Connection lists (HTTP2-Settings)
	}
}

// refuseH2C answers an HTTP/2 prior-knowledge preface ("PRI *
// HTTP/2.0"): net/http hands it to the handler as a request, and
// forwarding it would record a request that never was. The client gets a
// 505 and the connection is closed; nothing is recorded.
func refuseH2C(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	http.Error(w, "tokentap: HTTP/2 with prior knowledge (h2c) is not supported; use HTTP/1.1, or HTTP/2 over TLS in egress mode",
		http.StatusHTTPVersionNotSupported)
}

// errNoHalfClose is upstreamConn.CloseWrite's answer when the upstream
// connection cannot be half-closed: the splice then ends with the
// client's side.
var errNoHalfClose = errors.New("tokentap: the upstream connection cannot be half-closed")

// upgrade takes a 101 answer: it checks that the upstream switched to the
// protocol the client asked for, and hands the upstream connection, in an
// upstreamConn, to ReverseProxy's splice. An error refuses the switch
// (ReverseProxy closes the upstream connection and the error handler
// answers 502).
func (p *Proxy) upgrade(st *reqState, resp *http.Response) error {
	asked, got := upgradeType(resp.Request.Header), upgradeType(resp.Header)
	if got == "" || !strings.EqualFold(asked, got) || !printable(got) {
		return fmt.Errorf("the upstream switched protocols to %.64q, %.64q was asked for", got, asked)
	}
	body, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return errors.New("the upstream's 101 has no connection to splice (its transport does not give one)")
	}
	if st.switchTimer != nil && !st.switchTimer.Stop() {
		return errors.New("the request timeout passed before the upstream switched protocols")
	}
	st.rec.API = stream.NameUpgrade
	st.upgrade = &upstreamConn{ReadWriteCloser: body}
	if cw, ok := st.phases.conn.(interface{ CloseWrite() error }); ok {
		st.upgrade.half = cw
	}
	resp.Body = st.upgrade
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// upstreamConn is the upstream end of a switched protocol, as
// ReverseProxy's splice uses it: its two copy loops read and write it,
// and it is closed when the splice ends or the request's context does.
// It notes how the upstream side ended; once the proxy closes it, or the
// record is settled, errors are the proxy's own and no longer noted.
type upstreamConn struct {
	io.ReadWriteCloser
	// half half-closes the upstream connection (its write side), or is
	// nil when the connection cannot (CloseWrite).
	half interface{ CloseWrite() error }

	mu     sync.Mutex // the two copy loops, Close and settle
	eof    bool       // the upstream closed its side cleanly
	broke  bool       // a read or a write failed before the proxy closed the connection
	closed bool
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(b)
	if err != nil {
		c.note(err == io.EOF)
	}
	return n, err
}

func (c *upstreamConn) Write(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Write(b)
	if err != nil {
		c.note(false)
	}
	return n, err
}

func (c *upstreamConn) note(eof bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
	case eof:
		c.eof = true
	default:
		c.broke = true
	}
}

// CloseWrite passes the client's half-close on to the upstream.
// ReverseProxy calls it when the client has closed its side, and then
// waits for the upstream to close its own: the splice ends when both
// sides have closed (or one broke), not at the first FIN.
func (c *upstreamConn) CloseWrite() error {
	if c.half == nil {
		return errNoHalfClose
	}
	return c.half.CloseWrite()
}

func (c *upstreamConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.ReadWriteCloser.Close()
}

// settle stops the noting and reports how the upstream side ended: eof
// when it closed cleanly, broke when a read or a write failed first.
func (c *upstreamConn) settle() (eof, broke bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return c.eof, c.broke
}

// upgradeOutcome decides a spliced connection's outcome when the splice
// has ended; its E2E is the connection's life.
func (p *Proxy) upgradeOutcome(st *reqState, now time.Time) {
	rec := st.rec
	eof, broke := st.upgrade.settle()
	switch {
	case st.shutDown():
		rec.Outcome, rec.ErrorType = record.Error, record.ErrShutdown
	case st.ctx.Err() != nil && errors.Is(st.ctx.Err(), context.DeadlineExceeded):
		rec.Outcome, rec.ErrorType = record.Timeout, record.ErrTimeout
	case broke:
		rec.Outcome, rec.ErrorType = record.Error, record.ErrUpstreamReset
	case eof:
		rec.Outcome = record.Success
	default:
		// The splice ended on the client's side with the upstream still
		// open: the client closed without the upstream following, or broke.
		rec.Outcome, rec.ErrorType = record.Cancelled, record.ErrCancelled
	}
	rec.Terminal = now
}
