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
	var t answerText
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

// answerText is the sink a parser writes a payload's answer text to when
// asked (AnswerTextOf); the hot path passes nil and pays one nil check
// where a payload holds answer text.
type answerText struct{ buf []byte }

// add appends the JSON string value v, unescaped as encoding/json does
// (invalid UTF-8 becomes U+FFFD); a value that is not a string adds
// nothing.
func (t *answerText) add(v []byte) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		t.buf = append(t.buf, s...)
	}
}
