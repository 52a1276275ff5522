package simengine

import (
	"cmp"
	"context"
	"net"
	"slices"
	"sync"
	"time"
)

// The causes of delay the simulator knows it caused: the names of the
// sidecar's attribution (docs/measurement.md), so a test compares the two.
const (
	// CauseConnection: the connection's set-up (Engine.Dialer's delay)
	// before the request reached the engine.
	CauseConnection = "connection"
	// CauseQueue: the request waited, not admitted, while the batch
	// (MaxBatch) or the KV cache had no room for it, or requests ahead of
	// it in the queue took the room.
	CauseQueue = "queue"
	// CauseLongPrefillAhead (first tokens): the engine spent the time
	// prefilling another request's prompt (Ref) that was admitted before
	// the request's first token: the rest of the step it arrived during,
	// its admitting step, or, with chunked prefill, the steps whose
	// budget went to others.
	CauseLongPrefillAhead = "long_prefill_ahead"
	// CausePrefillInterference (stalls): a running sequence's step also
	// prefilled another request's prompt (Ref).
	CausePrefillInterference = "prefill_interference"
	// CausePreemption: the sequence itself was preempted (its wait and
	// recompute; Ref empty), or the step recomputed another preempted
	// sequence's tokens (Ref: that request).
	CausePreemption = "preemption"
	// CauseUnexplained: the engine's own hiccup (StallProb), which no
	// signal outside it shows.
	CauseUnexplained = "unexplained"
)

// causeNames indexes a sequence's accumulated delay (seq.parts).
var causeNames = [...]string{CauseConnection, CauseQueue, CauseLongPrefillAhead, CausePrefillInterference, CausePreemption, CauseUnexplained}

const (
	cConnection = iota
	cQueue
	cLongPrefillAhead
	cPrefillInterference
	cPreemption
	cUnexplained
	nCauses
)

// truthLogSize bounds Engine.Truth's log (requests) and maxTruthStalls
// each request's stalls in it (at most about 10 MiB together: the
// simulator always keeps it); dialLogSize bounds the connections whose
// delay waits for their first request (Engine.Dialer).
const (
	truthLogSize   = 4096
	maxTruthStalls = 32
	dialLogSize    = 4096
)

// Truth is what the simulator knows delayed one request: the ground
// truth a test compares the sidecar's attribution with. Its durations are
// the model's (the step times the engine chose), its instants the clock's.
type Truth struct {
	// ID is the client's X-Request-Id header when it sent a usable one
	// (1 to 128 visible ASCII bytes), else "sim-N" (N counts the engine's
	// requests from 1). The response carries it back in X-Sim-Request-Id.
	ID string
	// Arrive is when the engine got the request (after its connection's
	// set-up); PromptTokens its prompt as the engine counts it.
	Arrive       time.Time
	PromptTokens int
	// TTFT is from Arrive to the engine's first token (zero until then);
	// the client's also has the connection's set-up (in TTFTDelays).
	TTFT time.Duration
	// TTFTCause is the cause of the largest delay in TTFTDelays, "" when
	// none: the first token took the request's own prefill and one decode
	// step (and at most the rest of a step it arrived during that
	// prefilled nothing). TTFTRef is that delay's Ref.
	TTFTCause, TTFTRef string
	// TTFTDelays are the delays of the first token beyond the request's
	// own work, one per cause, largest first.
	TTFTDelays []TruthDelay
	// Stalls are the gaps between two of its tokens that took longer than
	// the decode step that produced the second, oldest first, at most 32
	// (StallsDropped counts the rest). Tokens are the engine's, before
	// MultiTokenProb coalesces their events.
	Stalls        []TruthStall
	StallsDropped int
	// End is how the request left the engine: "stop", "length", "error",
	// "abort"; "" while it runs.
	End string
}

// TruthDelay is one cause's share of a first token's delay; Ref is the
// ID of the request it points to (the prefill ahead), "" when none.
type TruthDelay struct {
	Cause string
	Dur   time.Duration
	Ref   string
}

// TruthStall is one gap between two tokens of a request: from Start (the
// earlier token) for Dur, of which Excess is beyond the decode step that
// produced the later token, explained by Cause (the largest of its
// parts), pointing to request Ref ("" when none).
type TruthStall struct {
	Start  time.Time
	Dur    time.Duration
	Cause  string
	Ref    string
	Excess time.Duration
}

// Truth returns the ground truth of the last requests the engine accepted
// (at most 4096), in the order they arrived; a running request's entry
// has what it knows so far. Requests refused (429, 400) have none.
func (e *Engine) Truth() []Truth {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Truth, 0, len(e.truth))
	add := func(ts []*Truth) {
		for _, t := range ts {
			c := *t
			c.TTFTDelays = slices.Clone(t.TTFTDelays)
			c.Stalls = slices.Clone(t.Stalls)
			out = append(out, c)
		}
	}
	add(e.truth[e.truthNext:])
	add(e.truth[:e.truthNext])
	return out
}

