package stream

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// summary is what a whole response says, read event by event as the tap
// reads it (the adapters only; the tap's own rules are tested in proxy).
type summary struct {
	events, tokenEvents, outputEvents, reasoningEvents int
	firstOutput                                        int // index among token events; -1 if none
	tokens                                             int64
	tokensFrom                                         TokenSource
	done, errored, rejection, malformed                bool
	errorType                                          string
	errorCode                                          int64
	usage, hasPrompt                                   bool
	prompt, completion, cached                         int64
	finish, id, model                                  string
	engine                                             EngineTimes
}

func summarize(f Format, ndjson bool, body []byte) summary {
	s := summary{firstOutput: -1}
	var c Chunk
	on := func(e *Event) {
		s.events++
		if !e.HasData || s.done || s.errored {
			return
		}
		Parse(f, e.Data, &c)
		switch {
		case c.Malformed:
			s.malformed = true
			return
		case c.Error:
			s.errored, s.rejection = true, c.Rejection()
			s.errorType, s.errorCode = string(c.ErrorType), c.ErrorCode
		}
		if c.TokenBearing() {
			if c.Output && s.firstOutput < 0 {
				s.firstOutput = s.tokenEvents
			}
			s.tokenEvents++
			if c.Output {
				s.outputEvents++
			} else {
				s.reasoningEvents++
			}
			s.tokens += c.Tokens
			s.tokensFrom = max(s.tokensFrom, c.TokensFrom)
		}
		if c.HasPrompt {
			s.hasPrompt, s.prompt = true, c.PromptTokens
		}
		if c.Usage {
			s.usage, s.completion = true, c.CompletionTokens
		}
		if c.CachedTokens > 0 {
			s.cached = c.CachedTokens
		}
		if len(c.FinishReason) > 0 {
			s.finish = string(c.FinishReason)
		}
		if len(c.ID) > 0 && s.id == "" {
			s.id = string(c.ID)
		}
		if len(c.Model) > 0 && s.model == "" {
			s.model = string(c.Model)
		}
		if c.Engine.Known != 0 {
			s.engine = c.Engine
		}
		s.done = s.done || c.Done
	}
	if ndjson {
		var lf LineFramer
		lf.Feed(body, on)
		lf.Finish(on)
	} else {
		var fr Framer
		fr.Feed(body, on)
		fr.Finish(on)
	}
	return s
}

