package stream

import (
	"bytes"
	"encoding/json"
	"strings"
)

// AnswerTextOf concatenates the generated text (not the reasoning) of a
// response of format f: the deltas of a streamed one, or the text of a
// whole body. A streamed Ollama body is read as NDJSON when it starts
// with a JSON object, as SSE otherwise (llama.cpp serves /api/chat in the
// OpenAI format). It is for checking answers (canary probes, content
// capture), not for the hot path: it decodes with encoding/json.
func AnswerTextOf(f Format, body []byte, streamed bool) string {
	var sb strings.Builder
	add := func(data []byte) {
		ff := f
		if ff == FormatOllama && streamed && !bytes.HasPrefix(trimWS(body), []byte("{")) {
			ff = FormatOpenAI
		}
		answerPiece(ff, data, streamed, &sb)
	}
	switch {
	case !streamed:
		add(body)
	case f == FormatOllama && bytes.HasPrefix(trimWS(body), []byte("{")):
		var lf LineFramer
		lf.Feed(body, func(e *Event) { add(e.Data) })
		lf.Finish(func(e *Event) { add(e.Data) })
	default:
		var fr Framer
		fr.Feed(body, func(e *Event) { add(e.Data) })
		fr.Finish(func(e *Event) { add(e.Data) })
	}
	return sb.String()
}

func answerPiece(f Format, data []byte, streamed bool, sb *strings.Builder) {
	switch f {
	case FormatResponses:
		var e struct {
			Type   string `json:"type"`
			Delta  string `json:"delta"`
			Object string `json:"object"`
			Output []struct {
				Type    string `json:"type"`
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			} `json:"output"`
		}
		if json.Unmarshal(data, &e) != nil {
			return
		}
		if e.Type == "response.output_text.delta" {
			sb.WriteString(e.Delta)
		}
		if !streamed && e.Object == "response" {
			for _, o := range e.Output {
				for _, p := range o.Content {
					if o.Type == "message" && p.Type == "output_text" {
						sb.WriteString(p.Text)
					}
				}
			}
		}
	case FormatMessages:
		var e struct {
			Type  string `json:"type"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		}
		if json.Unmarshal(data, &e) != nil {
			return
		}
		if e.Type == "content_block_delta" && e.Delta.Type == "text_delta" {
			sb.WriteString(e.Delta.Text)
		}
		if e.Type == "message" {
			for _, b := range e.Content {
				if b.Type == "text" {
					sb.WriteString(b.Text)
				}
			}
		}
	case FormatOllama:
		var e struct {
			Message  struct{ Content string } `json:"message"`
			Response string                   `json:"response"`
		}
		if json.Unmarshal(data, &e) == nil {
			sb.WriteString(e.Message.Content + e.Response)
		}
	case FormatTGI:
		var e struct {
			Token *struct {
				Text    string `json:"text"`
				Special bool   `json:"special"`
			} `json:"token"`
			GeneratedText *string `json:"generated_text"`
		}
		if json.Unmarshal(data, &e) != nil {
			return
		}
		switch {
		case e.Token != nil && !e.Token.Special:
			sb.WriteString(e.Token.Text)
		case e.Token == nil && e.GeneratedText != nil: // a whole /generate body
			sb.WriteString(*e.GeneratedText)
		}
	case FormatLlamaCpp:
		var e struct {
			Content string `json:"content"`
		}
		if json.Unmarshal(data, &e) == nil {
			sb.WriteString(e.Content)
		}
	default:
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
}
