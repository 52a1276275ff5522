package stream

import "bytes"

// LineFramer splits a newline-delimited JSON stream (NDJSON,
// application/x-ndjson: Ollama's native streams) into lines. Feed it the
// bytes in the order they were read, split anywhere. A line ends at LF; a
// CR before the LF is not part of it. Blank lines are skipped (they are
// no event). Each line is handed out as an Event whose Data is the line
// (HasData set) and whose Start and End are its byte offsets in the
// stream, its LF included.
//
// It is bounded like Framer: a line longer than MaxLineBytes is dropped
// (never dispatched) and counted in Oversized; the lines after it are
// dispatched.
//
// The zero value is ready to use. A LineFramer is not safe for
// concurrent use.
type LineFramer struct {
	line   []byte // the current line, when it spans reads
	skip   bool   // the current line overflowed: its bytes are discarded
	offset int64  // bytes consumed so far
	start  int64  // offset of the current line's first byte
	// MaxLineBytes bounds one line. Zero means 1 MiB.
	MaxLineBytes int
	// Oversized counts the lines dropped for exceeding MaxLineBytes.
	Oversized int
	ev        Event
}

func (f *LineFramer) limit() int {
	if f.MaxLineBytes > 0 {
		return f.MaxLineBytes
	}
	return 1 << 20
}

// Feed consumes p and calls fn for every line completed by it.
func (f *LineFramer) Feed(p []byte, fn func(*Event)) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.offset += int64(len(p))
			switch {
			case f.skip:
			case len(f.line)+len(p) > f.limit():
				f.Oversized++
				f.skip = true
				f.line = f.line[:0]
			default:
				f.line = append(f.line, p...)
			}
			return
		}
		f.offset += int64(i + 1)
		switch {
		case f.skip:
			f.skip = false
		case len(f.line)+i > f.limit():
			f.Oversized++
		case len(f.line) > 0:
			f.line = append(f.line, p[:i]...)
			f.dispatch(f.line, fn, false)
		default:
			f.dispatch(p[:i], fn, false)
		}
		f.line = f.line[:0]
		f.start = f.offset
		p = p[i+1:]
	}
}

// Finish ends the stream: a last line without its LF is dispatched with
// Partial set.
func (f *LineFramer) Finish(fn func(*Event)) {
	if !f.skip && len(f.line) > 0 {
		f.dispatch(f.line, fn, true)
	}
	f.line, f.skip = f.line[:0], false
	f.start = f.offset
}

func (f *LineFramer) dispatch(line []byte, fn func(*Event), partial bool) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(trimWS(line)) == 0 {
		return
	}
	f.ev = Event{Data: line, HasData: true, Start: f.start, End: f.offset, Partial: partial}
	if fn != nil {
		fn(&f.ev)
	}
}

// Offset reports how many bytes have been fed.
func (f *LineFramer) Offset() int64 { return f.offset }
