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
// framed before it is forwarded; only the bytes of an event that is not
// complete yet are held back; the usage chunk and added usage members are
// cut; the forwarded events are parsed after they were written, as in
// pass-through mode. Where it cannot strip safely, strip mode gives up
// (giveUp) with a reason: "strip_overflow" (stripHoldMax) or
// "single_lf_framing" (scanPending). A compressed body is never framed:
// modifyResponse gives it an opaque tap ("content_encoding").

// stripHoldMax bounds the bytes of an incomplete event held back from the
// client (64 KiB; a read adds at most copyBufSize before the check). Past
// it strip mode gives up ("strip_overflow").
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
// framing (rule 2), and sets t.ls.rel to the end of its last complete line
// when those lines may be forwarded before the event ends (rule 1).
//
// Single-LF framing ("data: {...}\ndata: {...}\n") is, to SSE, one event
// that never ends. Both rules are decided on the bytes alone, so the
// client's bytes do not depend on read boundaries (docs/design.md, "Strip
// mode"):
//
//  1. Early release: once the held event's first data line is a whole JSON
//     object that is not a usage chunk, its complete lines are forwarded.
//  2. Give up: a data line after such a line, in the same event, is
//     single-LF framing: strip mode gives up from the start of the event.
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

// nullUsage reports whether a chunk's top-level "usage" member is null:
// what OpenAI's API adds to every chunk once usage is asked for, cut in
// strip mode (docs/design.md, "Exact token counts ...", Limitations).
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
// object (numbers, not null) that asking for usage put there (Ollama's
// completions' zeros, vLLM's continuous usage; docs/design.md,
// Limitations): strip mode cuts that member and keeps the rest.
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
