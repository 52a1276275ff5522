package stream

import (
	"fmt"
	"slices"
	"strings"
)

// This file is the one description of every API the sidecar understands
// (docs/design.md, "Adding a wire format"): every list of API names, route
// switch, request shape, probe request, span route and egress default
// elsewhere derives from apis and the formats below. An API name that is
// not here is refused when the configuration is validated; code that asks
// for an unknown one (FormatOfAPI) panics rather than guess OpenAI.

// Format is one response wire format: the adapter that reads its payloads
// and how a streamed body of it is framed. Every adapter fills the same
// Chunk, so the tap measures all formats alike (docs/measurement.md §2,
// §3). Formats are compared by identity; the zero Format (nil) is none.
type Format = *WireFormat

// WireFormat describes one Format; only this package builds them.
type WireFormat struct {
	name string
	// parse reads one payload (an event's data, an NDJSON line or a whole
	// body) into a Chunk without allocating: the hot path, where t is
	// nil. Given a t, it also writes the payload's answer text to it
	// (AnswerTextOf).
	parse func(data []byte, c *Chunk, t *Collector)
	// lines: a streamed body whose first byte is '{' is NDJSON (Ollama);
	// otherwise SSE.
	lines bool
	// sse is the format of an SSE body of this format's APIs when that
	// differs (llama.cpp serves Ollama's /api/chat in the OpenAI format);
	// nil: this one.
	sse Format
}

// String is the format's name.
func (f *WireFormat) String() string { return f.name }

// SSE is the format that reads an SSE (text/event-stream) body of an API
// of format f: f itself, unless its APIs are also served as OpenAI SSE.
func (f *WireFormat) SSE() Format {
	if f.sse != nil {
		return f.sse
	}
	return f
}

// The formats the adapters read.
var (
	// FormatOpenAI: OpenAI Chat Completions and Completions chunks and
	// bodies (ParseOpenAI).
	FormatOpenAI = &WireFormat{name: "openai", parse: parseOpenAI}
	// FormatResponses: the OpenAI Responses API (ParseResponses).
	FormatResponses = &WireFormat{name: "responses", parse: parseResponses}
	// FormatMessages: Anthropic's Messages API (ParseMessages).
	FormatMessages = &WireFormat{name: "messages", parse: parseMessages}
	// FormatOllama: Ollama's native /api/chat and /api/generate
	// (ParseOllama); NDJSON when streamed.
	FormatOllama = &WireFormat{name: "ollama", parse: parseOllama, lines: true, sse: FormatOpenAI}
	// FormatTGI: text-generation-inference's native /generate_stream and
	// /generate (ParseTGI).
	FormatTGI = &WireFormat{name: "tgi", parse: parseTGI}
	// FormatLlamaCpp: llama.cpp server's native /completion (ParseLlamaCpp).
	FormatLlamaCpp = &WireFormat{name: "llamacpp", parse: parseLlamaCpp}
)

// Parse reads one payload of format f into c. It never allocates.
func Parse(f Format, data []byte, c *Chunk) { f.parse(data, c, nil) }

// The engine kinds (engine.Kind, the engine.kind setting): the engines
// whose metrics are normalised and whose routes are known.
const (
	EngineVLLM      = "vllm"
	EngineSGLang    = "sglang"
	EngineTGI       = "tgi"
	EngineLlamaCpp  = "llamacpp"
	EngineTRTLLM    = "trtllm"
	EngineDynamo    = "dynamo"
	EngineOllama    = "ollama"
	EngineSimulator = "simulator" // the built-in engine: vLLM's names
)

// EngineKinds lists every engine kind; callers must not modify it.
var EngineKinds = []string{EngineVLLM, EngineSGLang, EngineTGI, EngineLlamaCpp, EngineTRTLLM, EngineDynamo, EngineOllama, EngineSimulator}

// Name is an API's name (API.Name): a record's api, a bounded label.
// The zero Name is no API. The names are untyped constants, usable as
// plain strings too.
type Name string

// API returns the API named n (LookupAPI), nil when there is none.
func (n Name) API() *API { return LookupAPI(string(n)) }

