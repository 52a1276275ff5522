package proxy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Strip mode: the sidecar injected stream_options.include_usage and
// removes what the engine sends because of it from the client's stream
// (docs/design.md, "Exact token counts without changing the client's
// bytes", and its "Strip mode" section for the rules below). Each read is
// framed before it is forwarded, in the caller's buffer; only the bytes
// of an event that could still have something cut are held back: an
// event's leading comment lines never are, and an event whose first data
// line begins with a non-empty "choices" array (a content chunk, never
// the usage chunk) is forwarded as it comes, less what could be its
// usage member. The usage chunk and added usage members are cut; the
// forwarded events are parsed after they were written, as in
// pass-through mode. Where it cannot strip safely, strip mode gives up
// (giveUp) with a reason: "single_lf_framing" (scanPending); an event it
// cannot decide within stripHoldMax is forwarded unchanged and counted
// ("strip_overflow"), stripping going on with the next one. A compressed
// body is never framed: modifyResponse gives it an opaque tap
// ("content_encoding").

// stripHoldMax bounds the bytes held back of one event (64 KiB; a read
// adds at most copyBufSize before the check). An event still undecided
// past it is forwarded unchanged, counted as "strip_overflow".
const stripHoldMax = 64 << 10

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
	if !t.looped {
		t.afterForward()
		if t.failed { // parsing failed: what was held is in out
			return t.readStrip(p)
		}
	}
	for {
		n, err := t.body.Read(p)
		if err == errAgain { // a loop's feed has nothing more yet: what it gave is held
			return 0, err
		}
		at := t.now()
		w := 0
		if n > 0 {
			t.firstByte(at)
			t.keep(p[:n])
			w = t.frameStrip(p, n, at)
		}
		if err != nil {
			t.noteErr(err, at)
			t.finishStrip()
			t.outErr = err
		}
		if w > 0 { // forwarded in place; out and outErr follow
			return w, nil
		}
		if t.outPos < len(t.out) || t.outErr != nil || t.failed || t.degraded {
			return t.readStrip(p)
		}
		// everything read so far is held: read on
	}
}

// frameStrip frames the read p[:n], decides what may be forwarded and
// returns how many bytes of it to forward from p[:w]. When nothing was
// held before it, the read is framed and compacted where it lies (the
// common case: no copy); otherwise it is added to what is held and the
// forwardable bytes go to t.out. The caller's buffer is never kept: what
// stays held is copied into the tap's own.
func (t *tap) frameStrip(p []byte, n int, at time.Time) int {
	inPlace := len(t.held) == 0
	if inPlace {
		t.held, t.emitTo, t.emitN = p[:n], p, 0
	} else {
		t.held = append(t.held, p[:n]...)
	}
	t.frameHeld(p[:n], at)
	w := t.emitN
	if inPlace {
		t.hbuf = append(t.hbuf[:0], t.held...)
		t.held, t.emitTo, t.emitN = t.hbuf, nil, 0
	} else if t.held != nil {
		t.hbuf = t.held[:0]
	}
	return w
}

// frameHeld frames b, the newest bytes of t.held, and releases what may
// be forwarded.
func (t *tap) frameHeld(b []byte, at time.Time) {
	defer t.recoverTap()
	t.readAt = at
	t.framer.Feed(b, t.onCut)
	t.countOversized(t.framer.Oversized)
	upto := t.framer.PendingStart()
	if !t.degraded {
		if t.scanPending() {
			t.giveUp("single_lf_framing", upto)
		} else if t.ls.rel > upto {
			upto = t.ls.rel // bytes of the held event that can no longer be cut
		}
	}
	t.release(upto)
	if !t.degraded && len(t.held) > stripHoldMax {
		// The held event is undecided past the bound: forward it as it
		// is, and strip again from the next one.
		t.ls.all, t.ls.passed, t.ls.relData = true, true, true
		t.gaveUp("strip_overflow")
		t.release(t.heldOff + int64(len(t.held)))
	}
	if t.degraded { // forward the rest as it is
		t.emit(t.held)
		t.held = t.held[:0]
		t.heldOff = t.framer.Offset()
	}
}

