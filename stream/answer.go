package stream

import (
	"bytes"
	"encoding/json"
	"strings"
)

// AnswerTextOf concatenates the generated text (not the reasoning) of a
// response of format f: the deltas of a streamed one, or the text of a
// whole body. A streamed body of a line format (Ollama) is read as NDJSON
// when it starts with a JSON object, as SSE of f.SSE() otherwise
// (llama.cpp serves /api/chat in the OpenAI format). It is for checking
// answers (canary probes, content capture), not for the hot path: it
// decodes with encoding/json.
func AnswerTextOf(f Format, body []byte, streamed bool) string {
	var sb strings.Builder
	lines := f.lines && bytes.HasPrefix(trimWS(body), []byte("{"))
	ff := f
	if streamed && !lines {
		ff = f.SSE()
	}
	add := func(data []byte) { ff.answer(data, streamed, &sb) }
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
	return sb.String()
}

func answerResponses(data []byte, streamed bool, sb *strings.Builder) {
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
}

func answerMessages(data []byte, _ bool, sb *strings.Builder) {
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
}

func answerOllama(data []byte, _ bool, sb *strings.Builder) {
	var e struct {
		Message  struct{ Content string } `json:"message"`
		Response string                   `json:"response"`
	}
	if json.Unmarshal(data, &e) == nil {
		sb.WriteString(e.Message.Content + e.Response)
	}
}

func answerTGI(data []byte, _ bool, sb *strings.Builder) {
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
}

func answerLlamaCpp(data []byte, _ bool, sb *strings.Builder) {
	var e struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(data, &e) == nil {
		sb.WriteString(e.Content)
	}
}

func answerOpenAI(data []byte, _ bool, sb *strings.Builder) {
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
