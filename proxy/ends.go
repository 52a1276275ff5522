package proxy

import (
	"context"
	"sync"
)

// Ends counts the end-of-request stages still running after their
// responses (Options.Ends), so that shutdown can wait for their records.
// The zero value counts none. Touched twice per request, never per token.
type Ends struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls back to 0
}

func (e *Ends) add() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		e.idle = make(chan struct{})
	}
	e.n++
}

func (e *Ends) done() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n--; e.n == 0 {
		close(e.idle)
	}
}

// Wait blocks until no end is running, or until ctx is done (its error
// then). Call it once the servers have stopped taking requests (after
// http.Server.Shutdown), before the sinks close: new requests would keep
// it waiting.
func (e *Ends) Wait(ctx context.Context) error {
	e.mu.Lock()
	if e.n == 0 {
		e.mu.Unlock()
		return nil
	}
	idle := e.idle
	e.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