// emit forwards b: into the caller's buffer after what frameStrip put
// there (b lies in that buffer, at or after that point), or to t.out.
// Bytes already where they go (nothing was cut before them in this read:
// every content chunk) are not copied onto themselves.
func (t *tap) emit(b []byte) {
	switch {
	case len(b) == 0:
	case t.emitTo == nil:
		t.out = append(t.out, b...)
	case &b[0] == &t.emitTo[t.emitN]:
		t.emitN += len(b)
	default:
		t.emitN += copy(t.emitTo[t.emitN:], b)
	}
}

// release forwards held bytes before stream offset upto, minus cuts.
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
			t.emit(t.held[from-t.heldOff : c[0]-t.heldOff])
		}
		from = max(from, c[1])
	}
	if upto > from {
		t.emit(t.held[from-t.heldOff : upto-t.heldOff])
	}
	t.cuts = t.cuts[:0]
	k := upto - t.heldOff
	if t.emitTo != nil { // the caller's buffer: its front now holds what was forwarded
		t.held = t.held[k:]
	} else {
		t.held = t.held[:copy(t.held, t.held[k:])]
	}
	t.heldOff = upto
}

// frameForStrip sees each complete event before it is forwarded. Only an
// event that may be the injected usage chunk is parsed here; every other
// event is queued and parsed after it was forwarded.
func (t *tap) frameForStrip(ev *stream.Event) {
	if !t.degraded && ev.HasData {
		if i := bytes.IndexByte(ev.Data, '\n'); i >= 0 && firstLineJSON(t.usage, ev.Data[:i]) {
			// A second data line after one that carried a JSON object,
			// all in one read: single-LF framing (scanPending).
			t.giveUp("single_lf_framing", ev.Start)
		} else if !ev.Partial && bytes.Contains(ev.Data, t.usage.ReplyKey()) {
			c := t.parseStrip(ev.Data)
			switch {
			case c.UsageOnly():
				if from, ok := t.cutFrom(ev); ok {
					t.cuts = append(t.cuts, [2]int64{from, ev.End})
					if t.framer.AfterCR() && ev.End == t.framer.Offset() {
						t.cutLF = ev.End // maybe the CR of a CRLF split across reads
					}
					rec := t.st.rec
					rec.Events++
					t.apply(c, t.readAt)
					return
				}
			case addedUsage(c), c.Choices > 0 && nullUsage(t.usage, ev.Data):
				t.cutUsageMember(ev)
			}
		}
	}
	start := len(t.qdata)
	t.qdata = append(t.qdata, ev.Data...)
	t.queue = append(t.queue, queued{at: t.readAt, start: start, end: len(t.qdata), hasData: ev.HasData})
}

// cutFrom returns where the cut of a usage-only event starts: after its
// leading comment lines (forwarded as they came, whether or not they were
// yet), and whether it may be cut at all: not when more than those lines
// was forwarded already, nor when its first data line begins a content
// chunk (firstLineJSON's rule: the bytes decide, not the reads).
func (t *tap) cutFrom(ev *stream.Event) (int64, bool) {
	first, _, _ := bytes.Cut(ev.Data, []byte{'\n'})
	if contentPrefix(t.usage, first) {
		return 0, false
	}
	if ev.Start >= t.heldOff {
		raw := t.held[ev.Start-t.heldOff : ev.End-t.heldOff]
		return ev.Start + int64(commentPrefix(raw, false, ev.Start == 0)), true
	}
	ls := &t.ls
	if ls.ev != ev.Start || ls.relData || ls.line < t.heldOff {
		return 0, false
	}
	// What was forwarded of the event is some of its leading comment
	// lines, up to heldOff (a line start; after a CR whose LF may come
	// next when the current line starts there too). The cut starts after
	// the comment lines held from there: not at the current line, which a
	// read that ended between the data line's end and the blank line
	// after it has moved past the data line (FuzzTapStrip: the usage
	// chunk was forwarded whole, its blank line cut).
	raw := t.held[:ev.End-t.heldOff]
	return t.heldOff + int64(commentPrefix(raw, ls.cr && ls.line == t.heldOff, t.heldOff == 0)), true
}