// Operation returns the gen_ai.operation.name of the API named n (its
// Operation): one of the OTel GenAI well-known values, so that the label
// stays bounded; OpOther for a name that is no API.
func (n Name) Operation() string {
	if a := n.API(); a != nil {
		return a.Operation
	}
	return OpOther
}

// The names of the APIs (a record's api).
const (
	NameChat               = "chat"                // OpenAI Chat Completions
	NameCompletions        = "completions"         // OpenAI (legacy) Completions
	NameResponses          = "responses"           // OpenAI Responses
	NameMessages           = "messages"            // Anthropic Messages
	NameOllamaChat         = "ollama_chat"         // Ollama /api/chat
	NameOllamaGenerate     = "ollama_generate"     // Ollama /api/generate
	NameTGIGenerate        = "tgi_generate"        // TGI /generate_stream, /generate
	NameLlamaCppCompletion = "llamacpp_completion" // llama.cpp /completion
	// NameUpgrade is a connection that switched protocols (a 101: a
	// WebSocket), spliced and not parsed.
	NameUpgrade = "upgrade"
	// NameOther is every request no route below matches: passed through
	// untouched.
	NameOther = "other"
)

// The GenAI operation names (gen_ai.operation.name): OTel's well-known
// values, a bounded label.
const (
	OpChat           = "chat"
	OpTextCompletion = "text_completion"
	OpOther          = "other"
)

// API describes one API: everything the sidecar knows about it.
type API struct {
	Name Name
	// Format reads its responses; nil for the pass-through APIs (upgrade,
	// other), whose bodies are never parsed.
	Format Format
	// Operation is its gen_ai.operation.name. The Responses API is "chat":
	// the OpenAI conventions define no other name for it (they tell it
	// apart with openai.api.type=responses), and the conventions say to
	// use the applicable well-known value then.
	Operation string
	// Routes are the POST paths it is served at (Classify).
	Routes []Route
	// Request says where its request body keeps what the peek reads.
	Request Request
	// Probe builds a canary probe's path and request body in the API's
	// own shape (each engine's documented request: see the adapters'
	// sources); nil: no probe speaks it.
	Probe func(p ProbeParams) (path string, body map[string]any)
	// Engine is the engine kind the API implies, for the routes whose
	// meaning depends on it (a probe's); "" when none.
	Engine string
	// SpanRoutes are the routes a request path is named by in its span
	// when the path ends with one, in order (SpanRoute).
	SpanRoutes []string
	// Hosts are its provider's hosted endpoints and AlsoHosts those of
	// others serving it (Azure OpenAI): the egress proxy's default
	// intercept list is every API's Hosts, then every API's AlsoHosts
	// (EgressHosts).
	Hosts, AlsoHosts []string
	// KeyHeaders are the request headers that carry its API key, in the
	// order tried ("Authorization" holds a bearer token); nil means
	// DefaultKeyHeaders. KeyQuery is the URL query parameter that may
	// carry it instead ("" when none). The sidecar reads them only to
	// hash the key into a tenant identity (docs/config.md, tenant).
	KeyHeaders []string
	KeyQuery   string
	// SendKey is the header the sidecar's own requests (the canary,
	// replay) send a configured API key in, with its scheme; zero: the
	// bearer token of DefaultKeyHeaders (KeyHeader).
	SendKey KeyHeader
	// ProbeHeaders are the headers, name then value, every request the
	// sidecar itself sends the API carries (Anthropic's
	// anthropic-version, without which it refuses a request).
	ProbeHeaders [][2]string
	// Response says what its responses mean beyond what the Format reads.
	Response Response
}

// KeyHeader is a request header that carries an API key: Name, and the
// Scheme written before the key ("Bearer" in Authorization; "": the key
// alone).
type KeyHeader struct {
	Name, Scheme string
}

// bearer is the key of the OpenAI API and of the engines that take one.
var bearer = KeyHeader{Name: "Authorization", Scheme: "Bearer"}

