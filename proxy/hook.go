package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Hook is what an in-process sender (the canary prober, replay) sets on
// one request it serves through a shared Proxy, on the request's context
// (WithHook): each builds its proxy once (one per target) and sends every
// request through it. A request from the network cannot carry a Hook:
// only a context made in this process can.
//
// Every zero field leaves the proxy's behaviour as it is without a Hook.
type Hook struct {
	// Probe names the canary probe the request is (record.Key.Probe);
	// "" for none.
	Probe string
	// Check, if set, runs on the request's finished record first in the
	// pipeline's end stages (the canary's quality check; replay's note
	// of its schedule).
	Check func(*record.Record)
	// Timeout bounds this request as Options.Timeout does, in its place;
	// 0 leaves Options.Timeout.
	Timeout time.Duration
}

type hookKey struct{}

// WithHook returns ctx carrying h for the request made with it.
func WithHook(ctx context.Context, h *Hook) context.Context {
	return context.WithValue(ctx, hookKey{}, h)
}

// hook is r's Hook merged over the proxy's options (the zero Hook when
// r carries none): read once per request, at its arrival.
func (p *Proxy) hook(r *http.Request) Hook {
	h := Hook{Timeout: p.opts.Timeout}
	if x, ok := r.Context().Value(hookKey{}).(*Hook); ok && x != nil {
		h.Probe, h.Check = x.Probe, x.Check
		if x.Timeout > 0 {
			h.Timeout = x.Timeout
		}
	}
	return h
}