// commentPrefix returns the length of the comment lines that raw, the
// bytes of an event from a line start, begins with (after the stream's
// BOM when bom; after the LF of a CRLF whose CR came before raw when lf).
func commentPrefix(raw []byte, lf, bom bool) int {
	i := 0
	if bom && bytes.HasPrefix(raw, utf8BOM) {
		i = len(utf8BOM)
	}
	if lf && i < len(raw) && raw[i] == '\n' {
		i++
	}
	for i < len(raw) && raw[i] == ':' {
		j := bytes.IndexAny(raw[i:], "\r\n")
		if j < 0 {
			break
		}
		i += j + 1
		if raw[i-1] == '\r' && i < len(raw) && raw[i] == '\n' {
			i++
		}
	}
	return i
}

// firstLineJSON reports whether the first data line of an event makes a
// data line after it single-LF framing (scanPending, rule 2): a whole
// JSON object, or the beginning of a content chunk (contentPrefix).
func firstLineJSON(u *stream.UsageOption, v []byte) bool {
	return jsonObject(v) || contentPrefix(u, v)
}

// contentPrefix reports whether v, a data line's value, begins a JSON
// object whose first top-level "choices" member is a non-empty array: a
// content chunk, never the usage-only chunk (docs/design.md, "Strip
// mode"). It reads v as scanPending reads it arriving.
func contentPrefix(u *stream.UsageOption, v []byte) bool {
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	j := jsonPrefix{u: u, key: -1}
	j.feed(v, 0, 0, int64(len(v)))
	return j.choices == choicesSome
}

// jsonPrefix follows a JSON object as its bytes arrive (each byte looked
// at once) far enough to decide whether it is a content chunk: its
// top-level members until the first element of its first "choices"
// member. After that it only looks for the first "usage" key, anywhere
// (a vectorised search): the bytes before it can no longer be cut, those
// from the end of the value before it on may be (MemberSpan's cut of a
// top-level usage member starts there; a nested one is held all the
// same). It does not validate: the rules built on it depend on the bytes
// alone, and the cuts themselves are decided by the parser on the whole
// event.
type jsonPrefix struct {
	u        *stream.UsageOption // the API's usage request: its Content and Reply members
	on       bool                // following the held event's first data line
	start    int64               // stream offset of the value's '{'
	depth    int
	str, esc bool
	key      int64 // offset of the opening quote of the top-level key being read; -1 when none
	member   byte  // the current top-level member's key: 'c' choices, 'u' usage, 0 another
	inVal    bool  // between a top-level member's ':' and the ',' or '}' after its value
	choices  byte  // choicesNone until the first top-level "choices" member shows
	sig      int64 // offset after the last byte that was not white space
	valEnd   int64 // offset after the last complete top-level value (after '{' first)
	frozen   bool  // a "usage" key began: nothing from valEnd on is released
	rel      int64 // once a content chunk: the bytes before rel can no longer be cut
}

const (
	choicesNone  = iota
	choicesColon // after "choices":, awaiting '['
	choicesOpen  // after '[', awaiting the first element
	choicesSome  // a non-empty array: a content chunk
	choicesOther // empty, or not an array
)