// KeyHeader returns the header, name and value, that sends key to the
// API (SendKey; a bearer token when it names none).
func (a *API) KeyHeader(key string) (name, value string) {
	k := a.SendKey
	if k.Name == "" {
		k = bearer
	}
	if k.Scheme != "" {
		return k.Name, k.Scheme + " " + key
	}
	return k.Name, key
}

// Response says what an API's responses mean beyond what its Format
// reads.
type Response struct {
	// Cut are the finish reasons that say the answer was cut at its
	// token limit (the structure checks judge a cut answer's JSON
	// "truncated", not invalid); nil: none says so.
	Cut []string
	// Headers are the response headers engines report a request's
	// durations and counts in, by engine (HeadersFrom).
	Headers []*EngineHeaders
}

// EngineHeaders are the response headers in which one engine reports a
// request's durations (integer milliseconds) and token counts; each
// name "" is a header it does not send.
type EngineHeaders struct {
	// Engine is the engine kind that sends them: they are read only from
	// that engine, or on an API that implies it (API.Engine).
	Engine string
	// Times are the headers of the durations, each with its EngineTimes
	// bit (EngineQueue...).
	Times []HeaderTime
	// InputTokens and OutputTokens are the headers of the token counts.
	InputTokens, OutputTokens string
}

// HeaderTime is a response header holding one engine duration in integer
// milliseconds, and the EngineTimes bit it sets.
type HeaderTime struct {
	Name string
	Bit  uint8
}

// HeadersFrom returns the engine headers to read on a's responses when
// the detected engine is engine ("" when unknown): those of that engine,
// or of the engine a implies; nil when none.
func (a *API) HeadersFrom(engine string) *EngineHeaders {
	for _, h := range a.Response.Headers {
		if h.Engine == engine || h.Engine == a.Engine {
			return h
		}
	}
	return nil
}

// CutBy reports whether the finish reason says the answer was cut at its
// token limit (Response.Cut).
func (a *API) CutBy(reason string) bool {
	return reason != "" && slices.Contains(a.Response.Cut, reason)
}

// DefaultKeyHeaders carry the API key of an API that names none: the
// bearer token of the OpenAI API and of the engines that take one
// (vLLM's --api-key, SGLang, TGI, llama.cpp, an Ollama behind a proxy).
var DefaultKeyHeaders = []string{"Authorization"}

// Keys returns the headers that carry a's API key (KeyHeaders, or
// DefaultKeyHeaders).
func (a *API) Keys() []string {
	if a == nil || a.KeyHeaders == nil {
		return DefaultKeyHeaders
	}
	return a.KeyHeaders
}

// Route is one path an API is served at. The path matches when, without
// a trailing slash, it ends with Path (or equals it, when Exact); a route
// with an Engine matches only when the detected engine is that kind, and
// is tried before every route without one.
type Route struct {
	Path   string
	Exact  bool
	Engine string
}

func (r Route) match(p, engine string) bool {
	if r.Engine != "" && r.Engine != engine {
		return false
	}
	if r.Exact {
		return p == r.Path
	}
	return strings.HasSuffix(p, r.Path)
}

