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

// Every format's answer text: its generated text, unescaped, without the
// reasoning (thought, thinking) or a refusal, and nothing from a
// malformed payload.
func TestAnswerTextEveryFormat(t *testing.T) {
	cases := []struct {
		name     string
		f        Format
		streamed bool
		body     string
		want     string
	}{
		{"openai reasoning, refusal, escapes", FormatOpenAI, true,
			"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"refusal\":\"no\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"a\\\"\\u00e9\\n\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"lost\"}}],\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":null}}],\"usage\":{\"completion_tokens\":3}}\n\n" +
				"data: [DONE]\n\n", "a\"é\n"},
		{"openai whole with refusal", FormatOpenAI, false,
			`{"choices":[{"message":{"content":null,"refusal":"no","reasoning":"r"}},{"message":{"content":"yes"}}]}`, "yes"},
		{"responses reasoning and refusal", FormatResponses, true,
			"event: response.reasoning_text.delta\ndata: {\"type\":\"response.reasoning_text.delta\",\"delta\":\"think\"}\n\n" +
				"data: {\"type\":\"response.refusal.delta\",\"delta\":\"no\"}\n\n" +
				"data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n" +
				"data: {\"type\":\"response.completed\",\"response\":{\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}]}}\n\n", "Hi"},
		{"responses whole with refusal", FormatResponses, false,
			`{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"no"},{"type":"output_text","text":"A"}]},{"type":"message","content":[{"type":"output_text","text":"B"}]}]}`, "AB"},
		{"messages thinking and tool input", FormatMessages, true,
			"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
				"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n" +
				"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Yes\"}}\n\n" +
				"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n" +
				"data: {\"type\":\"message_stop\"}\n\n", "Yes"},
		{"ollama thinking", FormatOllama, true,
			"{\"message\":{\"thinking\":\"hmm\"},\"done\":false}\n{\"message\":{\"content\":\"Sky\"},\"done\":false}\n{\"response\":\" blue\",\"thinking\":\"x\",\"done\":true}\n", "Sky blue"},
		{"ollama as OpenAI SSE", FormatOllama, true,
			"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n", "Hi"},
		{"tgi special token and final event", FormatTGI, true,
			"data: {\"token\":{\"id\":1,\"text\":\"Hi\",\"special\":false}}\n\n" +
				"data: {\"token\":{\"id\":2,\"text\":\"</s>\",\"special\":true},\"generated_text\":\"Hi\"}\n\n", "Hi"},
		{"llamacpp", FormatLlamaCpp, true,
			"data: {\"content\":\"He\",\"stop\":false}\n\ndata: {\"content\":\"y\",\"stop\":true,\"stop_type\":\"eos\"}\n\n", "Hey"},
		{"gemini thoughts", FormatGemini, true,
			"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"plan\",\"thought\":true}],\"role\":\"model\"}}]}\r\n\r\n" +
				"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Par\"},{\"functionCall\":{\"name\":\"f\"}}],\"role\":\"model\"}}]}\r\n\r\n" +
				"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"is\"}],\"role\":\"model\"},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"candidatesTokenCount\":2}}\r\n\r\n", "Paris"},
		{"gemini array, one element malformed", FormatGemini, false,
			`[{"candidates":[{"content":{"parts":[{"text":"A"}]}}]},{"candidates":[{"content":{"parts":[{"text":"B"}]}}]]`, ""},
	}
	for _, tc := range cases {
		if got := AnswerTextOf(tc.f, []byte(tc.body), tc.streamed); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
