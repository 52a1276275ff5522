package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// Loop detection (Options.Via). Every request a Proxy forwards carries
// its pseudonym in a Via header (RFC 9110 §7.6.3), "1.1 tokentap-<id>",
// appended to those it came with; a request that arrives with that
// pseudonym already in its Via went through this same sidecar before: a
// loop, whatever alias of the sidecar's address led back to it (its own
// port under another name, a gateway, a DNS name of the pod). It is
// answered 508 Loop Detected, never forwarded, and recorded as
// error/loop_detected (docs/config.md, "Loops").

// viaNames reports whether h's Via header names the pseudonym via as a
// hop (a received-by, the element's second word). It allocates nothing.
func viaNames(h http.Header, via string) bool {
	for _, line := range h["Via"] {
		for line != "" {
			var elem string
			elem, line, _ = strings.Cut(line, ",")
			elem = strings.TrimLeft(elem, " \t")
			sp := strings.IndexAny(elem, " \t")
			if sp < 0 {
				continue // a protocol with no received-by
			}
			by := strings.TrimLeft(elem[sp:], " \t")
			if end := strings.IndexAny(by, " \t"); end >= 0 {
				by = by[:end]
			}
			if by == via {
				return true
			}
		}
	}
	return false
}

// addVia appends this proxy's hop to out's Via, unless it is there (a
// probe of this sidecar sent through its own listener carries it).
func (p *Proxy) addVia(in *http.Request, out http.Header) {
	if p.opts.Via == "" || viaNames(out, p.opts.Via) {
		return
	}
	proto := "1.1 "
	if in.ProtoMajor == 2 {
		proto = "2 "
	}
	out["Via"] = append(out["Via"], proto+p.opts.Via)
}

// loopLogEvery is the least time between two loop lines in the log.
const loopLogEvery = 10 * time.Second

// refuseLoop answers a request that came back to this sidecar with a
// 508, and records it. It reports false, doing nothing, when r is not a
// loop.
func (p *Proxy) refuseLoop(w http.ResponseWriter, r *http.Request, h Hook) bool {
	if p.opts.Via == "" || !viaNames(r.Header, p.opts.Via) {
		return false
	}
	now := p.clock.Now()
	api := classify(r, p.engineKind()).Name
	rec := record.New(0)
	rec.Arrive, rec.ID, rec.Traffic, rec.API = now, p.nextID(), p.opts.Traffic, api
	rec.Target, rec.TargetRule = p.opts.Target, p.opts.TargetRule
	rec.Tenant = p.tenant(r, api)
	_, q := p.opts.Pipeline.Begin(r.Context(), rec, pipeline.Start{Key: record.Key{API: api, Traffic: p.opts.Traffic, Probe: h.Probe},
		PromptTokens: -1, Check: h.Check})
	const status = http.StatusLoopDetected
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"tokentap_%s","code":%d}}`+"\n",
		"tokentap: loop detected: this request went through this sidecar ("+p.opts.Via+") before; its upstream leads back to it", record.ErrLoop, status)
	rec.Outcome, rec.ErrorType, rec.HTTPStatus, rec.Terminal = record.Error, record.ErrLoop, status, p.clock.Now()
	if t := now.UnixNano(); t >= p.loopLog.Load() {
		p.loopLog.Store(t + int64(loopLogEvery))
		p.log.Error("loop detected: a request came back to this sidecar (its Via names it); answered 508 and recorded as error/loop_detected: the upstream, or something behind it, leads back here",
			"via", p.opts.Via, "upstream", p.opts.Upstream.Redacted(), "path", r.URL.Path)
	}
	p.endStages(q, rec, nil, nil)
	return true
}