// Request says where an API's request body keeps the fields the sidecar
// peeks at. The model and the stream flag are the top-level "model" and
// "stream" members for every API.
type Request struct {
	// StreamUnlessFalse: the response is streamed unless "stream" is
	// false (Ollama: server/routes.go); otherwise only "stream":true
	// streams.
	StreamUnlessFalse bool
	// StreamRoute is a path suffix that asks for a stream whatever the
	// body says (TGI's /generate_stream); "" when none.
	StreamRoute string
	// MaxTokens are the members giving the output-token limit, the first
	// present wins: top-level names, or "options.num_predict" and
	// "parameters.max_new_tokens" inside the Sampling object.
	MaxTokens []string
	// Sampling is the member holding temperature, top_p and seed
	// ("options", "parameters"); "": the top level.
	Sampling string
	// SamplingKeys name temperature, top_p and seed, where the API names
	// them otherwise; zero: those names (SamplingNames).
	SamplingKeys [3]string
	// ModelFromPath returns the model a request path names, for an API
	// whose body names none; nil: the body's "model" only.
	ModelFromPath func(path string) string
	// Usage says how a client asks for usage in a stream, which the
	// sidecar may do on the client's behalf (the proxy's InjectUsage);
	// nil: the API reports its counts unasked or not at all.
	Usage *UsageOption
	// IgnoreEOS is the top-level member that, true, makes the engine
	// generate exactly the output-token limit rather than stop at its
	// end of sequence (the canary's ignore_eos, replay's
	// --ignore-eos); "": the API has none, its limit is a cap and the
	// answer may be shorter.
	IgnoreEOS string
	// Text says where the request's prompt and system text live, for
	// content capture (tracing's gen_ai.input.messages and
	// gen_ai.system_instructions).
	Text Text
	// Declares reads what the body declares for the structure checks
	// (its tools, a JSON output: Declared) from the top-level members
	// named in DeclareKeys, which member returns (nil: absent); nil: the
	// API declares neither, and no check applies to it.
	Declares    func(member func(key string) []byte) Declared
	DeclareKeys []string
	// Prompt names the top-level members that make up the request's
	// prompt, in the order the engine's prompt puts them (tools, the
	// system prompt, then the conversation): the workload capture hashes
	// them in blocks to find shared prefixes (docs/capture.md); nil: the
	// API has no prompt the capture reads.
	Prompt []string
}

// UsageOption is how a client asks for usage in a stream: the request's
// top-level Object (an object) with Member true.
type UsageOption struct {
	Object, Member string
	// Reply is the top-level member of the chunks that then carries the
	// usage: that of the usage-only chunk, and the one that asking adds
	// to content chunks (null, or zeros), both cut by strip mode.
	Reply string
	// Content is the top-level member whose non-empty array makes a
	// chunk a content chunk, never the usage-only one: strip mode
	// forwards such a chunk as it arrives (proxy/strip.go).
	Content string
	// replyKey is Reply as a JSON string, for a scan that allocates
	// nothing (ReplyKey).
	replyKey []byte
}

// ReplyKey is Reply as a JSON string ("\"usage\""); callers must not
// modify it.
func (u *UsageOption) ReplyKey() []byte { return u.replyKey }

// openAIUsage is stream_options.include_usage (the Chat Completions and
// Completions APIs), whose usage chunk carries "usage".
// Reply is UsageMember, which strip mode reads before a chunk is
// complete (proxy/strip.go).
var openAIUsage = &UsageOption{Object: "stream_options", Member: "include_usage", Reply: UsageMember, Content: ChoicesMember,
	replyKey: []byte(`"` + UsageMember + `"`)}

// Text says where a request body keeps its text, by top-level member.
// Each member is read when present; a string is one text, structured
// content is kept as its JSON text.
type Text struct {
	// Messages is the member holding the conversation: a list of
	// messages, each with a "role" and its text in "content" or, when
	// Parts, in the "text" of each of its "parts" (Gemini's contents);
	// "": none.
	Messages string
	Parts    bool
	// Prompt are the members holding a prompt of the user's.
	Prompt []string
	// System are the members holding system text (instructions): a
	// string, a list of content blocks, or (Gemini's systemInstruction)
	// a message with parts.
	System []string
}

// SamplingNames are the names of temperature, top_p and seed in the
// body (SamplingKeys, or those).
func (r Request) SamplingNames() [3]string {
	if r.SamplingKeys[0] != "" {
		return r.SamplingKeys
	}
	return [3]string{"temperature", "top_p", "seed"}
}

// ProbeParams are a canary probe's settings, as its API's Probe reads
// them.
type ProbeParams struct {
	Model, Prompt string
	MaxTokens     int
	Temperature   float64
	Seed          int64
	Stream        bool
}

func chatMessages(prompt string) []map[string]string {
	return []map[string]string{{"role": "user", "content": prompt}}
}