// logTruth adds t to the log, over the oldest once it is full; e.mu held.
func (e *Engine) logTruth(t *Truth) {
	if len(e.truth) < truthLogSize {
		e.truth = append(e.truth, t)
		return
	}
	e.truth[e.truthNext] = t
	e.truthNext = (e.truthNext + 1) % truthLogSize
}

// add accounts d of s's current wait (for its first token, or for its
// next token) to cause c, pointing to ref; e.mu held.
func (s *seq) add(c int, d time.Duration, ref string) {
	if d <= 0 {
		return
	}
	s.parts[c] += d
	if d > s.refMax[c] {
		s.refMax[c], s.refs[c] = d, ref
	}
}

// largest returns the cause with the most accounted delay, -1 when none.
func (s *seq) largest() int {
	best := -1
	for c, d := range s.parts {
		if d > 0 && (best < 0 || d > s.parts[best]) {
			best = c
		}
	}
	return best
}

// truthToken writes the truth of s's token at now, produced by a step
// whose decode took decode, and starts the wait for the next; e.mu held.
func (s *seq) truthToken(now time.Time, decode time.Duration) {
	t := s.truth
	if s.generated == 1 {
		t.TTFT = now.Sub(s.arrive)
		for c, d := range s.parts {
			if d > 0 {
				t.TTFTDelays = append(t.TTFTDelays, TruthDelay{Cause: causeNames[c], Dur: d, Ref: s.refs[c]})
			}
		}
		slices.SortStableFunc(t.TTFTDelays, func(a, b TruthDelay) int { return cmp.Compare(b.Dur, a.Dur) })
		if len(t.TTFTDelays) > 0 {
			t.TTFTCause, t.TTFTRef = t.TTFTDelays[0].Cause, t.TTFTDelays[0].Ref
		}
	} else {
		st := TruthStall{Start: s.lastToken, Dur: now.Sub(s.lastToken)}
		switch c := s.largest(); {
		case s.gapPreempted: // the wait and the recompute are the preemption's
			st.Cause, st.Excess = CausePreemption, st.Dur-decode
		case c >= 0:
			st.Cause, st.Ref = causeNames[c], s.refs[c]
			for _, d := range s.parts {
				st.Excess += d
			}
		}
		switch {
		case st.Cause == "":
		case len(t.Stalls) < maxTruthStalls:
			t.Stalls = append(t.Stalls, st)
		default:
			t.StallsDropped++
		}
	}
	s.parts, s.refMax, s.refs, s.gapPreempted = [nCauses]time.Duration{}, [nCauses]time.Duration{}, [nCauses]string{}, false
}

// validRequestID reports whether a client's X-Request-Id is kept as the
// request's ID: 1 to 128 visible ASCII bytes.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// DialFunc dials a connection, as http.Transport.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer returns next made slow to set up, for a client of this engine's
// Server (an http.Transport's DialContext): a share of the new
// connections (0 to 1, spread evenly: the n-th is slow when ⌊n·share⌋
// grows) waits delay before it dials, which a client's tracing sees as
// the wait for its connection (httptrace's GetConn to GotConn). The
// engine remembers each slow connection by its local address until it
// closes (with 4096 slow ones unread, a new connection is not made slow)
// and gives its delay to the first request
// the Server reads from it: that request's truth has a connection delay.
// A client that reuses connections may carry a request on a connection
// another request's dial made slow; with the server's keep-alives off
// (http.Server.SetKeepAlivesEnabled), every request dials its own.
//
// Design note: a server cannot make plain TCP set-up slow (the kernel
// accepts the connection before Accept returns, and a delayed first read
// is seen as the server's time, not the connection's), so the delay is
// the client's, and the engine only learns of it.
func (e *Engine) Dialer(next DialFunc, delay time.Duration, share float64) DialFunc {
	var mu sync.Mutex
	n := 0
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		n++
		slow := int(float64(n)*share) > int(float64(n-1)*share)
		mu.Unlock()
		e.mu.Lock()
		full := len(e.dials) >= dialLogSize
		e.mu.Unlock()
		if !slow || delay <= 0 || full {
			return next(ctx, network, addr)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		key := c.LocalAddr().String()
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.dials == nil {
			e.dials = make(map[string]time.Duration)
		}
		e.dials[key] = delay
		return &slowConn{Conn: c, e: e, key: key}, nil
	}
}

// slowConn forgets its delay when it closes, so that a later connection
// from the same address is not taken for it.
type slowConn struct {
	net.Conn
	e    *Engine
	key  string
	once sync.Once
}

func (c *slowConn) Close() error {
	c.once.Do(func() {
		c.e.mu.Lock()
		delete(c.e.dials, c.key)
		c.e.mu.Unlock()
	})
	return c.Conn.Close()
}

// takeDial returns the set-up delay of the connection from remote, once:
// its first request's.
func (e *Engine) takeDial(remote string) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, ok := e.dials[remote]
	if ok {
		delete(e.dials, remote)
	}
	return d
}
