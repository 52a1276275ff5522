// Package stream turns the bytes of an engine's response into protocol
// events: an incremental Server-Sent Events framer and adapters that read
// the OpenAI Chat Completions and Completions payloads carried by those
// events. Nothing here allocates per event in steady state.
package stream

import "bytes"

// Event is one dispatched SSE event. Its slices alias the Framer's internal
// buffers and are valid only until the callback returns.
type Event struct {
	// Name is the value of the last "event:" field; empty means "message".
	Name []byte
	// Data is the concatenation of the "data:" field values, joined by "\n"
	// as the SSE specification says (and of an "error:" field's, read as
	// the Framer says). HasData tells an empty data field ("data:") apart
	// from no data field at all.
	Data    []byte
	HasData bool
	// Start and End are the byte offsets of the event's raw bytes in the
	// whole stream, [Start, End), including its terminating blank line.
	// When that blank line ends in a CRLF split across two reads, the event
	// is dispatched at the CR (so that its time is the time of the read
	// that completed it) and End stops before the LF; AfterCR tells.
	Start, End int64
	// Partial is true for an event that the stream ended inside (no blank
	// line after it). The specification discards such an event; we dispatch
	// it, flagged, because engines do end streams with "data: [DONE]\n".
	Partial bool
}

// Framer splits a Server-Sent Events byte stream into events. Feed it the
// bytes in the order they were read, split anywhere; it handles CR, LF and
// CRLF line endings (also a CRLF split across two reads), "data:" with or
// without one leading space, comment lines, multi-line data, a leading
// UTF-8 BOM, and a partial event at EOF (see Finish).
//
// One field the specification ignores is read: "error:" with a JSON
// object, a data line {"error": <the object>} that every adapter reads as
// an error. llama.cpp before ggml-org/llama.cpp#16109 (September 2025)
// sent a stream's error so (tools/server/server.cpp,
// server_sent_event(sink, "error", error_data): {"code","message","type"}),
// then "data: [DONE]" on its OpenAI routes: with the field ignored, a
// request that failed ended as a success.
//
// The zero value is ready to use. A Framer is not safe for concurrent use.
type Framer struct {
	line      []byte // the current line, when it spans reads
	data      []byte // data of the event being built
	name      []byte // event name of the event being built
	hasData   bool
	hasFields bool  // any line other than the terminator since the last dispatch
	dropping  bool  // the event being built overflowed: its lines are discarded
	skipLine  bool  // the current line overflowed: its bytes are discarded
	offset    int64 // bytes consumed so far
	evStart   int64 // offset of the first byte of the event being built
	afterCR   bool  // the last byte consumed was a CR that ended a line
	started   bool  // the first line has been seen (BOM handling)
	// MaxEventBytes bounds the bytes buffered for one event: the length of
	// each of its lines (without the line ending, and without the BOM that
	// may start the stream) and the length of its data. Zero means 1 MiB.
	// An event over the bound is dropped and counted in Oversized: it is
	// never dispatched, and the events after it are.
	MaxEventBytes int
	// Oversized counts the events dropped for exceeding MaxEventBytes
	// (each once, however many of its lines were over).
	Oversized int
	ev        Event // handed to callbacks; kept here so dispatch never allocates
}

var bom = []byte{0xEF, 0xBB, 0xBF}

// errorOpen and errorClose wrap the data an "error:" field is read as
// (Framer).
var errorOpen, errorClose = []byte(`{"error":`), []byte(`}`)

// addData appends one data line, open+value+close, to the event's data
// (joined to what it holds by "\n"), or drops the event when the line
// takes it over the bound.
func (f *Framer) addData(open, value, close []byte) {
	n := len(f.data) + len(open) + len(value) + len(close)
	if f.hasData {
		n++
	}
	if n > f.limit() {
		f.overflow()
		return
	}
	if f.hasData {
		f.data = append(f.data, '\n')
	}
	f.data = append(f.data, open...)
	f.data = append(f.data, value...)
	f.data = append(f.data, close...)
	f.hasData = true
}

func (f *Framer) limit() int {
	if f.MaxEventBytes > 0 {
		return f.MaxEventBytes
	}
	return 1 << 20
}

// lineLimit is the bound on the raw bytes of a line: the first line may
// also hold the BOM, which does not count (processLine checks the rest).
func (f *Framer) lineLimit() int {
	if !f.started {
		return f.limit() + len(bom)
	}
	return f.limit()
}

