package tracing

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// Content capture reads each API's text where its description says it
// lives: Gemini's contents and systemInstruction, Anthropic's system
// beside its messages, the Responses API's instructions and input, and
// the prompt members of the others.
func TestInputMessagesEveryAPI(t *testing.T) {
	c := &ContentCapture{Redact: DefaultRedactions(), MaxBytes: 1 << 10}
	for _, tc := range []struct {
		api           *stream.API
		body          string
		input, system string
	}{
		{stream.APIChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			`[{"role":"system","parts":[{"type":"text","content":"be brief"}]},{"role":"user","parts":[{"type":"text","content":"hi"},{"type":"text","content":"{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}"}]}]`, ""},
		{stream.APIMessages, `{"model":"m","system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hi sk-abcdefghijkl"}]}`,
			`[{"role":"user","parts":[{"type":"text","content":"hi [REDACTED]"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APIMessages, `{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			`[{"role":"user","parts":[{"type":"text","content":"hi"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APIGemini, `{"systemInstruction":{"parts":[{"text":"be brief"}]},"contents":[{"role":"user","parts":[{"text":"hi"},{"text":"there"}]},{"role":"model","parts":[{"text":"yes"}]}]}`,
			`[{"role":"user","parts":[{"type":"text","content":"hi"},{"type":"text","content":"there"}]},{"role":"model","parts":[{"type":"text","content":"yes"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APIGemini, `{"system_instruction":{"parts":[{"text":"be brief"}]},"contents":[{"parts":[{"text":"hi"}]}]}`,
			`[{"role":"","parts":[{"type":"text","content":"hi"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APIResponses, `{"model":"m","instructions":"be brief","input":"hi"}`,
			`[{"role":"user","parts":[{"type":"text","content":"hi"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APICompletions, `{"model":"m","prompt":"hi"}`, `[{"role":"user","parts":[{"type":"text","content":"hi"}]}]`, ""},
		{stream.APIOllamaGenerate, `{"model":"m","system":"be brief","prompt":"hi"}`, `[{"role":"user","parts":[{"type":"text","content":"hi"}]}]`, `[{"type":"text","content":"be brief"}]`},
		{stream.APITGIGenerate, `{"inputs":"hi","parameters":{}}`, `[{"role":"user","parts":[{"type":"text","content":"hi"}]}]`, ""},
		{stream.APIOther, `{"messages":[{"role":"user","content":"hi"}]}`, "", ""},
		{stream.APIChat, `not json`, "", ""},
	} {
		in, sys := inputMessages([]byte(tc.body), tc.api.Request.Text, c)
		if in != tc.input || sys != tc.system {
			t.Errorf("%s %s:\n input  %s\n want   %s\n system %s\n want   %s", tc.api.Name, tc.body, in, tc.input, sys, tc.system)
		}
	}
}

// Hostile content: deep nesting is read a few levels deep and kept as
// JSON text below; whatever the body, both attributes are JSON or "".
func TestInputMessagesDeepNesting(t *testing.T) {
	c := &ContentCapture{MaxBytes: 1 << 20}
	deep := strings.Repeat("[", 5000) + `"x"` + strings.Repeat("]", 5000)
	in, _ := inputMessages([]byte(`{"prompt":`+deep+`}`), stream.APICompletions.Request.Text, c)
	var msgs []message
	if err := json.Unmarshal([]byte(in), &msgs); err != nil || len(msgs) != 1 || len(msgs[0].Parts) != 1 ||
		!strings.HasPrefix(msgs[0].Parts[0].Content, "[[") {
		t.Fatalf("deep prompt: %v %.200s", err, in)
	}
}

func FuzzInputMessages(f *testing.F) {
	f.Add(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"system":"s"}`, 0)
	f.Add(`{"contents":[{"role":"user","parts":[{"text":"hi"},{"functionCall":{}}]}],"systemInstruction":{"parts":[{"text":"s"}]}}`, 8)
	f.Add(`{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"instructions":null}`, 2)
	f.Add(`{"prompt":[[["x"]]],"inputs":{"text":1}}`, 1)
	apis := stream.APIs()
	c := &ContentCapture{MaxBytes: 64, Redact: DefaultRedactions()}
	f.Fuzz(func(t *testing.T, body string, api int) {
		a := apis[uint(api)%uint(len(apis))]
		in, sys := inputMessages([]byte(body), a.Request.Text, c)
		for _, s := range []string{in, sys} {
			if s != "" && !json.Valid([]byte(s)) {
				t.Fatalf("%s: not JSON: %q", a.Name, s)
			}
		}
	})
}
