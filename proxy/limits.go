package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// errShutdown is the cause given to the streams that are still running
// when the shutdown grace period is over (Proxy.Cut).
var errShutdown = errors.New("tokentap: shutting down")

// inflight tracks the requests in flight so that shutdown can cut them.
// It is touched twice per request, never per token.
type inflight struct {
	mu      sync.Mutex
	cutting bool
	cancels map[*reqState]context.CancelCauseFunc
	idle    chan struct{} // closed when cancels empties; nil until Wait asks
}

// add registers a request; if the proxy is already cutting, the request
// is cut at once.
func (f *inflight) add(st *reqState, cancel context.CancelCauseFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutting {
		cancel(errShutdown)
		return
	}
	if f.cancels == nil {
		f.cancels = map[*reqState]context.CancelCauseFunc{}
	}
	f.cancels[st] = cancel
}

func (f *inflight) remove(st *reqState) {
	f.mu.Lock()
	delete(f.cancels, st)
	if len(f.cancels) == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
	f.mu.Unlock()
}

// Wait returns nil when no request is in flight, or ctx's error when ctx
// is done first. http.Server.Shutdown neither waits for nor closes a
// connection that switched protocols (a WebSocket: net/http has handed
// it to the handler), so shutdown waits here for those too, within the
// same grace period as streams, before it cuts what is left.
func (p *Proxy) Wait(ctx context.Context) error {
	f := &p.inflight
	f.mu.Lock()
	if len(f.cancels) == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cut ends every request still in flight, and every later one at once:
// each is recorded with outcome error and error type "shutdown" (never
// "cancelled": the client did not leave). It returns how many it cut.
// Call it when the shutdown grace period is over.
func (p *Proxy) Cut() int {
	f := &p.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutting = true
	for _, cancel := range f.cancels {
		cancel(errShutdown)
	}
	return len(f.cancels)
}

// shutDown reports whether a request was cut by Cut.
func (st *reqState) shutDown() bool { return errors.Is(context.Cause(st.ctx), errShutdown) }

// PeekBudget bounds the bytes that request-body peeks hold at once,
// across every request of every proxy that shares it (Options.PeekBudget):
// a peek's buffer grows with the bytes its client sent (readAtMost), and
// each growth is taken from the budget first. When the budget has no
// room, the peek stops where it is and the body is forwarded as it comes,
// read no further (record.Record.RequestRead "budget"), and Full counts
// it. What a peek took is given back when its request ends. Create it
// with NewPeekBudget; a nil *PeekBudget bounds nothing. Taking is one
// atomic add per growth of a buffer (a few per request), never per token.
type PeekBudget struct {
	max  int64
	used atomic.Int64
	full atomic.Uint64
}

// NewPeekBudget returns a budget of max bytes.
func NewPeekBudget(max int64) *PeekBudget { return &PeekBudget{max: max} }

// take reserves n bytes, or none and false when they would not fit.
func (b *PeekBudget) take(n int) bool {
	if b == nil {
		return true
	}
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

// give returns n bytes taken.
func (b *PeekBudget) give(n int) {
	if b != nil && n > 0 {
		b.used.Add(-int64(n))
	}
}

// Max is the budget's size in bytes.
func (b *PeekBudget) Max() int64 { return b.max }

// Held is the bytes the peeks of requests in flight hold now.
func (b *PeekBudget) Held() int64 { return b.used.Load() }

// Full counts the peeks cut short because the budget had no room.
func (b *PeekBudget) Full() uint64 { return b.full.Load() }

// idleBody bounds the time a client may take to send its request body.
// Before each read it moves the connection's read deadline d ahead, so a
// body that sends nothing for d is cut. With a minimum rate (rate > 0,
// bytes per second), the deadline is also never later than the body's
// allowance: d, plus a second for every rate bytes received, less the
// time already spent waiting for the client. A body that trickles (a
// byte every few seconds re-arms the idle deadline each time) is cut
// once it falls behind, while one that keeps up is never cut, however
// long it is. Only the time spent in Read counts: while the upstream is
// slow to take the body, the proxy does not read and the client is not
// charged for it. Once the body is read (EOF) or closed, the deadline is
// cleared, so the response, however long it streams, is never cut by it.
type idleBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	d        time.Duration
	rate     int64      // bytes per second; 0: no minimum
	mu       sync.Mutex // Read (transport goroutine) and Close may race
	done     bool
	timedOut bool
	received int64         // bytes read
	waited   time.Duration // time spent in Read
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	now := time.Now()
	if !b.done {
		deadline := now.Add(b.d)
		if b.rate > 0 {
			allowed := b.d + time.Duration(float64(b.received)/float64(b.rate)*float64(time.Second))
			deadline = now.Add(min(b.d, allowed-b.waited))
		}
		_ = b.rc.SetReadDeadline(deadline)
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.received += int64(n)
	b.waited += time.Since(now)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			b.timedOut = true
		}
	}
	b.mu.Unlock()
	if err == io.EOF {
		b.clear()
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.clear()
	return b.ReadCloser.Close()
}

func (b *idleBody) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

// TimedOut reports whether the client's body went idle past the bound.
func (b *idleBody) TimedOut() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.timedOut
}
