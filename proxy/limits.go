package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
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

// idleBody bounds the time a client may leave its request body idle:
// before each read it moves the connection's read deadline d ahead, so a
// body that keeps flowing is never cut, and one that sends nothing for d
// is. Once the body is read (EOF) or closed, the deadline is cleared, so
// the response, however long it streams, is never cut by it.
type idleBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	d        time.Duration
	mu       sync.Mutex // Read (transport goroutine) and Close may race
	done     bool
	timedOut bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if !b.done {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		var ne net.Error
		b.mu.Lock()
		if errors.As(err, &ne) && ne.Timeout() {
			b.timedOut = true
		}
		b.mu.Unlock()
		if err == io.EOF {
			b.clear()
		}
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
