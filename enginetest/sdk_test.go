package enginetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// parsed is what an SDK made of an answer: the text, the usage and the
// finish reason, as its own types report them.
type parsed struct {
	Text         string
	InputTokens  int64
	OutputTokens int64
	Finish       string
	Events       int
}

// The official SDKs parse every stream (and every plain answer) through
// the sidecar exactly as they do direct: the same text, usage and finish
// reason. Each case runs against Ollama directly, then through the
// sidecar; the record's token count must equal the SDK's usage.
func TestSDKsParseThroughTheSidecarAsDirect(t *testing.T) {
	w := setup(t)
	for _, mode := range ioModes {
		t.Run(mode.name, func(t *testing.T) {
			s := startSidecar(t, w, mode.args...)
			const prompt = "Say something."
			const maxTokens = 12

			openaiClient := func(base string) openai.Client {
				return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("ollama"), option.WithMaxRetries(0))
			}
			anthropicClient := func(base string) anthropic.Client {
				return anthropic.NewClient(aoption.WithBaseURL(base+"/"), aoption.WithAPIKey("ollama"), aoption.WithMaxRetries(0))
			}
			chatParams := func(usage bool) openai.ChatCompletionNewParams {
				p := openai.ChatCompletionNewParams{
					Model:       modelName,
					Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
					MaxTokens:   openai.Int(maxTokens),
					Temperature: openai.Float(0),
					Seed:        openai.Int(seed),
				}
				if usage {
					p.StreamOptions.IncludeUsage = openai.Bool(true)
				}
				return p
			}
			complParams := func(usage bool) openai.CompletionNewParams {
				p := openai.CompletionNewParams{
					Model:       modelName,
					Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
					MaxTokens:   openai.Int(maxTokens),
					Temperature: openai.Float(0),
					Seed:        openai.Int(seed),
				}
				if usage {
					p.StreamOptions.IncludeUsage = openai.Bool(true)
				}
				return p
			}
			respParams := responses.ResponseNewParams{
				Model:           modelName,
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
				MaxOutputTokens: openai.Int(maxTokens),
				Temperature:     openai.Float(0),
			}
			msgParams := anthropic.MessageNewParams{
				Model:     modelName,
				MaxTokens: maxTokens,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))},
				// No temperature: this SDK has none; the Modelfile's is 0.
			}

			cases := []struct {
				name, api string
				stream    bool
				// usage: the SDK reports usage for this case (a stream without the
				// client's include_usage has none, by the protocol).
				usage bool
				run   func(ctx context.Context, base string) (parsed, error)
			}{
				{"chat/stream", "chat", true, false, func(ctx context.Context, base string) (parsed, error) {
					return chatStream(ctx, openaiClient(base), chatParams(false))
				}},
				{"chat/stream+usage", "chat", true, true, func(ctx context.Context, base string) (parsed, error) {
					return chatStream(ctx, openaiClient(base), chatParams(true))
				}},
				{"chat", "chat", false, true, func(ctx context.Context, base string) (parsed, error) {
					c := openaiClient(base)
					r, err := c.Chat.Completions.New(ctx, chatParams(false))
					if err != nil {
						return parsed{}, err
					}
					return chatResult(*r, parsed{}), nil
				}},
				{"completions/stream", "completions", true, false, func(ctx context.Context, base string) (parsed, error) {
					return completionStream(ctx, openaiClient(base), complParams(false))
				}},
				{"completions/stream+usage", "completions", true, true, func(ctx context.Context, base string) (parsed, error) {
					return completionStream(ctx, openaiClient(base), complParams(true))
				}},
				{"completions", "completions", false, true, func(ctx context.Context, base string) (parsed, error) {
					c := openaiClient(base)
					r, err := c.Completions.New(ctx, complParams(false))
					if err != nil {
						return parsed{}, err
					}
					p := parsed{InputTokens: r.Usage.PromptTokens, OutputTokens: r.Usage.CompletionTokens}
					if len(r.Choices) > 0 {
						p.Text, p.Finish = r.Choices[0].Text, string(r.Choices[0].FinishReason)
					}
					return p, nil
				}},
				{"responses/stream", "responses", true, true, func(ctx context.Context, base string) (parsed, error) {
					c := openaiClient(base)
					st := c.Responses.NewStreaming(ctx, respParams)
					var p parsed
					var final responses.Response
					for st.Next() {
						e := st.Current()
						p.Events++
						switch e.Type {
						case "response.output_text.delta":
							p.Text += e.Delta
						case "response.completed", "response.incomplete", "response.failed":
							final = e.Response
						}
					}
					if final.OutputText() != p.Text {
						return p, fmt.Errorf("the deltas say %q, the final response %q", p.Text, final.OutputText())
					}
					p.InputTokens, p.OutputTokens = final.Usage.InputTokens, final.Usage.OutputTokens
					p.Finish = string(final.Status) + "/" + final.IncompleteDetails.Reason
					return p, st.Err()
				}},
				{"responses", "responses", false, true, func(ctx context.Context, base string) (parsed, error) {
					c := openaiClient(base)
					r, err := c.Responses.New(ctx, respParams)
					if err != nil {
						return parsed{}, err
					}
					return parsed{Text: r.OutputText(), InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens,
						Finish: string(r.Status) + "/" + r.IncompleteDetails.Reason}, nil
				}},
				{"messages/stream", "messages", true, true, func(ctx context.Context, base string) (parsed, error) {
					c := anthropicClient(base)
					st := c.Messages.NewStreaming(ctx, msgParams)
					var m anthropic.Message
					var p parsed
					for st.Next() {
						if err := m.Accumulate(st.Current()); err != nil {
							return p, err
						}
						p.Events++
					}
					return messageResult(m, p), st.Err()
				}},
				{"messages", "messages", false, true, func(ctx context.Context, base string) (parsed, error) {
					c := anthropicClient(base)
					m, err := c.Messages.New(ctx, msgParams)
					if err != nil {
						return parsed{}, err
					}
					return messageResult(*m, parsed{}), nil
				}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					direct, err := c.run(ctx, w.ollama)
					if err != nil {
						t.Fatalf("direct: %v", err)
					}
					via, err := c.run(ctx, s.proxy)
					r := s.next(t)
					if err != nil {
						t.Fatalf("through the sidecar: %v (record %s)", err, r)
					}
					t.Logf("direct %+v", direct)
					if via != direct {
						t.Errorf("through the sidecar %+v, direct %+v", via, direct)
					}
					if direct.Text == "" || len(direct.Text) != maxTokens {
						t.Errorf("text %q: want %d bytes (one byte per token, never stopping early)", direct.Text, maxTokens)
					}
					if c.usage && direct.OutputTokens != maxTokens {
						t.Errorf("SDK usage: %d output tokens, want %d", direct.OutputTokens, maxTokens)
					}
					if r.API != c.api || r.Stream != c.stream || r.Outcome != "success" {
						t.Errorf("record api %q stream %v outcome %q, want %q %v success: %s", r.API, r.Stream, r.Outcome, c.api, c.stream, r)
					}
					if r.OutputTokens == nil || *r.OutputTokens != maxTokens {
						t.Errorf("record output_tokens %v, want %d (the engine's count): %s", deref(r.OutputTokens), maxTokens, r)
					}
					if c.usage && (r.InputTokens == nil || int64(*r.InputTokens) != direct.InputTokens) {
						t.Errorf("record input_tokens %v, the SDK's usage %d", deref(r.InputTokens), direct.InputTokens)
					}
				})
			}
			loopCarried(t, s, mode.loop)
		})
	}
}