// feed reads buf[from-off : to-off] (buf starts at stream offset off and
// holds the object's bytes from the start of the key being read, and
// the last len(ReplyKey())-1 bytes before from).
func (j *jsonPrefix) feed(buf []byte, off, from, to int64) {
	for i := from; i < to; i++ {
		if j.choices == choicesSome {
			j.findUsage(buf, off, i, to)
			return
		}
		c := buf[i-off]
		if j.str {
			switch {
			case j.esc:
				j.esc = false
			case c == '\\':
				j.esc = true
			case c == '"':
				j.str = false
				if j.key >= 0 {
					switch k := buf[j.key+1-off : i-off]; {
					case string(k) == j.u.Content:
						j.member = 'c'
					case string(k) == j.u.Reply:
						j.member = 'u'
					}
					j.key = -1
				}
			}
			j.sig = i + 1
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		switch j.choices {
		case choicesColon:
			j.choices = choicesOther
			if c == '[' {
				j.choices = choicesOpen
			}
		case choicesOpen:
			j.choices = choicesSome
			if c == ']' {
				j.choices = choicesOther
			}
		}
		switch c {
		case '"':
			j.str = true
			if j.depth == 1 && !j.inVal {
				j.key = i
			}
		case '{', '[':
			if j.depth == 0 {
				j.valEnd = i + 1
			}
			j.depth++
		case '}', ']':
			j.depth--
		case ':':
			if j.depth == 1 && !j.inVal {
				j.inVal = true
				switch {
				case j.member == 'c' && j.choices == choicesNone:
					j.choices = choicesColon
				case j.member == 'u':
					j.frozen = true
				}
			}
		case ',':
			if j.depth == 1 {
				j.inVal, j.member = false, 0
				if !j.frozen {
					j.valEnd = j.sig
				}
			}
		}
		j.sig = i + 1
		if j.choices == choicesSome {
			j.rel = i // the first element's first byte is read again by findUsage
			if j.frozen {
				j.rel = j.valEnd
			}
		}
	}
}

// findUsage looks for the first "usage" key in a content chunk's bytes
// [from, to), and sets what can be released: up to the end of the value
// before it, or up to where a "usage" key that the next bytes complete
// could start.
func (j *jsonPrefix) findUsage(buf []byte, off, from, to int64) {
	if j.frozen {
		return
	}
	key := j.u.ReplyKey()
	at := max(from-int64(len(key)-1), j.rel, j.start) // a key split across reads
	if k := bytes.Index(buf[at-off:to-off], key); k >= 0 {
		j.frozen = true
		j.valEnd = memberStart(buf, off, at+int64(k), j.rel)
		j.rel = j.valEnd
		return
	}
	j.rel = memberStart(buf, off, max(to-int64(len(key)-1), j.rel), j.rel)
}

// memberStart returns where a member whose key begins at k starts for
// MemberSpan (after the previous value's last byte): k less the white
// space and commas before it, not before floor.
func memberStart(buf []byte, off, k, floor int64) int64 {
	for k > floor {
		switch buf[k-1-off] {
		case ' ', '\t', '\r', '\n', ',':
			k--
			continue
		}
		break
	}
	return k
}

// safe returns the stream offset before which the object's bytes can no
// longer be cut, or -1 while it may still be the usage chunk.
func (j *jsonPrefix) safe() int64 {
	switch {
	case j.choices != choicesSome:
		return -1
	case j.frozen:
		return min(j.valEnd, j.rel)
	}
	return j.rel
}

// lineScan follows the lines of the incomplete event that strip mode
// holds, for scanPending.
type lineScan struct {
	ev      int64 // stream offset of the event followed (the framer's PendingStart)
	line    int64 // offset of the current line's first byte
	scan    int64 // offset of the next byte to look at for a line end
	cr      bool  // the last line ended in a CR that ended the read: an LF next completes it
	fields  bool  // the event has a line that is not a comment
	data    bool  // ... a data line
	json    bool  // ... its first, and that line is one firstLineJSON accepts
	ok      bool  // ... and nothing after that line can be cut: its complete lines are forwarded
	all     bool  // every byte of the event is forwarded as it comes: its data is no JSON object, or it passed the hold bound
	passed  bool  // ... the latter ("strip_overflow")
	js      jsonPrefix
	rel     int64 // the event's bytes before rel can no longer be cut
	relData bool  // rel is past the event's leading comment lines: the event is never cut whole
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// scanPending reads the lines of the event left incomplete at the end of
// a read (the bytes held from the framer's PendingStart on; each byte is
// looked at once). It reports whether that event shows single-LF framing
// (rule 2), and sets t.ls.rel to the end of what of it may be forwarded
// before the event ends (rule 1).
//
// Single-LF framing ("data: {...}\ndata: {...}\n") is, to SSE, one event
// that never ends. The rules are decided on the bytes alone, so the
// client's bytes do not depend on read boundaries (docs/design.md, "Strip
// mode"):
//
//  1. Early release: the event's leading comment lines are forwarded once
//     complete; so is a first data line that is a whole JSON object and
//     not a usage chunk, and the lines after it; a first data line that
//     begins a content chunk (contentPrefix) is forwarded as it arrives,
//     up to its first top-level "usage" member; an event whose data is
//     not a JSON object is forwarded as it arrives.
//  2. Give up: a data line after a first one that firstLineJSON accepts,
//     in the same event, is single-LF framing: strip mode gives up from
//     the start of the event.
func (t *tap) scanPending() bool {
	ls := &t.ls
	if ps := t.framer.PendingStart(); ps != ls.ev {
		*ls = lineScan{ev: ps, line: ps, scan: ps, rel: ps}
	}
	end := t.heldOff + int64(len(t.held)) // == t.framer.Offset()
	for ls.scan < end && !ls.all {
		rest := t.held[ls.scan-t.heldOff:]
		if ls.cr {
			ls.cr = false
			if rest[0] == '\n' { // second half of a CRLF
				ls.scan++
				ls.line = ls.scan
				t.lineReleased()
				continue
			}
		}
		i := bytes.IndexAny(rest, "\r\n")
		if ls.js.on {
			to := end
			if i >= 0 {
				to = ls.scan + int64(i)
			}
			ls.js.feed(t.held, t.heldOff, ls.scan, to)
		}
		if i < 0 {
			ls.scan = end
			if !ls.js.on && !ls.data {
				t.firstData(end)
			}
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
		if ls.js.on {
			t.endFirstData(eol)
		} else if t.scanLine(t.held[ls.line-t.heldOff : eol-t.heldOff]) {
			return true
		}
		ls.line, ls.scan = next, next
		t.lineReleased()
	}
	switch {
	case ls.all:
		ls.rel, ls.relData = end, true
	case ls.js.on:
		if s := ls.js.safe(); s > ls.rel {
			ls.rel, ls.relData = s, true
		}
	case ls.json && ls.line >= t.heldOff: // rule 2 as soon as the next data field shows
		cur := t.held[ls.line-t.heldOff:]
		return len(cur) >= 5 && string(cur[:5]) == "data:"
	}
	return false
}

// lineReleased moves the release point to the current line's start when
// the lines before it may be forwarded: comment lines before any other,
// or every line after a first data line that rule 1 releases.
func (t *tap) lineReleased() {
	ls := &t.ls
	switch {
	case ls.ok:
		ls.rel, ls.relData = ls.line, true
	case !ls.fields:
		ls.rel = ls.line
	}
}

// firstData looks at the incomplete line of the held event that ends at
// end, when the event has no data line yet: a data line whose value
// begins with '{' is followed as it arrives (jsonPrefix); one whose value
// begins with anything but white space carries no JSON object, nothing
// of the event can be cut, and it is forwarded as it comes.
func (t *tap) firstData(end int64) {
	ls := &t.ls
	line := t.held[ls.line-t.heldOff : end-t.heldOff]
	lineOff := ls.line
	if ls.line == 0 && bytes.HasPrefix(line, utf8BOM) {
		line, lineOff = line[len(utf8BOM):], lineOff+int64(len(utf8BOM))
	}
	v := 5
	if len(line) < v || string(line[:v]) != "data:" {
		return
	}
	if len(line) > v && line[v] == ' ' {
		v++
	}
	if len(line) <= v {
		return
	}
	ls.fields = true
	switch line[v] {
	case '{':
		start := lineOff + int64(v)
		ls.js = jsonPrefix{u: t.usage, on: true, start: start, key: -1}
		ls.js.feed(t.held, t.heldOff, start, end)
	case ' ', '\t':
	default:
		ls.all = true
	}
}

// endFirstData ends the first data line of the held event, followed by
// jsonPrefix since it was incomplete, at eol.
func (t *tap) endFirstData(eol int64) {
	ls := &t.ls
	ls.js.on = false
	ls.data = true
	content := ls.js.choices == choicesSome
	if ls.line >= t.heldOff { // held whole: rule 1 as scanLine reads it
		v := t.held[ls.js.start-t.heldOff : eol-t.heldOff]
		whole := jsonObject(v)
		ls.json = content || whole
		ls.ok = (content && !ls.js.frozen) || (whole && !t.usageChunk(v))
		return
	}
	ls.json = true // content: only such a line is forwarded before it ends
	ls.ok = !ls.js.frozen
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
	ls.fields = true
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
	whole := jsonObject(value)
	content, frozen := false, false
	if len(value) > 0 && value[0] == '{' {
		j := jsonPrefix{u: t.usage, key: -1}
		j.feed(value, 0, 0, int64(len(value)))
		content, frozen = j.choices == choicesSome, j.frozen
	}
	ls.json = whole || content
	ls.ok = (content && !frozen) || (whole && !t.usageChunk(value))
	return false
}

// parseStrip parses an event's data that strip mode must decide on with
// the API's parser, into the tap's own chunk (an indirect call would make
// a local one escape: an allocation per event).
func (t *tap) parseStrip(data []byte) *stream.Chunk {
	t.stripChunk = stream.Chunk{}
	stream.Parse(t.format, data, &t.stripChunk)
	return &t.stripChunk
}

// usageChunk reports whether data, as an event's data, is something
// frameForStrip cuts: the usage chunk, or a usage member on a chunk.
func (t *tap) usageChunk(data []byte) bool {
	if !bytes.Contains(data, t.usage.ReplyKey()) {
		return false
	}
	c := t.parseStrip(data)
	return c.UsageOnly() || addedUsage(c) || (c.Choices > 0 && nullUsage(t.usage, data))
}

// nullUsage reports whether a chunk's top-level "usage" member is null:
// what OpenAI's API adds to every chunk once usage is asked for, cut in
// strip mode (docs/design.md, "Exact token counts ...", Limitations).
func nullUsage(u *stream.UsageOption, data []byte) bool {
	s, e, ok := stream.MemberSpan(data, u.Reply)
	if !ok {
		return false
	}
	m := bytes.TrimSpace(data[s:e])
	m = bytes.TrimSuffix(bytes.TrimPrefix(m, []byte(",")), []byte(","))
	_, v, ok := bytes.Cut(m, []byte(":"))
	return ok && bytes.Equal(bytes.TrimSpace(v), []byte("null"))
}

// addedUsage reports whether a chunk is a content chunk with a usage
// object (numbers, not null) that asking for usage put there (Ollama's
// completions' zeros, vLLM's continuous usage; docs/design.md,
// Limitations): strip mode cuts that member and keeps the rest.
func addedUsage(c *stream.Chunk) bool {
	return (c.Usage || c.HasPrompt) && c.Choices > 0 && !c.Error
}

// cutUsageMember removes the "usage" member from the event's data in the
// client's stream (strip mode). The data must be one line: a member of a
// multi-line data value is not contiguous in the stream, and is left
// where it is. The event may have been forwarded in part (a content
// chunk, up to its first top-level "usage" member): the member is cut
// only where it is still held.
func (t *tap) cutUsageMember(ev *stream.Event) {
	if bytes.IndexByte(ev.Data, '\n') >= 0 {
		return
	}
	var at int64
	if ev.Start >= t.heldOff {
		raw := t.held[ev.Start-t.heldOff : ev.End-t.heldOff]
		off, ok := dataOffset(raw, ev.Start == 0)
		if !ok || off+len(ev.Data) > len(raw) || !bytes.Equal(raw[off:off+len(ev.Data)], ev.Data) {
			return
		}
		at = ev.Start + int64(off)
	} else if ls := &t.ls; ls.ev == ev.Start && ls.js.start > ev.Start && !ls.all {
		at = ls.js.start // the value of its first data line, followed as it came
	} else {
		return
	}
	s, e, ok := stream.MemberSpan(ev.Data, t.usage.Reply)
	if !ok || at+int64(s) < t.heldOff {
		return
	}
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
