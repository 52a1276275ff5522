package proxy

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// bodyKind is how the tap reads a response body.
type bodyKind uint8

const (
	bodyOpaque bodyKind = iota // not understood: forwarded, not parsed
	bodySSE                    // text/event-stream: events of the tap's format
	bodyNDJSON                 // application/x-ndjson: one payload a line (Ollama)
	bodyJSON                   // a whole JSON response (non-streaming)
)

// streamed reports whether the body is a stream of events (timed per
// event) rather than one whole payload.
func (k bodyKind) streamed() bool { return k == bodySSE || k == bodyNDJSON }

// tap wraps an upstream response body. ReverseProxy reads it and writes
// what it returns to the client; the tap times every read and parses what
// it has read.
//
// Forward first, parse after: in pass-through mode a read's bytes are
// returned at once and parsed at the start of the next Read (or in Close),
// once ReverseProxy has written and flushed them; the time until then is
// the forwarding delay. Event times are the instants the bytes were READ
// (docs/measurement.md §1; docs/design.md, "Forward first, parse after").
// In strip mode (strip.go) each read is framed before it is forwarded, so
// that the injected usage chunk can be cut out.
type tap struct {
	body   io.ReadCloser
	st     *reqState
	kind   bodyKind
	format stream.Format // which adapter reads the payloads
	strip  bool
	// usage is the API's usage request (stream.API's Request.Usage),
	// whose members strip mode looks for; set whenever strip is.
	usage      *stream.UsageOption
	stripChunk stream.Chunk // parseStrip's

	framer stream.Framer
	lines  stream.LineFramer // bodyNDJSON
	chunk  stream.Chunk
	onEv   func(*stream.Event) // t.event, bound once
	onCut  func(*stream.Event) // t.frameForStrip, bound once

	// pass-through: the last read, not parsed yet. It is a copy in the
	// tap's own pendBuf, never the caller's buffer: ReverseProxy takes its
	// copy buffer from a pool (copyBuffers) and hands it back before it
	// closes the body, so an alias could be parsed after another response
	// wrote into it.
	pending   []byte
	pendBuf   []byte
	pendingAt time.Time

	// strip mode
	held    []byte     // read but not yet forwarded, from stream offset heldOff
	hbuf    []byte     // the tap's own buffer behind held (held aliases the caller's during frameStrip)
	emitTo  []byte     // the caller's buffer while frameStrip forwards in place; nil: to out
	emitN   int        // bytes forwarded into emitTo so far
	heldOff int64      //
	cuts    [][2]int64 // byte ranges of held to drop
	cutLF   int64      // offset of an LF that completes a cut CRLF, or -1
	out     []byte     // forwardable bytes; out[outPos:] not yet handed to the caller
	outPos  int        //
	outErr  error      // error to return once out is drained
	queue   []queued   // forwarded events awaiting parsing
	qdata   []byte     // their data
	readAt  time.Time  // time of the read being framed
	ls      lineScan   // the lines of the incomplete event held
	// degraded: strip mode gave up (see giveUp): nothing is cut any more,
	// and once out is drained the rest is read in pass-through mode.
	degraded bool
	gaveUpAt int64 // stream offset from which nothing was cut; -1 while stripping
	finished bool  // the framer was told the stream ended

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
	oversized           int  // events the framer dropped for their size (countOversized)
	needModel           bool // the model comes from the response (modelFromResponse)

	// what the stream said
	// empty: a whole JSON body, parsed, named no answer: no output, no
	// finish reason, no usage, no end (`{}`, `{"choices":[]}`)
	empty       bool
	done        bool // end marker seen
	streamErr   bool // error event seen
	rejection   bool // ... and it was an overload
	sawUsage    bool
	usageOut    int64
	sawPrompt   bool
	sawToken    bool               // the first token event was stamped (pipeline.Request.FirstToken)
	hdrOut      int64              // an engine header's output count (stream.EngineHeaders: TGI's x-generated-tokens), -1 if absent
	idTokens    int64              // per-event token counts summed
	tokensFrom  stream.TokenSource // weakest per-event source seen; None if some event had none
	perEventAll bool
	ch          choiceTrack // the response's choices (choices.go)
	// col collects the answer text and tool calls for the structure
	// checks (proxy/structure.go); nil when none applies.
	col *stream.Collector

	// looped: an event loop drives the tap (evloop_linux.go), feeding
	// body with each read's bytes and calling afterForward itself once it
	// has written what Read returned.
	looped bool
}