// openAIProbe is the Chat Completions (chat true) or Completions request.
func openAIProbe(path string, chat bool) func(ProbeParams) (string, map[string]any) {
	return func(p ProbeParams) (string, map[string]any) {
		m := map[string]any{"model": p.Model, "max_tokens": p.MaxTokens, "temperature": p.Temperature, "seed": p.Seed, "stream": p.Stream}
		if chat {
			m["messages"] = chatMessages(p.Prompt)
		} else {
			m["prompt"] = p.Prompt
		}
		return path, m
	}
}

// ollamaProbe is Ollama's /api/chat (chat true) or /api/generate request
// (api/types.go: the limit and the sampling live in options).
func ollamaProbe(path string, chat bool) func(ProbeParams) (string, map[string]any) {
	return func(p ProbeParams) (string, map[string]any) {
		m := map[string]any{"model": p.Model, "stream": p.Stream,
			"options": map[string]any{"num_predict": p.MaxTokens, "temperature": p.Temperature, "seed": p.Seed}}
		if chat {
			m["messages"] = chatMessages(p.Prompt)
		} else {
			m["prompt"] = p.Prompt
		}
		return path, m
	}
}

var openAIMaxTokens = []string{"max_completion_tokens", "max_tokens"}

// tgiHeaders are the response headers TGI reports a request's queue,
// inference and total time (integer milliseconds) and its token counts
// in (huggingface/text-generation-inference router/src/server.rs,
// generate: on a non-streaming answer).
var tgiHeaders = &EngineHeaders{Engine: EngineTGI,
	Times:       []HeaderTime{{"X-Queue-Time", EngineQueue}, {"X-Inference-Time", EngineInference}, {"X-Total-Time", EngineTotal}},
	InputTokens: "X-Prompt-Tokens", OutputTokens: "X-Generated-Tokens"}

// chatText is where a chat request keeps its text: "messages".
var chatText = Text{Messages: "messages"}