// Feed consumes p and calls fn for every event completed by it.
func (f *Framer) Feed(p []byte, fn func(*Event)) {
	for len(p) > 0 {
		if f.afterCR {
			f.afterCR = false
			if p[0] == '\n' { // second half of a CRLF
				p = p[1:]
				f.offset++
				if f.evStart == f.offset-1 {
					f.evStart = f.offset
				}
				continue
			}
		}
		i := lineEnd(p)
		if i < 0 {
			f.offset += int64(len(p))
			switch {
			case f.skipLine:
			case len(f.line)+len(p) > f.lineLimit():
				f.overflow()
				f.skipLine = true
				f.line = f.line[:0]
			default:
				f.line = append(f.line, p...)
			}
			return
		}
		eol := 1
		if p[i] == '\r' {
			if i+1 < len(p) {
				if p[i+1] == '\n' {
					eol = 2
				}
			} else {
				f.afterCR = true
			}
		}
		f.offset += int64(i + eol)
		switch {
		case f.skipLine:
			f.skipLine = false
		case len(f.line)+i > f.lineLimit():
			f.overflow()
		case len(f.line) > 0:
			f.line = append(f.line, p[:i]...)
			f.processLine(f.line, fn)
		default:
			f.processLine(p[:i], fn)
		}
		f.line = f.line[:0]
		p = p[i+eol:]
	}
}

// lineEnd returns the index of the first CR or LF in p, or -1: what
// bytes.IndexAny(p, "\r\n") returns, with two vectorised IndexByte
// scans instead of a byte-by-byte set lookup (the framer's hot loop).
func lineEnd(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	s := p
	if i >= 0 {
		s = p[:i]
	}
	if j := bytes.IndexByte(s, '\r'); j >= 0 {
		return j
	}
	return i
}

// Finish ends the stream: an event the stream ended inside is dispatched
// with Partial set. A Framer reads one stream: after Finish, use a new
// one (the zero value) for the next stream.
func (f *Framer) Finish(fn func(*Event)) {
	if len(f.line) > 0 {
		f.processLine(f.line, nil)
		f.line = f.line[:0]
	}
	f.skipLine = false
	switch {
	case f.dropping:
		f.endEvent()
	case f.hasFields:
		f.dispatch(fn, true)
	}
}

// overflow drops the event being built: its lines up to the blank line
// that ends it are discarded.
func (f *Framer) overflow() {
	if !f.dropping {
		f.Oversized++
	}
	f.dropping = true
	f.started = true
}

func (f *Framer) processLine(line []byte, fn func(*Event)) {
	if !f.started {
		f.started = true
		line = bytes.TrimPrefix(line, bom)
		if len(line) > f.limit() {
			f.overflow()
			return
		}
	}
	if len(line) == 0 {
		switch {
		case f.dropping:
			f.endEvent()
		case f.hasFields:
			f.dispatch(fn, false)
		default:
			f.evStart = f.offset // a stray blank line belongs to no event
		}
		return
	}
	if f.dropping {
		return
	}
	f.hasFields = true
	if line[0] == ':' { // comment
		return
	}
	var field, value []byte
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	} else {
		field = line
	}
	switch string(field) { // no allocation: the compiler special-cases this
	case "data":
		f.addData(nil, value, nil)
	case "error": // llama.cpp's old error field (Framer)
		if len(value) > 0 && value[0] == '{' {
			f.addData(errorOpen, value, errorClose)
		}
	case "event":
		f.name = append(f.name[:0], value...)
	}
}

func (f *Framer) dispatch(fn func(*Event), partial bool) {
	f.ev = Event{Name: f.name, Data: f.data, HasData: f.hasData, Start: f.evStart, End: f.offset, Partial: partial}
	if fn != nil {
		fn(&f.ev)
	}
	f.endEvent()
}

// endEvent makes the Framer ready for the next event, which starts at the
// current offset.
func (f *Framer) endEvent() {
	f.data = f.data[:0]
	f.name = f.name[:0]
	f.hasData = false
	f.hasFields = false
	f.dropping = false
	f.evStart = f.offset
}

// AfterCR reports whether the last byte fed was a CR that ended a line,
// so that an LF fed next completes a CRLF rather than starting a line.
func (f *Framer) AfterCR() bool { return f.afterCR }

// Offset reports how many bytes have been fed.
func (f *Framer) Offset() int64 { return f.offset }

// PendingStart reports the stream offset at which the event being built
// (not yet dispatched) starts. Bytes from there to Offset are buffered
// state, not a complete event.
func (f *Framer) PendingStart() int64 { return f.evStart }
