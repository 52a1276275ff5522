package stream

import (
	"encoding/json"
	"strings"
)

// AnswerText concatenates the generated text of an OpenAI response:
// delta.content / text of every streamed chunk, or message.content / text
// of a whole body.
func AnswerText(body []byte, streamed bool) string {
	var sb strings.Builder
	add := func(data []byte) {
		var c struct {
			Choices []struct {
				Delta   struct{ Content string } `json:"delta"`
				Message struct{ Content string } `json:"message"`
				Text    string                   `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &c) == nil {
			for _, ch := range c.Choices {
				sb.WriteString(ch.Delta.Content + ch.Message.Content + ch.Text)
			}
		}
	}
	if !streamed {
		add(body)
		return sb.String()
	}
	var f Framer
	f.Feed(body, func(e *Event) { add(e.Data) })
	f.Finish(func(e *Event) { add(e.Data) })
	return sb.String()
}