// The APIs.
var (
	APIChat = &API{Name: NameChat, Format: FormatOpenAI, Operation: OpChat,
		Routes: []Route{{Path: "/chat/completions"}},
		Request: Request{MaxTokens: openAIMaxTokens, Usage: openAIUsage, IgnoreEOS: "ignore_eos", Text: chatText,
			Declares: declaresOpenAI, DeclareKeys: []string{"tools", "response_format"},
			Prompt: []string{"tools", "messages"}},
		Response:   Response{Cut: []string{"length"}, Headers: []*EngineHeaders{tgiHeaders}},
		Probe:      openAIProbe("/v1/chat/completions", true),
		SpanRoutes: []string{"/v1/chat/completions", "/chat/completions"},
		Hosts:      []string{"api.openai.com"}, AlsoHosts: []string{"*.openai.azure.com"},
		KeyHeaders: []string{"Authorization", "api-key"}} // api-key: Azure OpenAI
	APICompletions = &API{Name: NameCompletions, Format: FormatOpenAI, Operation: OpTextCompletion,
		Routes: []Route{{Path: "/completions"}},
		Request: Request{MaxTokens: openAIMaxTokens, Usage: openAIUsage, IgnoreEOS: "ignore_eos", Text: Text{Prompt: []string{"prompt"}},
			Prompt: []string{"prompt"}},
		// limit: a llama.cpp native payload read by the completions
		// adapter (APILlamaCppCompletion).
		Response:   Response{Cut: []string{"length", "limit"}, Headers: []*EngineHeaders{tgiHeaders}},
		Probe:      openAIProbe("/v1/completions", false),
		SpanRoutes: []string{"/v1/completions", "/completions"}}
	APIResponses = &API{Name: NameResponses, Format: FormatResponses, Operation: OpChat,
		Routes: []Route{{Path: "/v1/responses"}, {Path: "/responses", Exact: true}},
		Request: Request{MaxTokens: []string{"max_output_tokens"}, Declares: declaresResponses, DeclareKeys: []string{"tools", "text"},
			Prompt: []string{"tools", "instructions", "input"}, Text: Text{Prompt: []string{"input"}, System: []string{"instructions"}}},
		// max_output_tokens: incomplete_details.reason (ParseResponses).
		Response: Response{Cut: []string{"max_output_tokens"}},
		Probe: func(p ProbeParams) (string, map[string]any) {
			return "/v1/responses", map[string]any{"model": p.Model, "input": p.Prompt, "max_output_tokens": p.MaxTokens, "temperature": p.Temperature, "stream": p.Stream}
		}}
	APIMessages = &API{Name: NameMessages, Format: FormatMessages, Operation: OpChat,
		Routes: []Route{{Path: "/v1/messages"}, {Path: "/messages", Exact: true}},
		Request: Request{MaxTokens: openAIMaxTokens, Declares: declaresMessages, DeclareKeys: []string{"tools"},
			Prompt: []string{"tools", "system", "messages"}, Text: Text{Messages: "messages", System: []string{"system"}}},
		// model_context_window_exceeded: cut by the context window
		// rather than max_tokens, cut all the same.
		Response: Response{Cut: []string{"max_tokens", "model_context_window_exceeded"}},
		Probe: func(p ProbeParams) (string, map[string]any) {
			return "/v1/messages", map[string]any{"model": p.Model, "messages": chatMessages(p.Prompt), "max_tokens": p.MaxTokens, "temperature": p.Temperature, "stream": p.Stream}
		},
		Hosts:      []string{"api.anthropic.com"},
		KeyHeaders: []string{"x-api-key", "Authorization"}, SendKey: KeyHeader{Name: "x-api-key"},
		// https://docs.anthropic.com/en/api/versioning: required.
		ProbeHeaders: [][2]string{{"anthropic-version", "2023-06-01"}}}
	APIOllamaChat = &API{Name: NameOllamaChat, Format: FormatOllama, Operation: OpChat,
		Routes: []Route{{Path: "/api/chat"}},
		Request: Request{StreamUnlessFalse: true, MaxTokens: []string{"options.num_predict"}, Sampling: "options",
			Declares: declaresOllama, DeclareKeys: []string{"tools", "format"},
			Prompt: []string{"tools", "messages"}, Text: chatText},
		Response: Response{Cut: []string{"length"}}, // done_reason
		Probe:    ollamaProbe("/api/chat", true)}
	APIOllamaGenerate = &API{Name: NameOllamaGenerate, Format: FormatOllama, Operation: OpTextCompletion,
		Routes: []Route{{Path: "/api/generate"}},
		Request: Request{StreamUnlessFalse: true, MaxTokens: []string{"options.num_predict"}, Sampling: "options",
			Declares: declaresOllama, DeclareKeys: []string{"format"},
			Prompt: []string{"system", "prompt"}, Text: Text{Prompt: []string{"prompt"}, System: []string{"system"}}},
		Response: Response{Cut: []string{"length"}}, // done_reason
		Probe:    ollamaProbe("/api/generate", false)}
	// APITGIGenerate: /generate is TGI's native route only on TGI (SGLang
	// has another /generate).
	APITGIGenerate = &API{Name: NameTGIGenerate, Format: FormatTGI, Operation: OpTextCompletion, Engine: EngineTGI,
		Routes: []Route{{Path: "/generate_stream"}, {Path: "/generate", Exact: true, Engine: EngineTGI}},
		Request: Request{StreamRoute: "/generate_stream", MaxTokens: []string{"parameters.max_new_tokens"}, Sampling: "parameters",
			Prompt: []string{"inputs"}, Text: Text{Prompt: []string{"inputs"}}},
		Response: Response{Cut: []string{"length"}, Headers: []*EngineHeaders{tgiHeaders}},
		Probe: func(p ProbeParams) (string, map[string]any) {
			params := map[string]any{"max_new_tokens": p.MaxTokens, "seed": p.Seed, "details": true}
			if p.Temperature > 0 { // TGI refuses temperature 0: greedy is its default
				params["temperature"] = p.Temperature
			}
			path := "/generate"
			if p.Stream {
				path = "/generate_stream"
			}
			return path, map[string]any{"inputs": p.Prompt, "parameters": params}
		}}
	// APILlamaCppCompletion: llama.cpp serves its native completion API at
	// /completions too, not the OpenAI one (tools/server/server.cpp). A
	// llama.cpp native payload reaching the completions adapter is read
	// all the same (ParseOpenAI hands it over).
	APILlamaCppCompletion = &API{Name: NameLlamaCppCompletion, Format: FormatLlamaCpp, Operation: OpTextCompletion, Engine: EngineLlamaCpp,
		Routes: []Route{{Path: "/completions", Exact: true, Engine: EngineLlamaCpp}, {Path: "/completion", Exact: true}},
		Request: Request{MaxTokens: []string{"n_predict", "max_completion_tokens", "max_tokens"}, IgnoreEOS: "ignore_eos",
			Prompt: []string{"prompt"}, Text: Text{Prompt: []string{"prompt"}}},
		Response: Response{Cut: []string{"limit"}}, // stop_type
		Probe: func(p ProbeParams) (string, map[string]any) {
			return "/completion", map[string]any{"prompt": p.Prompt, "n_predict": p.MaxTokens, "temperature": p.Temperature, "seed": p.Seed, "stream": p.Stream}
		}}
	APIUpgrade = &API{Name: NameUpgrade, Operation: OpOther}
	APIOther   = &API{Name: NameOther, Operation: OpOther}
)

