package proxy

import (
	"bytes"
	"io"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// bodyKind is how the tap reads a response body.
type bodyKind uint8

const (
	bodyOpaque bodyKind = iota // not understood: forwarded, not parsed
	bodySSE                    // text/event-stream of OpenAI chunks
	bodyJSON                   // a whole JSON response (non-streaming)
)

// tap wraps an upstream response body. ReverseProxy reads it and writes
// what it returns to the client; the tap times every read and parses what
// it has read.
//
// Design note: forward first, parse after. In pass-through mode the tap
// returns the bytes of a read at once and parses them at the start of the
// next Read (or in Close): by then ReverseProxy has written and flushed
// them, so parsing never delays the bytes it parses, and the time between
// the read and that next call is the forwarding delay we export. Event
// times are the instants the bytes were READ, as docs/measurement.md §1 says.
//
// In strip mode (the sidecar injected stream_options.include_usage and
// must remove the engine's usage event), the tap must find event
// boundaries before it forwards: it frames each read, holds back only the
// bytes of an event that is not complete yet (an SSE client cannot use
// them before the blank line that ends the event anyway), cuts the usage
// event out, forwards the rest, and parses the forwarded events after
// they were written, as in pass-through mode.
type tap struct {
	body  io.ReadCloser
	st    *reqState
	kind  bodyKind
	strip bool

	framer stream.Framer
	chunk  stream.Chunk
	onEv   func(*stream.Event) // t.event, bound once
	onCut  func(*stream.Event) // t.frameForStrip, bound once

	// pass-through: the last read, not parsed yet (aliases the caller's buffer)
	pending   []byte
	pendingAt time.Time

	// strip mode
	held    []byte     // read but not yet forwarded, from stream offset heldOff
	heldOff int64      //
	cuts    [][2]int64 // byte ranges of held to drop
	cutLF   int64      // offset of an LF that completes a cut CRLF, or -1
	out     []byte     // forwardable bytes; out[outPos:] not yet handed to the caller
	outPos  int        //
	outErr  error      // error to return once out is drained
	queue   []queued   // forwarded events awaiting parsing
	qdata   []byte     // their data
	readAt  time.Time  // time of the read being framed

	// non-streaming bodies, kept up to a bound for parsing at EOF
	whole     []byte
	wholeMax  int
	wholeOver bool

	// captured keeps the raw body (bounded) when content capture is on.
	captured []byte
	capture  bool

	eof, closed, failed bool
	readErr             error
	readErrAt           time.Time

	// what the stream said
	done        bool // end marker seen
	streamErr   bool // error event seen
	rejection   bool // ... and it was an overload
	sawUsage    bool
	usageOut    int64
	idTokens    int64 // per-event token counts summed
	lpTokens    int64
	tokensFrom  stream.TokenSource // weakest per-event source seen; None if some event had none
	perEventAll bool
}

type queued struct {
	at         time.Time
	start, end int
	hasData    bool
}

func newTap(body io.ReadCloser, st *reqState, kind bodyKind, strip bool, wholeMax int) *tap {
	t := &tap{body: body, st: st, kind: kind, strip: strip, cutLF: -1, wholeMax: wholeMax, perEventAll: true}
	t.onEv = t.event
	t.onCut = t.frameForStrip
	return t
}

func (t *tap) now() time.Time { return t.st.clock.Now() }

// Read implements io.Reader for ReverseProxy.
func (t *tap) Read(p []byte) (int, error) {
	if t.strip {
		return t.readStrip(p)
	}
	t.afterForward()
	n, err := t.body.Read(p)
	at := t.now()
	if n > 0 {
		t.firstByte(at)
		t.keep(p[:n])
		if !t.failed {
			t.pending, t.pendingAt = p[:n], at
		}
	}
	if err != nil {
		t.noteErr(err, at)
	}
	return n, err
}

// keep copies read bytes for content capture (off: one branch).
func (t *tap) keep(b []byte) {
	if t.capture && len(t.captured)+len(b) <= 1<<20 {
		t.captured = append(t.captured, b...)
	}
}

func (t *tap) firstByte(at time.Time) {
	if t.st.rec.FirstByte.IsZero() {
		t.st.rec.FirstByte = at
	}
}

func (t *tap) noteErr(err error, at time.Time) {
	if t.readErr == nil && !t.eof {
		if err == io.EOF {
			t.eof = true
		} else {
			t.readErr = err
		}
		t.readErrAt = at
	}
}

// afterForward parses what the previous Read returned, which the caller
// has forwarded by now. A panic here turns the tap off for this response
// (fail open): the bytes keep flowing and the failure is counted.
func (t *tap) afterForward() {
	if t.failed {
		return
	}
	defer t.recoverTap()
	now := t.now()
	if t.pending != nil {
		p, at := t.pending, t.pendingAt
		t.pending = nil
		events := t.st.rec.Events
		t.parse(p, at)
		if t.st.rec.Events > events {
			t.st.obs.ForwardDelay(now.Sub(at))
		}
	}
	if len(t.queue) > 0 {
		t.st.obs.ForwardDelay(now.Sub(t.queue[len(t.queue)-1].at))
		for i := range t.queue {
			q := &t.queue[i]
			ev := stream.Event{Data: t.qdata[q.start:q.end], HasData: q.hasData}
			t.handle(&ev, q.at)
		}
		t.queue = t.queue[:0]
		t.qdata = t.qdata[:0]
	}
}

func (t *tap) recoverTap() {
	if r := recover(); r != nil {
		t.fail("panic")
	}
}

func (t *tap) fail(reason string) {
	t.failed = true
	t.pending = nil
	t.st.rec.TapFailed = reason
	t.st.obs.TapFailed(reason)
	if t.strip { // release everything held, unchanged
		t.out = append(t.out, t.held...)
		t.held = nil
	}
}

// parse consumes bytes read at `at` (pass-through mode).
func (t *tap) parse(p []byte, at time.Time) {
	switch t.kind {
	case bodySSE:
		t.readAt = at
		t.framer.Feed(p, t.onEv)
		if t.framer.Overflow {
			t.fail("event_too_large")
		}
	case bodyJSON:
		if len(t.whole)+len(p) > t.wholeMax {
			t.wholeOver = true
			t.whole = nil
		} else if !t.wholeOver {
			t.whole = append(t.whole, p...)
		}
	}
}

func (t *tap) event(ev *stream.Event) { t.handle(ev, t.readAt) }

// handle applies one complete event, read at `at`, to the record.
func (t *tap) handle(ev *stream.Event, at time.Time) {
	rec := t.st.rec
	rec.Events++
	if rec.FirstEvent.IsZero() {
		rec.FirstEvent = at
	}
	if !ev.HasData || t.done || t.streamErr {
		return // comments, keep-alives; anything after the terminal event
	}
	c := &t.chunk
	stream.ParseOpenAI(ev.Data, c)
	t.apply(c, at)
}

func (t *tap) apply(c *stream.Chunk, at time.Time) {
	rec := t.st.rec
	switch {
	case c.Done:
		t.done = true
		rec.Terminal = at
		return
	case c.Malformed:
		rec.Malformed = true
		t.st.obs.Malformed()
		return
	case c.Error:
		t.streamErr = true
		t.rejection = c.Rejection()
		rec.ErrorCode = c.ErrorCode
		rec.Terminal = at
		return
	}
	if c.Usage {
		t.sawUsage = true
		rec.InputTokens = c.PromptTokens
		t.usageOut = c.CompletionTokens
		rec.CachedTokens = c.CachedTokens
	}
	if rec.ResponseModel == "" && len(c.Model) > 0 {
		rec.ResponseModel = string(c.Model)
	}
	if rec.ResponseID == "" && len(c.ID) > 0 {
		rec.ResponseID = string(c.ID)
	}
	if len(c.FinishReason) > 0 && rec.FinishReason != string(c.FinishReason) {
		rec.FinishReason = string(c.FinishReason)
	}
	if c.TokenBearing() && t.kind == bodySSE {
		switch c.TokensFrom {
		case stream.SourceTokenIDs:
			t.idTokens += c.Tokens
		case stream.SourceLogprobs:
			t.lpTokens += c.Tokens
			t.idTokens += c.Tokens
		default:
			t.perEventAll = false
		}
		if c.TokensFrom > t.tokensFrom {
			t.tokensFrom = c.TokensFrom
		}
		t.st.obs.Tokens(max(c.Tokens, 1))
		if gap, ok := rec.AddToken(at, c.Tokens, c.Output); ok {
			t.st.obs.Gap(gap)
		}
	}
}

// readStrip is Read in strip mode.
func (t *tap) readStrip(p []byte) (int, error) {
	if t.outPos < len(t.out) {
		n := copy(p, t.out[t.outPos:])
		t.outPos += n
		if t.outPos == len(t.out) {
			t.out, t.outPos = t.out[:0], 0 // keep the buffer: no allocation per event
			if t.outErr != nil {
				return n, t.outErr
			}
		}
		return n, nil
	}
	if t.outErr != nil {
		return 0, t.outErr
	}
	if t.failed { // fell back to plain forwarding
		n, err := t.body.Read(p)
		at := t.now()
		if n > 0 {
			t.firstByte(at)
		}
		if err != nil {
			t.noteErr(err, at)
		}
		return n, err
	}
	t.afterForward()
	for {
		n, err := t.body.Read(p)
		at := t.now()
		if n > 0 {
			t.firstByte(at)
			t.keep(p[:n])
			t.frameStrip(p[:n], at)
		}
		if err != nil {
			t.noteErr(err, at)
			t.finishStrip()
			t.outErr = err
		}
		if t.outPos < len(t.out) || t.outErr != nil {
			return t.readStrip(p)
		}
		// everything read so far belongs to an incomplete event: read on
	}
}

// frameStrip frames one read, decides what may be forwarded and moves it
// to t.out.
func (t *tap) frameStrip(b []byte, at time.Time) {
	defer t.recoverTap()
	t.held = append(t.held, b...)
	t.readAt = at
	t.framer.Feed(b, t.onCut)
	if t.framer.Overflow {
		t.fail("event_too_large")
		return
	}
	t.release(t.framer.PendingStart())
}

// release moves held bytes before stream offset upto to t.out, minus cuts.
func (t *tap) release(upto int64) {
	if t.cutLF >= 0 && t.cutLF < t.heldOff+int64(len(t.held)) {
		if t.cutLF >= t.heldOff && t.held[t.cutLF-t.heldOff] == '\n' {
			t.cuts = append(t.cuts, [2]int64{t.cutLF, t.cutLF + 1})
			if upto == t.cutLF {
				upto++
			}
		}
		t.cutLF = -1
	}
	if upto <= t.heldOff {
		return
	}
	from := t.heldOff
	for _, c := range t.cuts {
		if c[0] > from {
			t.out = append(t.out, t.held[from-t.heldOff:c[0]-t.heldOff]...)
		}
		from = c[1]
	}
	if upto > from {
		t.out = append(t.out, t.held[from-t.heldOff:upto-t.heldOff]...)
	}
	t.cuts = t.cuts[:0]
	rest := copy(t.held, t.held[upto-t.heldOff:])
	t.held = t.held[:rest]
	t.heldOff = upto
}

// frameForStrip sees each complete event before it is forwarded. Only an
// event that may be the injected usage chunk is parsed here; every other
// event is queued and parsed after it was forwarded.
func (t *tap) frameForStrip(ev *stream.Event) {
	if ev.HasData && !ev.Partial && bytes.Contains(ev.Data, []byte(`"usage"`)) {
		var c stream.Chunk
		stream.ParseOpenAI(ev.Data, &c)
		if c.UsageOnly() {
			t.cuts = append(t.cuts, [2]int64{ev.Start, ev.End})
			if t.framer.AfterCR() && ev.End == t.framer.Offset() {
				t.cutLF = ev.End // maybe the CR of a CRLF split across reads
			}
			rec := t.st.rec
			rec.Events++
			t.apply(&c, t.readAt)
			return
		}
	}
	start := len(t.qdata)
	t.qdata = append(t.qdata, ev.Data...)
	t.queue = append(t.queue, queued{at: t.readAt, start: start, end: len(t.qdata), hasData: ev.HasData})
}

// finishStrip releases everything at the end of the body, a trailing
// partial event included (it is never cut).
func (t *tap) finishStrip() {
	if !t.failed {
		func() {
			defer t.recoverTap()
			t.framer.Finish(t.onCut)
		}()
	}
	if !t.failed {
		t.release(t.heldOff + int64(len(t.held)))
	}
	t.out = append(t.out, t.held...)
	t.held = t.held[:0]
}

// Close parses what is left and closes the upstream body.
func (t *tap) Close() error {
	if !t.closed {
		t.closed = true
		t.afterForward()
		if !t.failed && t.kind == bodySSE && t.eof && !t.strip {
			func() {
				defer t.recoverTap()
				t.framer.Finish(t.onEv)
			}()
		}
		t.afterForward()
		if !t.failed && t.kind == bodyJSON && t.eof && !t.wholeOver && len(t.whole) > 0 {
			func() {
				defer t.recoverTap()
				stream.ParseOpenAI(t.whole, &t.chunk)
				if t.chunk.Malformed {
					t.st.rec.Malformed = true
					return
				}
				at := t.readErrAt
				t.apply(&t.chunk, at)
			}()
		}
	}
	return t.body.Close()
}
