package stream

import (
	"bytes"
	"encoding/json"
)

// AnswerTextOf concatenates the generated text (not the reasoning, nor a
// refusal) of a response of format f: the deltas of a streamed one, or
// the text of a whole body. A streamed body of a line format (Ollama) is
// read as NDJSON when it starts with a JSON object, as SSE of f.SSE()
// otherwise (llama.cpp serves /api/chat in the OpenAI format). It reads
// with the format's one parser (Parse), asking it for the text; a
// payload the parser finds malformed adds nothing. It is for checking
// answers (canary probes, content capture), not for the hot path: it
// allocates.
func AnswerTextOf(f Format, body []byte, streamed bool) string {
	var t Collector
	var c Chunk
	lines := f.lines && bytes.HasPrefix(trimWS(body), []byte("{"))
	ff := f
	if streamed && !lines {
		ff = f.SSE()
	}
	add := func(data []byte) {
		n := len(t.buf)
		ff.parse(data, &c, &t)
		if c.Malformed {
			t.buf = t.buf[:n]
		}
	}
	switch {
	case !streamed:
		add(body)
	case lines:
		var lf LineFramer
		lf.Feed(body, func(e *Event) { add(e.Data) })
		lf.Finish(func(e *Event) { add(e.Data) })
	default:
		var fr Framer
		fr.Feed(body, func(e *Event) { add(e.Data) })
		fr.Finish(func(e *Event) { add(e.Data) })
	}
	return string(t.buf)
}

// Collector is the sink a parser writes a payload's answer text, and
// its tool calls, to when asked: AnswerTextOf, and the structure checks
// (NewCollector, docs/slo.md "Structure"). The hot path passes nil and
// pays one nil check where a payload holds answer text or a tool call.
// The zero value collects the answer text only, unbounded, decoded as
// encoding/json does (AnswerTextOf).
type Collector struct {
	buf []byte
	// check: collecting for the structure checks (NewCollector): strings
	// are unescaped without allocating, everything held is bounded by
	// max, and the tool calls are assembled.
	check bool
	text  bool // collect the answer text (a JSON output was asked for)
	max   int  // bytes held at most, text and arguments together
	held  int
	over  bool
	calls []ToolCall
	n     int // calls in use: calls[n:] keep their buffers for reuse
	multi bool
}

// add appends the JSON string value v, unescaped as encoding/json does
// (invalid UTF-8 becomes U+FFFD); a value that is not a string adds
// nothing. For a structure check it appends only when the answer text is
// wanted, unescaped without allocating, within the bound.
func (t *Collector) add(v []byte) {
	if t.check {
		if t.text {
			t.buf = t.appendStr(t.buf, v)
		}
		return
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		t.buf = append(t.buf, s...)
	}
}