type queued struct {
	at         time.Time
	start, end int
	hasData    bool
}

// newTap wraps body. strip asks for strip mode, which frames SSE only:
// for another kind of body it is ignored (the proxy asks for it only on
// an SSE answer to an injected request).
func newTap(body io.ReadCloser, st *reqState, kind bodyKind, format stream.Format, strip bool, wholeMax int) *tap {
	strip = strip && kind == bodySSE && st.info.API != nil && st.info.API.Request.Usage != nil
	t := &tap{body: body, st: st, kind: kind, format: format, strip: strip, cutLF: -1, gaveUpAt: -1, ls: lineScan{rel: -1},
		wholeMax: wholeMax, perEventAll: true, hdrOut: -1}
	if strip {
		t.usage = st.info.API.Request.Usage
	}
	t.onEv = t.event
	t.onCut = t.frameForStrip
	t.needModel = st.info.Read != "" && st.rec.Model == ""
	return t
}

func (t *tap) now() time.Time { return t.st.clock.Now() }

// Read implements io.Reader for ReverseProxy.
func (t *tap) Read(p []byte) (int, error) {
	if t.strip {
		return t.readStrip(p)
	}
	return t.readPass(p)
}

// holdsOut reports whether strip mode has bytes to forward that no Read
// has returned yet.
func (t *tap) holdsOut() bool { return t.outPos < len(t.out) }

// readPass is Read in pass-through mode.
func (t *tap) readPass(p []byte) (int, error) {
	if !t.looped {
		t.afterForward()
	}
	n, err := t.body.Read(p)
	if err == errAgain { // a loop's feed has nothing more yet
		return 0, err
	}
	at := t.now()
	if n > 0 {
		t.firstByte(at)
		t.keep(p[:n])
		if !t.failed && t.kind != bodyOpaque { // an opaque body is not parsed
			t.pendBuf = append(t.pendBuf[:0], p[:n]...)
			t.pending, t.pendingAt = t.pendBuf, at
		}
	}
	if err != nil {
		t.noteErr(err, at)
	}
	return n, err
}

// copyBufSize is the size of the buffer ReverseProxy copies a response
// through (its own default is 32 KiB, allocated per response). An SSE
// event is a few hundred bytes and the transport's read buffer is 2 KiB
// (transportBufSize), so a stream's reads fit; a large non-streaming
// body takes more reads (8 where 32 KiB took one). The default held 28
// KiB more for every stream in flight and cost an allocation and its
// zeroing per response.
const copyBufSize = 4 << 10

var copyBufPool = sync.Pool{New: func() any { return new([copyBufSize]byte) }}

// copyBuffers is the proxy's httputil.BufferPool: one pooled 4 KiB
// buffer per response being copied. The tap never keeps a reference to
// it (see pendBuf).
type copyBuffers struct{}

