package stream

import (
	"bytes"
	"testing"
)

func TestAnswerText(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n" +
		": ping\r\n\r\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Par\"}}]}\r\n\r\n" +
		"data: {\"choices\":[{\"text\":\"is\"}]}\r\n\r\n" +
		"data: not json\r\n\r\n" +
		"data: [DONE]"
	if got := AnswerTextOf(FormatOpenAI, []byte(sse), true); got != "Paris" {
		t.Fatalf("streamed: %q", got)
	}
	if got := AnswerTextOf(FormatOpenAI, []byte(`{"choices":[{"message":{"content":"a"}},{"message":{"content":"b"}}]}`), false); got != "ab" {
		t.Fatalf("whole: %q", got)
	}
}

// A whole body reads the same as the one event that carries it, and a
// stream reads the same whatever its line endings.
func FuzzAnswerText(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"message":{"content":"hi"}}]}`, `{"choices":[{"text":" ok"}]}`,
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":\ndata: [{\"text\":\"x\"}]}\n\n", `{"choices":null}`, `[DONE]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		whole := AnswerTextOf(FormatOpenAI, body, false)
		streamed := AnswerTextOf(FormatOpenAI, body, true)
		if !bytes.ContainsAny(body, "\r\n") {
			ev := append(append([]byte("data: "), body...), "\n\n"...)
			if got := AnswerTextOf(FormatOpenAI, ev, true); got != whole {
				t.Fatalf("%q: as one event %q, whole %q", body, got, whole)
			}
		}
		if !bytes.Contains(body, []byte("\r")) {
			crlf := bytes.ReplaceAll(body, []byte("\n"), []byte("\r\n"))
			if got := AnswerTextOf(FormatOpenAI, crlf, true); got != streamed {
				t.Fatalf("%q: with CRLF %q, with LF %q", body, got, streamed)
			}
		}
	})
}