// apis is the registry, in the order of APIs: a new API is one line
// here, before APIUpgrade.
var apis = []*API{
	APIChat,
	APICompletions,
	APIResponses,
	APIMessages,
	APIOllamaChat,
	APIOllamaGenerate,
	APITGIGenerate,
	APILlamaCppCompletion,
	APIGemini,
	APIUpgrade,
	APIOther,
}

// APIs lists every API, APIOther last; callers must not modify it.
func APIs() []*API { return apis }

// LookupAPI returns the API named name, nil when there is none.
func LookupAPI(name string) *API {
	for _, a := range apis {
		if string(a.Name) == name {
			return a
		}
	}
	return nil
}

// Classify returns the API a POST to path is, APIOther when no route
// matches (docs/records.md, api). engine is the detected engine kind (""
// when unknown): two routes mean different things on different engines.
func Classify(path, engine string) *API {
	p := strings.TrimSuffix(path, "/")
	for _, engineRoutes := range [2]bool{true, false} {
		for _, a := range apis {
			for _, r := range a.Routes {
				if (r.Engine != "") == engineRoutes && r.match(p, engine) {
					return a
				}
			}
		}
	}
	return APIOther
}

// FormatOfAPI is the format of the responses of the API named api, for
// content capture and answer checks (AnswerTextOf) outside the tap;
// FormatOpenAI for the pass-through APIs, whose bodies nothing parses. It
// panics on a name that is no API: a programming error.
func FormatOfAPI(api Name) Format {
	a := api.API()
	if a == nil {
		panic(fmt.Sprintf("stream: no API %q", api))
	}
	return a.BodyFormat()
}

// BodyFormat is the format that reads a's response bodies: its Format,
// or FormatOpenAI for the pass-through APIs, whose bodies nothing
// parses.
func (a *API) BodyFormat() Format {
	if a.Format == nil {
		return FormatOpenAI
	}
	return a.Format
}

// SpanRoute returns the span route of a request path: an API's span route
// when the path ends with one, else the path without a trailing slash.
func SpanRoute(path string) string {
	p := strings.TrimSuffix(path, "/")
	for _, a := range apis {
		for _, known := range a.SpanRoutes {
			if strings.HasSuffix(p, known) {
				return known
			}
		}
	}
	return p
}

// EgressHosts returns the egress proxy's default intercept list: every
// API's Hosts, then every API's AlsoHosts, each once.
func EgressHosts() []string {
	var hs []string
	add := func(list []string) {
		for _, h := range list {
			if !slices.Contains(hs, h) {
				hs = append(hs, h)
			}
		}
	}
	for _, a := range apis {
		add(a.Hosts)
	}
	for _, a := range apis {
		add(a.AlsoHosts)
	}
	return hs
}
