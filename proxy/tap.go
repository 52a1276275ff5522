package proxy

import (
	"bytes"
	"encoding/json"
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
//
// Strip mode gives up on what it cannot do safely, and says so: it then
// forwards everything it holds, unchanged, and reads the rest of the
// response in pass-through mode (events still timed; only the usage event
// is no longer removed), recording the reason in Record.TapFailed and
// counting it (Observation.TapFailed). The reasons:
//
//   - "strip_overflow": an incomplete event grew past stripHoldMax. Engine
//     events are a few hundred bytes; an upstream that sends line after
//     line without the blank line that ends an event (a flood of ":"
//     comments, or no SSE at all) would otherwise be held without bound,
//     in memory and away from the client.
//   - "single_lf_framing": the engine separates its events with a single
//     line ending ("data: {...}\ndata: {...}\n"). See scanPending.
//
// A compressed body cannot be framed at all: when it injects usage, the
// sidecar asks the engine for identity, and it injects for every client
// that does not refuse identity (refusesIdentity), gzip-asking ones
// included; an engine that compresses anyway gets an opaque tap
// (TapFailed "content_encoding", set by modifyResponse), and its usage
// chunk reaches the client: the one case in which an injected usage
// chunk cannot be removed.
type tap struct {
	body   io.ReadCloser
	st     *reqState
	kind   bodyKind
	format stream.Format // which adapter reads the payloads
	strip  bool

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
	done        bool // end marker seen
	streamErr   bool // error event seen
	rejection   bool // ... and it was an overload
	sawUsage    bool
	usageOut    int64
	sawPrompt   bool
	hdrOut      int64              // TGI's x-generated-tokens header, -1 if absent
	idTokens    int64              // per-event token counts summed
	tokensFrom  stream.TokenSource // weakest per-event source seen; None if some event had none
	perEventAll bool
	ch          choiceTrack // the response's choices (choices.go)
}

type queued struct {
	at         time.Time
	start, end int
	hasData    bool
}

func newTap(body io.ReadCloser, st *reqState, kind bodyKind, format stream.Format, strip bool, wholeMax int) *tap {
	t := &tap{body: body, st: st, kind: kind, format: format, strip: strip, cutLF: -1, gaveUpAt: -1, ls: lineScan{rel: -1},
		wholeMax: wholeMax, perEventAll: true, hdrOut: -1}
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

// readPass is Read in pass-through mode.
func (t *tap) readPass(p []byte) (int, error) {
	t.afterForward()
	n, err := t.body.Read(p)
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

// giveUp stops strip mode from cutting anything at or after stream offset
// at (the start of the event it could not deal with) and degrades it to
// pass-through: frameStrip forwards everything held at the end of the
// read, unchanged, and readStrip reads on in pass-through mode. Events are
// still framed and timed.
func (t *tap) giveUp(reason string, at int64) {
	t.degraded = true
	t.gaveUpAt = at
	t.gaveUp(reason)
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
	stream.Parse(t.format, ev.Data, c)
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
		t.finishChoice(c.Index, c.FinishReason)
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
	}
}

// mergeEngine copies the durations the engine reported into the record's.
func mergeEngine(dst *record.EngineTimes, src stream.EngineTimes) {
	(*stream.EngineTimes)(dst).Merge(&src)
}

// stripHoldMax bounds the bytes of an incomplete event that strip mode
// holds back from the client (64 KiB). A read adds at most one copy
// buffer (copyBufSize) before the check, so the tap never
// holds more than stripHoldMax plus one read. Engine events are a few
// hundred bytes; one larger than this (a huge logprobs chunk, or a stream
// that never ends its events) makes strip mode give up ("strip_overflow"):
// its bytes are forwarded as they are, the rest of the response is passed
// through, and a usage chunk in it reaches the client.
const stripHoldMax = 64 << 10

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
	if t.failed || t.degraded { // fell back to pass-through forwarding
		return t.readPass(p)
	}
	t.afterForward()
	if t.failed { // parsing failed: what was held is in out
		return t.readStrip(p)
	}
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
		if t.outPos < len(t.out) || t.outErr != nil || t.failed || t.degraded {
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
	t.countOversized(t.framer.Oversized)
	upto := t.framer.PendingStart()
	if !t.degraded {
		if t.scanPending() {
			t.giveUp("single_lf_framing", upto)
		} else if t.ls.rel > upto {
			upto = t.ls.rel // complete lines that can no longer be cut
		}
	}
	t.release(upto)
	if !t.degraded && len(t.held) > stripHoldMax {
		t.giveUp("strip_overflow", t.framer.PendingStart())
	}
	if t.degraded { // forward the rest as it is
		t.out = append(t.out, t.held...)
		t.held = nil
	}
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

var usageKey = []byte(`"usage"`)

// frameForStrip sees each complete event before it is forwarded. Only an
// event that may be the injected usage chunk is parsed here; every other
// event is queued and parsed after it was forwarded.
func (t *tap) frameForStrip(ev *stream.Event) {
	if !t.degraded && ev.HasData {
		if i := bytes.IndexByte(ev.Data, '\n'); i >= 0 && jsonObject(ev.Data[:i]) {
			// A second data line after one that carried a whole JSON
			// object, all in one read: single-LF framing (scanPending).
			t.giveUp("single_lf_framing", ev.Start)
		} else if !ev.Partial && ev.Start >= t.heldOff && bytes.Contains(ev.Data, usageKey) {
			var c stream.Chunk
			stream.ParseOpenAI(ev.Data, &c)
			switch {
			case c.UsageOnly():
				t.cuts = append(t.cuts, [2]int64{ev.Start, ev.End})
				if t.framer.AfterCR() && ev.End == t.framer.Offset() {
					t.cutLF = ev.End // maybe the CR of a CRLF split across reads
				}
				rec := t.st.rec
				rec.Events++
				t.apply(&c, t.readAt)
				return
			case addedUsage(&c), c.Choices > 0 && nullUsage(ev.Data):
				t.cutUsageMember(ev)
			}
		}
	}
	start := len(t.qdata)
	t.qdata = append(t.qdata, ev.Data...)
	t.queue = append(t.queue, queued{at: t.readAt, start: start, end: len(t.qdata), hasData: ev.HasData})
}

// lineScan follows the lines of the incomplete event that strip mode
// holds, for scanPending.
type lineScan struct {
	ev   int64 // stream offset of the event followed (the framer's PendingStart)
	line int64 // offset of the current line's first byte
	scan int64 // offset of the next byte to look at for a line end
	cr   bool  // the last line ended in a CR that ended the read: an LF next completes it
	data bool  // the event has a data line
	json bool  // ... its first, and that line carries a whole JSON object
	ok   bool  // ... that is not a usage chunk
	rel  int64 // once ok: the end of the event's last complete line; else -1
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// scanPending reads the complete lines of the event left incomplete at the
// end of a read (the bytes held from the framer's PendingStart on; each
// byte is looked at once). It reports whether that event shows single-LF
// framing, and sets t.ls.rel to the end of its last complete line when
// those lines may be forwarded before the event ends.
//
// Design note: single-LF framing. Some engines end each event with one
// line ending instead of a blank line: "data: {...}\ndata: {...}\n". To
// SSE that is a single event that never ends, so strip mode, holding
// incomplete events back, would hold the whole stream. Two rules, both
// decided on the bytes alone (the same whatever the read boundaries, so
// the client's bytes do not depend on the network):
//
//  1. Early release. Once the held event has a complete data line whose
//     value is a whole JSON object that is not a usage chunk, its complete
//     lines are forwarded at once: that data line is the event's first, so
//     the event can only become a usage chunk by gaining another data
//     line, and rule 2 stops cutting before that. The first event of a
//     single-LF stream thus reaches the client as soon as its line ends.
//  2. Give up. A data line that follows, in the same event, a data line
//     carrying a whole JSON object is single-LF framing (an engine does not
//     split one JSON chunk over data lines that way): strip mode gives up
//     ("single_lf_framing") from the start of that event, forwards what it
//     holds and passes the rest through, usage chunk included.
//
// Why not strip in single-LF streams too, treating each line as an event?
// That would cut bytes out of a stream on a guess about its framing, and
// SSE clients that follow the specification see such a stream as one
// event anyway; timing would still see one event (the framer follows the
// specification). Giving up keeps every byte the engine sent, costs the
// client one usage chunk it did not ask for, and is counted
// (tokentap_tap_failures_total{reason="single_lf_framing"}) so that the
// operator can turn usage injection off for that engine. A blank-line
// framed stream of one-line events (what engines send) never meets rule
// 2, and rule 1 only forwards earlier bytes it would have forwarded
// anyway: its output is byte-identical, its usage event still cut.
func (t *tap) scanPending() bool {
	ls := &t.ls
	if ps := t.framer.PendingStart(); ps != ls.ev {
		*ls = lineScan{ev: ps, line: ps, scan: ps, rel: -1}
	}
	end := t.heldOff + int64(len(t.held)) // == t.framer.Offset()
	for ls.scan < end {
		rest := t.held[ls.scan-t.heldOff:]
		if ls.cr {
			ls.cr = false
			if rest[0] == '\n' { // second half of a CRLF
				ls.scan++
				ls.line = ls.scan
				if ls.ok {
					ls.rel = ls.scan
				}
				continue
			}
		}
		i := bytes.IndexAny(rest, "\r\n")
		if i < 0 {
			ls.scan = end
			break
		}
		eol := ls.scan + int64(i)
		next := eol + 1
		if rest[i] == '\r' {
			if i+1 == len(rest) {
				ls.cr = true
			} else if rest[i+1] == '\n' {
				next++
			}
		}
		if t.scanLine(t.held[ls.line-t.heldOff : eol-t.heldOff]) {
			return true
		}
		ls.line, ls.scan = next, next
		if ls.ok {
			ls.rel = next
		}
	}
	if ls.json { // rule 2 as soon as the next data field shows
		cur := t.held[ls.line-t.heldOff:]
		return len(cur) >= 5 && string(cur[:5]) == "data:"
	}
	return false
}

// scanLine reads one complete line of the held event, as the framer does
// (stream.Framer.processLine), and reports rule 2 of scanPending.
func (t *tap) scanLine(line []byte) bool {
	ls := &t.ls
	if ls.line == 0 {
		line = bytes.TrimPrefix(line, utf8BOM)
	}
	if len(line) == 0 || line[0] == ':' {
		return false
	}
	field, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	if string(field) != "data" {
		return false
	}
	if ls.data {
		return ls.json
	}
	ls.data = true
	ls.json = jsonObject(value)
	ls.ok = ls.json && !t.usageChunk(value)
	return false
}

// usageChunk reports whether data, as an event's data, is something
// frameForStrip cuts: the usage chunk, or a usage member on a chunk.
func (t *tap) usageChunk(data []byte) bool {
	if !bytes.Contains(data, usageKey) {
		return false
	}
	var c stream.Chunk
	stream.ParseOpenAI(data, &c)
	return c.UsageOnly() || addedUsage(&c) || (c.Choices > 0 && nullUsage(data))
}

// nullUsage reports whether a chunk's top-level "usage" member is null.
// OpenAI's own API puts "usage":null on every chunk once include_usage
// is asked for, and only then: in strip mode the sidecar asked, so the
// member is the sidecar's doing and is cut like the usage chunk (a client
// that asked for usage itself is not in strip mode and sees it).
func nullUsage(data []byte) bool {
	s, e, ok := stream.MemberSpan(data, "usage")
	if !ok {
		return false
	}
	m := bytes.TrimSpace(data[s:e])
	m = bytes.TrimSuffix(bytes.TrimPrefix(m, []byte(",")), []byte(","))
	_, v, ok := bytes.Cut(m, []byte(":"))
	return ok && bytes.Equal(bytes.TrimSpace(v), []byte("null"))
}

// addedUsage reports whether a chunk is a content chunk with a usage
// object (numbers, not null) that asking for usage put there: Ollama's
// completions add "usage":{zeros} to every chunk when include_usage is
// set (middleware/openai.go CompleteWriter), and vLLM's
// continuous_usage_stats puts the running count on every chunk once
// include_usage is on. Without the sidecar's request the member would
// not be there, so strip mode removes it and leaves the rest of the
// chunk byte for byte. A "usage":null is cut too (nullUsage).
func addedUsage(c *stream.Chunk) bool {
	return (c.Usage || c.HasPrompt) && c.Choices > 0 && !c.Error
}

// cutUsageMember removes the "usage" member from the event's data in the
// client's stream (strip mode; the event is complete and still held).
// The data must be one line: a member of a multi-line data value is not
// contiguous in the stream, and is left where it is.
func (t *tap) cutUsageMember(ev *stream.Event) {
	if bytes.IndexByte(ev.Data, '\n') >= 0 {
		return
	}
	raw := t.held[ev.Start-t.heldOff : ev.End-t.heldOff]
	off, ok := dataOffset(raw, ev.Start == 0)
	if !ok || off+len(ev.Data) > len(raw) || !bytes.Equal(raw[off:off+len(ev.Data)], ev.Data) {
		return
	}
	s, e, ok := stream.MemberSpan(ev.Data, "usage")
	if !ok {
		return
	}
	at := ev.Start + int64(off)
	t.cuts = append(t.cuts, [2]int64{at + int64(s), at + int64(e)})
}

// dataOffset returns the offset of the value of the event's data line in
// its raw bytes (after "data:" and the optional space), as the framer
// reads it.
func dataOffset(raw []byte, streamStart bool) (int, bool) {
	i := 0
	if streamStart && bytes.HasPrefix(raw, utf8BOM) {
		i = len(utf8BOM)
	}
	for i < len(raw) {
		j := bytes.IndexAny(raw[i:], "\r\n")
		if j < 0 {
			j = len(raw) - i
		}
		line := raw[i : i+j]
		if len(line) > 4 && string(line[:5]) == "data:" {
			off := i + 5
			if len(line) > 5 && line[5] == ' ' {
				off++
			}
			return off, true
		}
		i += j
		if i < len(raw) && raw[i] == '\r' {
			i++
		}
		if i < len(raw) && raw[i] == '\n' {
			i++
		}
	}
	return 0, false
}

// jsonObject reports whether v is one whole JSON object (white space after
// it allowed).
func jsonObject(v []byte) bool {
	return len(v) > 0 && v[0] == '{' && json.Valid(v)
}

// finishStrip releases everything at the end of the body, a trailing
// partial event included (it is never cut).
func (t *tap) finishStrip() {
	if !t.failed {
		func() {
			defer t.recoverTap()
			t.finished = true
			t.framer.Finish(t.onCut)
		}()
	}
	if !t.failed {
		t.release(t.heldOff + int64(len(t.held)))
	}
	t.out = append(t.out, t.held...)
	t.held = t.held[:0]
}

// refusesIdentity reports whether a request's Accept-Encoding refuses
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
				stream.Parse(t.format, t.whole, &t.chunk)
				if t.chunk.Malformed {
					t.st.rec.Malformed = true
					return
				}
				at := t.readErrAt
				t.apply(&t.chunk, at)
				if t.needModel {
					t.modelFromResponse()
				}
			}()
		}
	}
	return t.body.Close()
}