func (copyBuffers) Get() []byte { return copyBufPool.Get().(*[copyBufSize]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if len(b) == copyBufSize {
		copyBufPool.Put((*[copyBufSize]byte)(b))
	}
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

// fail turns the tap off for the rest of the response: the bytes keep
// flowing, nothing more is parsed.
func (t *tap) fail(reason string) {
	t.failed = true
	t.pending = nil
	t.gaveUp(reason)
	if t.strip { // release everything held, unchanged
		t.out = append(t.out, t.held...)
		t.held = nil
	}
}

// gaveUp records that the tap gave something up on this response. The
// record keeps the first reason (the cause: a strip mode that degraded and
// then failed says why it degraded); every one is counted.
func (t *tap) gaveUp(reason string) {
	if t.st.rec.TapFailed == "" {
		t.st.rec.TapFailed = reason
	}
	t.st.obs.TapFailed(reason)
}

// parse consumes bytes read at `at` (pass-through mode).
func (t *tap) parse(p []byte, at time.Time) {
	switch t.kind {
	case bodySSE:
		t.readAt = at
		t.framer.Feed(p, t.onEv)
		t.countOversized(t.framer.Oversized)
	case bodyNDJSON:
		t.readAt = at
		t.lines.Feed(p, t.onEv)
		t.countOversized(t.lines.Oversized)
	case bodyJSON:
		if len(t.whole)+len(p) > t.wholeMax {
			t.wholeOver = true
			t.whole = nil
		} else if !t.wholeOver {
			t.whole = append(t.whole, p...)
		}
	}
}

// countOversized takes the framer's count of the events it dropped for
// being over its bound (stream.Framer.MaxEventBytes, 1 MiB: a base64
// image, a large tool-call argument in one event). The tap goes on: the
// event's bytes were forwarded like every other's, the events after it
// are measured, and only its own content is unknown (docs/measurement.md
// §2: its tokens are not counted, so per-event counts are no longer
// exact). Each is counted in the record (OversizedEvents) and in
// tokentap_tap_failures_total{reason="event_too_large"}. Per read, not per
// event: an integer compare.
func (t *tap) countOversized(n int) {
	for t.oversized < n {
		t.oversized++
		t.st.rec.OversizedEvents++
		t.perEventAll = false
		t.st.obs.TapFailed("event_too_large")
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
	stream.ParseCollect(t.format, ev.Data, c, t.col)
	t.apply(c, at)
	if t.needModel {
		t.modelFromResponse()
	}
}

// modelFromResponse gives a request whose body was not read whole, and
// which named no model in what was read, the model the engine answered
// with (docs/records.md, model): its record, its SLO scope and its model
// label, from the event that names it on.
func (t *tap) modelFromResponse() {
	rec := t.st.rec
	if rec.ResponseModel == "" {
		return
	}
	t.needModel = false
	rec.SetModel(rec.ResponseModel)
	t.st.obs.ResponseModel(rec.Model)
}

// maxIDBytes bounds the engine's response id kept in the record: it is
// engine-controlled, and an id is short (chatcmpl-..., resp_..., msg_...).
const maxIDBytes = 256

// apply folds one parsed payload, read at `at`, into the record. Every
// format fills the same Chunk, so this is the same for all of them.
func (t *tap) apply(c *stream.Chunk, at time.Time) {
	rec := t.st.rec
	if c.Malformed {
		rec.Malformed = true
		t.st.obs.Malformed()
		return
	}
	if rec.ResponseModel == "" && len(c.Model) > 0 {
		rec.ResponseModel = record.Cut(c.Model, record.MaxModelBytes)
	}
	if rec.ResponseID == "" && len(c.ID) > 0 {
		rec.ResponseID = record.Cut(c.ID, maxIDBytes)
	}
	if c.Error {
		t.streamErr = true
		t.rejection = c.Rejection()
		rec.ErrorCode = c.ErrorCode
		rec.Terminal = at
		return
	}
	// Usage. A zero usage on a chunk that carries choices is a
	// placeholder, not a count: Ollama's completions put
	// "usage":{all zeros} on every chunk once usage is asked for
	// (middleware/openai.go). A zero never overwrites a real count, and a
	// null usage is no usage at all (the adapters skip it).
	if (c.Usage || c.HasPrompt) && !(c.Choices > 0 && c.PromptTokens == 0 && c.CompletionTokens == 0) {
		if c.HasPrompt && (c.PromptTokens > 0 || !t.sawPrompt) {
			t.sawPrompt = true
			rec.InputTokens = c.PromptTokens
		}
		if c.Usage && (c.CompletionTokens > 0 || !t.sawUsage) {
			t.sawUsage = true
			t.usageOut = c.CompletionTokens
		}
	}
	if c.CachedTokens > 0 {
		rec.CachedTokens = c.CachedTokens
	}
	if c.Engine.Known != 0 {
		mergeEngine(&rec.Engine, c.Engine)
	}
	if t.col != nil && (c.ChoicesData != nil || c.Index != 0) {
		t.col.SetMulti()
	}
	if c.ChoicesData != nil { // several choices in one payload: each its own
		t.eachChoice(c, at)
	} else {
		t.applyChoice(c, at)
	}
	if c.Done {
		t.done = true
		rec.Terminal = at
	}
}

// applyChoice folds what one choice of a payload said (the payload's
// only choice, or every format's payload, which has none) into the
// record: its finish reason and its token event.
func (t *tap) applyChoice(c *stream.Chunk, at time.Time) {
	rec := t.st.rec
	split := c.Choices > 0 && t.choice(c.Index)
	switch {
	case len(c.FinishReason) == 0:
	case split:
		t.finishChoice(c.FinishReason)
	case rec.FinishReason != string(c.FinishReason):
		rec.FinishReason = string(c.FinishReason)
	}
	if c.TokenBearing() && t.kind.streamed() {
		switch c.TokensFrom {
		case stream.SourceTokenIDs:
			t.idTokens += c.Tokens
		case stream.SourceLogprobs:
			t.idTokens += c.Tokens
		default:
			t.perEventAll = false
		}
		if c.TokensFrom > t.tokensFrom {
			t.tokensFrom = c.TokensFrom
		}
		t.st.obs.Tokens(max(c.Tokens, 1))
		var gap time.Duration
		var ok bool
		if split {
			gap, ok = rec.AddChoiceToken(t.ch.slot, at, c.Tokens, c.Output)
		} else {
			gap, ok = rec.AddToken(at, c.Tokens, c.Output)
		}
		if ok {
			t.st.obs.Gap(gap)
		}
		if !t.sawToken { // once per request: the slow causes' registry
			t.sawToken = true
			t.st.obs.FirstToken(at)
		}
	}
}

// mergeEngine copies the durations the engine reported into the record's.
func mergeEngine(dst *record.EngineTimes, src stream.EngineTimes) {
	(*stream.EngineTimes)(dst).Merge(&src)
}

// an uncompressed answer: "identity;q=0", or "*;q=0" without identity
// named. Only such a client gets no usage injection: the engine is asked
// for identity when usage is injected (docs/design.md, "Exact token
// counts without changing the client's bytes", Compression).
func refusesIdentity(h http.Header) bool {
	star := false
	for _, v := range h.Values("Accept-Encoding") {
		for item := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(item, ";")
			coding = strings.TrimSpace(coding)
			switch {
			case strings.EqualFold(coding, "identity"):
				return qZero(params)
			case coding == "*":
				star = qZero(params)
			}
		}
	}
	return star
}

// qZero reports whether Accept-Encoding parameters give q=0.
func qZero(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && q == 0
		}
	}
	return false
}

// Close parses what is left and closes the upstream body.
func (t *tap) Close() error {
	if !t.closed {
		t.closed = true
		t.afterForward()
		if !t.failed && t.kind.streamed() && t.eof && !t.finished {
			func() {
				defer t.recoverTap()
				t.finished = true
				if t.kind == bodyNDJSON {
					t.lines.Finish(t.onEv)
				} else {
					t.framer.Finish(t.onEv)
				}
			}()
		}
		t.afterForward()
		if !t.failed && t.kind == bodyJSON && t.eof && !t.wholeOver && len(t.whole) > 0 {
			func() {
				defer t.recoverTap()
				stream.ParseCollect(t.format, t.whole, &t.chunk, t.col)
				if t.chunk.Malformed {
					t.st.rec.Malformed = true
					return
				}
				at := t.readErrAt
				c := &t.chunk
				t.empty = !c.Error && !c.Output && !c.Reasoning && len(c.FinishReason) == 0 && !c.Usage && !c.HasPrompt && !c.Done
				t.apply(c, at)
				if t.needModel {
					t.modelFromResponse()
				}
			}()
		}
	}
	return t.body.Close()
}