func chatResult(c openai.ChatCompletion, p parsed) parsed {
	if len(c.Choices) > 0 {
		p.Text, p.Finish = c.Choices[0].Message.Content, string(c.Choices[0].FinishReason)
	}
	p.InputTokens, p.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
	return p
}

// chatStream reads a chat completion stream as the SDK's accumulator
// does.
func chatStream(ctx context.Context, c openai.Client, params openai.ChatCompletionNewParams) (parsed, error) {
	st := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	var p parsed
	for st.Next() {
		acc.AddChunk(st.Current())
		p.Events++
	}
	return chatResult(acc.ChatCompletion, p), st.Err()
}

func completionStream(ctx context.Context, c openai.Client, params openai.CompletionNewParams) (parsed, error) {
	st := c.Completions.NewStreaming(ctx, params)
	var p parsed
	for st.Next() {
		e := st.Current()
		p.Events++
		for _, ch := range e.Choices {
			p.Text += ch.Text
			if ch.FinishReason != "" {
				p.Finish = string(ch.FinishReason)
			}
		}
		// Usage as the SDK reports it: the last chunk that carries a
		// non-zero one (Ollama sends zeros on every chunk when asked).
		if e.Usage.TotalTokens > 0 {
			p.InputTokens, p.OutputTokens = e.Usage.PromptTokens, e.Usage.CompletionTokens
		}
	}
	return p, st.Err()
}

func messageResult(m anthropic.Message, p parsed) parsed {
	for _, b := range m.Content {
		if b.Type == "text" {
			p.Text += b.Text
		}
	}
	p.InputTokens, p.OutputTokens, p.Finish = m.Usage.InputTokens, m.Usage.OutputTokens, string(m.StopReason)
	return p
}