func readFixture(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("testdata", "fixtures", name))
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := readFixture(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFixtures reads each recorded stream (testdata/fixtures/README.md
// cites where each comes from) and checks what its adapter makes of it.
func TestFixtures(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	cases := []struct {
		file   string
		f      Format
		ndjson bool
		want   summary
	}{
		{"openai_chat_vllm.sse", FormatOpenAI, false, summary{events: 5, tokenEvents: 2, outputEvents: 2, firstOutput: 0,
			done: true, usage: true, hasPrompt: true, prompt: 12, completion: 2, finish: "stop", id: "chatcmpl-X", model: "m"}},
		{"openai_completions_ollama_usage.sse", FormatOpenAI, false, summary{events: 6, tokenEvents: 3, outputEvents: 3, firstOutput: 0,
			done: true, usage: true, hasPrompt: true, prompt: 5, completion: 3, finish: "length", id: "cmpl-424", model: "tiny"}},
		{"responses_ollama.sse", FormatResponses, false, summary{events: 14, tokenEvents: 3, outputEvents: 2, reasoningEvents: 1, firstOutput: 1,
			done: true, usage: true, hasPrompt: true, prompt: 9, completion: 3, finish: "completed", id: "resp_424", model: "tiny"}},
		{"responses_openai_error.sse", FormatResponses, false, summary{events: 4, tokenEvents: 1, outputEvents: 1, firstOutput: 0,
			errored: true, errorType: "ERR_SOMETHING", id: "resp_123", model: "gpt-4o-mini-2024-07-18"}},
		{"messages_ollama.sse", FormatMessages, false, summary{events: 10, tokenEvents: 3, outputEvents: 2, reasoningEvents: 1, firstOutput: 1,
			done: true, usage: true, hasPrompt: true, prompt: 9, completion: 3, finish: "end_turn", id: "msg_0123456789abcdef01234567", model: "tiny"}},
		{"messages_anthropic_overloaded.sse", FormatMessages, false, summary{events: 6, tokenEvents: 1, outputEvents: 1, firstOutput: 0,
			errored: true, rejection: true, errorType: "overloaded_error", hasPrompt: true, prompt: 33, cached: 8,
			id: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", model: "claude-sonnet-4-5"}},
		{"ollama_chat.ndjson", FormatOllama, true, summary{events: 3, tokenEvents: 2, outputEvents: 2, firstOutput: 0,
			done: true, usage: true, hasPrompt: true, prompt: 26, completion: 282, finish: "stop", model: "llama3.2",
			engine: EngineTimes{Total: 4883583458, Load: 1334875, Prompt: 342546000, Decode: 4535599000,
				Known: EngineTotal | EngineLoad | EnginePrompt | EngineDecode}}},
		{"ollama_generate.ndjson", FormatOllama, true, summary{events: 3, tokenEvents: 2, outputEvents: 1, reasoningEvents: 1, firstOutput: 1,
			done: true, usage: true, hasPrompt: true, prompt: 4, completion: 2, finish: "length", model: "qwen3",
			engine: EngineTimes{Total: 99 * time.Millisecond, Load: 5 * time.Millisecond, Prompt: 20 * time.Millisecond, Decode: 70 * time.Millisecond,
				Known: EngineTotal | EngineLoad | EnginePrompt | EngineDecode}}},
		{"ollama_generate_error.ndjson", FormatOllama, true, summary{events: 3, tokenEvents: 2, outputEvents: 1, reasoningEvents: 1, firstOutput: 1,
			errored: true, errorType: "an error was encountered while running the model: unexpected EOF", model: "qwen3"}},
		{"tgi_generate_stream.sse", FormatTGI, false, summary{events: 2, tokenEvents: 2, outputEvents: 2, firstOutput: 0, tokens: 2, tokensFrom: SourceTokenIDs,
			done: true, usage: true, hasPrompt: true, prompt: 7, completion: 2, finish: "eos_token"}},
		{"tgi_generate_stream_overloaded.sse", FormatTGI, false, summary{events: 3, tokenEvents: 1, outputEvents: 1, firstOutput: 0, tokens: 1, tokensFrom: SourceTokenIDs,
			errored: true, rejection: true, errorType: "overloaded"}},
		{"llamacpp_completion.sse", FormatLlamaCpp, false, summary{events: 3, tokenEvents: 2, outputEvents: 2, firstOutput: 0,
			done: true, usage: true, hasPrompt: true, prompt: 12, completion: 2, cached: 4, finish: "limit", model: "gpt-3.5-turbo",
			engine: EngineTimes{Prompt: ms(12.5), Decode: ms(30.25), Known: EnginePrompt | EngineDecode}}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			got := summarize(tc.f, tc.ndjson, fixture(t, tc.file))
			if got != tc.want {
				t.Fatalf("%s:\n got %+v\nwant %+v", tc.file, got, tc.want)
			}
		})
	}
}

// The Completions adapter reads a llama.cpp native payload that reached
// an OpenAI route (llama.cpp serves its native API at /completions).
func TestOpenAIReadsLlamaCppNative(t *testing.T) {
	got := summarize(FormatOpenAI, false, fixture(t, "llamacpp_completion.sse"))
	want := summarize(FormatLlamaCpp, false, fixture(t, "llamacpp_completion.sse"))
	if got != want {
		t.Fatalf("via the OpenAI adapter %+v, via llama.cpp's %+v", got, want)
	}
}

func TestAnswerTextOf(t *testing.T) {
	cases := []struct {
		file string
		f    Format
		want string
	}{
		{"openai_chat_vllm.sse", FormatOpenAI, "Hello!"},
		{"openai_completions_ollama_usage.sse", FormatOpenAI, "Hello world"},
		{"responses_ollama.sse", FormatResponses, "Hello"},
		{"messages_ollama.sse", FormatMessages, "Hello"},
		{"ollama_chat.ndjson", FormatOllama, "The sky"},
		{"ollama_generate.ndjson", FormatOllama, "Hi"},
		{"tgi_generate_stream.sse", FormatTGI, "Hello"},
		{"llamacpp_completion.sse", FormatLlamaCpp, "Hello there"},
	}
	for _, tc := range cases {
		if got := AnswerTextOf(tc.f, fixture(t, tc.file), true); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.file, got, tc.want)
		}
	}
	bodies := []struct {
		f          Format
		body, want string
	}{
		{FormatResponses, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"x"}]},{"type":"message","content":[{"type":"output_text","text":"Hi"}]}]}`, "Hi"},
		{FormatMessages, `{"id":"msg_1","type":"message","content":[{"type":"thinking","thinking":"x"},{"type":"text","text":"Hi"}]}`, "Hi"},
		{FormatOllama, `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":true}`, "Hi"},
		{FormatTGI, `{"generated_text":"Hi","details":null}`, "Hi"},
		{FormatLlamaCpp, `{"content":"Hi","stop":true}`, "Hi"},
	}
	for _, b := range bodies {
		if got := AnswerTextOf(b.f, []byte(b.body), false); got != b.want {
			t.Errorf("%v body: %q, want %q", b.f, got, b.want)
		}
	}
}
