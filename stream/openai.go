package stream

import (
	"bytes"
	"math"
)

// Chunk is what one payload says, as far as measurement goes, whatever its
// wire format (Format): a streamed event (an OpenAI chat.completion.chunk,
// a Responses or Messages event, an Ollama NDJSON line, a TGI token...)
// or a whole non-streaming response body. Byte slices alias the payload.
//
// The zero value is an empty chunk that carries nothing.
type Chunk struct {
	// Done is the format's end marker: OpenAI's "[DONE]", Responses'
	// response.completed or response.incomplete, Messages' message_stop,
	// Ollama's done:true, TGI's final event (generated_text), llama.cpp's
	// stop:true. Unlike "[DONE]", these may carry usage and a finish
	// reason in the same payload.
	Done      bool
	Malformed bool // not JSON, or not a JSON object
	// Error is set when the payload is an error object: a top-level
	// "error" member (vLLM, SGLang, TGI, llama.cpp, OpenAI) or
	// {"object":"error",...} (older vLLM).
	Error     bool
	ErrorType []byte // error.type, error.code as a string, or the error string
	ErrorCode int64  // error.code or error.http_status_code, when numeric
	// Output is set when some choice carries user-visible content (a
	// refusal included) or tool-call arguments; Reasoning when some
	// choice carries reasoning.
	// Role-only and empty-content deltas set neither.
	Output, Reasoning bool
	// Tokens is the number of tokens this event carries when the payload
	// says so exactly (vLLM's per-choice token_ids) or per token
	// (logprobs entries); 0 means unknown. TokensFrom says which.
	Tokens     int64
	TokensFrom TokenSource
	// Choices is the number of elements of "choices" (-1 when absent).
	Choices int
	// Index is the "index" member of the first element of "choices": the
	// choice (of n) the payload carries; 0 (its position) when absent or
	// not a number; IndexOutOfRange for a number beyond what the parser
	// reads (more than 18 digits, a fraction, an exponent), which names
	// no choice it can tell from another. ChoicesData is the "choices" array itself when it
	// has more than one element, for EachChoice to read them one by one;
	// nil otherwise. Output, Reasoning, Tokens and FinishReason above
	// pool every choice of the payload.
	Index       int64
	ChoicesData []byte
	// Usage is set when the output token count is given
	// (CompletionTokens: usage.completion_tokens, Ollama's eval_count,
	// ...); HasPrompt when the input count is (PromptTokens).
	Usage            bool
	HasPrompt        bool
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64 // usage.prompt_tokens_details.cached_tokens and its kin
	FinishReason     []byte
	ID, Model        []byte
	// Engine holds the durations the engine reported about the request
	// (Ollama's *_duration, llama.cpp's timings).
	Engine EngineTimes
}

// TokenSource names where an output token count came from, best first.
type TokenSource uint8

// Token sources, in the order of preference of docs/measurement.md §2.
const (
	SourceNone     TokenSource = iota
	SourceUsage                // the server's usage numbers
	SourceTokenIDs             // per-event token ids (vLLM return_token_ids)
	SourceLogprobs             // one logprobs entry per token
	SourceEvents               // token-bearing events counted: a last resort
)

func (s TokenSource) String() string {
	switch s {
	case SourceUsage:
		return "usage"
	case SourceTokenIDs:
		return "token_ids"
	case SourceLogprobs:
		return "logprobs"
	case SourceEvents:
		return "events"
	}
	return "none"
}

// UsageOnly reports whether the chunk is the usage chunk that
// stream_options.include_usage adds: no choices, usage present.
func (c *Chunk) UsageOnly() bool { return (c.Usage || c.HasPrompt) && c.Choices == 0 && !c.Error }

// The members of an OpenAI chunk that the proxy's strip mode reads before
// the chunk is complete (proxy/strip.go): the usage chunk (UsageOnly) has
// an empty ChoicesMember array and a UsageMember, so a chunk whose
// choices array is non-empty is never it, and only a UsageMember is cut
// from one.
const (
	ChoicesMember = "choices"
	UsageMember   = "usage"
)

// TokenBearing reports whether the event carries generated output.
func (c *Chunk) TokenBearing() bool { return c.Output || c.Reasoning }

var doneMarker = []byte("[DONE]")

// ParseOpenAI reads one OpenAI Chat Completions or Completions payload
// (the data of one SSE event, or a whole non-streaming body) into c. It
// never allocates.
//
// Sources: the chunk and response schemas of OpenAI's API
// (openai/openai-openapi openapi.yaml: CreateChatCompletionStreamResponse,
// CreateCompletionResponse, CompletionUsage) as vLLM, SGLang, TGI,
// llama.cpp and Ollama serve them
// (../shared/research/engine-wire-formats-and-metrics.md §A1). Two engine
// additions are read too: llama.cpp's "timings" object on the last chunk
// (ggml-org/llama.cpp tools/server/server-task.cpp,
// to_json_oaicompat_chat_stream), and a llama.cpp native payload reaching
// an OpenAI route (its /completions without /v1 is the native one:
// tools/server/server.cpp registers post_completions there), recognised
// by a boolean "stop" and no "choices", and read by ParseLlamaCpp. One
// older shape is read too: TGI before 3.2.0 streamed a delta's
// tool_calls as one object rather than an array (output, each delta a
// token; not a call the structure checks read).
func ParseOpenAI(data []byte, c *Chunk) { parseOpenAI(data, c, nil) }

// parseOpenAI is ParseOpenAI, writing to t (when not nil) the answer
// text: each choice's delta.content, message.content and legacy text
// (not its reasoning nor its refusal).
func parseOpenAI(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	objectError, native := false, false
	// One pass over the payload (walkObject): the members read here are
	// walked in place, not skipped first and scanned again.
	ok := len(d) > 0 && d[0] == '{' && walkObject(d, 0, func(k []byte, v int) int {
		if string(k) == "choices" {
			c.Choices = 0
			if d[v] != '[' {
				return skipValue(d, v)
			}
			e := walkArray(d, v, func(e int) int {
				c.Choices++
				return parseChoiceAt(d, e, c, t)
			})
			if c.Choices > 1 && e >= 0 {
				c.ChoicesData = d[v:e]
			}
			return e
		}
		e := skipValue(d, v)
		if e < 0 {
			return e
		}
		val := d[v:e]
		switch string(k) {
		case "id":
			c.ID, _ = strVal(val)
		case "model":
			c.Model, _ = strVal(val)
		case "object":
			if s, _ := strVal(val); string(s) == "error" {
				objectError = true
			}
		case "type": // {"object":"error","type":...} or TGI's error_type
			if objectError || c.Error {
				if s, ok := strVal(val); ok && c.ErrorType == nil {
					c.ErrorType = s
				}
			}
		case "error_type":
			if s, ok := strVal(val); ok {
				c.ErrorType = s
			}
		case "code":
			if n, ok := intVal(val); ok && c.ErrorCode == 0 {
				c.ErrorCode = n
			}
		case "stop": // llama.cpp native: a boolean "stop" on every payload
			native = val[0] == 't' || val[0] == 'f'
		case "error":
			c.Error = true
			parseError(val, c)
		case "usage":
			readUsage(&usageOpenAI, val, c)
		case "timings": // llama.cpp, on the last chunk
			parseLlamaTimings(val, c)
		}
		return e
	}) == len(d)
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	if native && c.Choices < 0 && !c.Error && !objectError {
		parseLlamaCpp(data, c, t)
		return
	}
	if objectError {
		c.Error = true
	}
	if !c.Error {
		c.ErrorCode = 0 // a "code" member outside an error object means nothing
	}
}

func parseError(v []byte, c *Chunk) {
	if _, ok := strVal(v); ok { // TGI: "error":"message"
		if c.ErrorType == nil {
			c.ErrorType = []byte("error")
		}
		return
	}
	eachMember(v, func(k, v []byte) bool {
		switch string(k) {
		case "type":
			if s, ok := strVal(v); ok && len(s) > 0 {
				c.ErrorType = s
			}
		case "code":
			if n, ok := intVal(v); ok {
				c.ErrorCode = n
			} else if s, ok := strVal(v); ok && c.ErrorType == nil {
				c.ErrorType = s
			}
		case "http_status_code":
			if n, ok := intVal(v); ok {
				c.ErrorCode = n
			}
		}
		return true
	})
}

// IndexOutOfRange is Chunk.Index for a choice whose "index" is a number
// the parser does not read (10^18 is not read as 0: that pooled two
// choices into one). No readable index has this value.
const IndexOutOfRange = math.MinInt64

// EachChoice calls fn once for each element of a "choices" array (a
// Chunk's ChoicesData) that is an object, with that choice alone parsed
// into c: Choices 1, its Index (its position in the array when it has no
// integer "index"), Output, Reasoning, Tokens, TokensFrom and
// FinishReason; the rest of c is zero. c is overwritten for each element.
// It never allocates.
func EachChoice(choices []byte, c *Chunk, fn func(c *Chunk)) {
	if len(choices) == 0 || choices[0] != '[' {
		return
	}
	pos := int64(0)
	walkArray(choices, 0, func(e int) int {
		*c = Chunk{Choices: 1, Index: pos}
		pos++
		end := parseChoiceAt(choices, e, c, nil)
		if end >= 0 && choices[e] == '{' {
			fn(c)
		}
		return end
	})
}

// parseChoiceAt reads the choice at b[i] into c, and its answer text
// into t when t is not nil, and returns the index just after it (-1:
// malformed). A choice that is not an object is skipped. The choice's
// "index" is read into c.Index for the first choice of the payload only
// (c.Choices == 1).
func parseChoiceAt(b []byte, i int, c *Chunk, t *Collector) int {
	if b[i] != '{' {
		return skipValue(b, i)
	}
	return walkObject(b, i, func(k []byte, v int) int {
		switch string(k) {
		case "index":
			e := skipValue(b, v)
			if e >= 0 && c.Choices == 1 {
				if n, ok := intVal(b[v:e]); ok {
					c.Index = n
				} else if isNumber(b[v:e]) {
					c.Index = IndexOutOfRange
				}
			}
			return e
		case "delta", "message":
			if b[v] != '{' {
				return skipValue(b, v)
			}
			whole := k[0] == 'm' // a whole message, not a stream's delta
			return walkObject(b, v, func(k []byte, v int) int {
				switch string(k) {
				// A refusal is the model's answer, streamed as text
				// in its own member (OpenAI's structured outputs): output,
				// as Responses' response.refusal.delta is, but not answer
				// text.
				case "content", "refusal":
					e := skipValue(b, v)
					if e >= 0 && nonEmptyStr(b[v:e]) {
						c.Output = true
					}
					if t != nil && e >= 0 && k[0] == 'c' {
						t.add(b[v:e])
					}
					return e
				case "reasoning_content", "reasoning":
					e := skipValue(b, v)
					if e >= 0 && nonEmptyStr(b[v:e]) {
						c.Reasoning = true
					}
					return e
				case "tool_calls":
					n, e := countAt(b, v)
					switch {
					case n > 0:
						c.Output = true
						if t != nil && e >= 0 {
							openAIToolCalls(b[v:e], t, whole)
						}
					case n < 0 && b[v] == '{':
						// TGI before 3.2.0 streamed its one call as an
						// object, not an array (huggingface/text-generation-inference
						// #3075): output all the same, each delta a token
						// (read as none, a tool call's stream had no token
						// events). Its name is null and its arguments the
						// model's raw {"function": {"_name": ...}} text,
						// no call the structure checks can read: not collected.
						c.Output = true
					}
					return e
				case "function_call":
					if b[v] == '{' {
						c.Output = true
						e := skipValue(b, v)
						if t != nil && e >= 0 {
							openAIToolCall(b[v:e], t, 0, false)
						}
						return e
					}
				}
				return skipValue(b, v)
			})
		case "text": // legacy Completions
			e := skipValue(b, v)
			if e >= 0 && nonEmptyStr(b[v:e]) {
				c.Output = true
			}
			if t != nil && e >= 0 {
				t.add(b[v:e])
			}
			return e
		case "finish_reason":
			e := skipValue(b, v)
			if e >= 0 {
				if s, ok := strVal(b[v:e]); ok {
					c.FinishReason = s
				}
			}
			return e
		case "token_ids":
			n, e := countAt(b, v)
			if n > 0 {
				c.Tokens += int64(n)
				c.TokensFrom = SourceTokenIDs
			}
			return e
		case "logprobs":
			if c.TokensFrom == SourceTokenIDs || b[v] != '{' {
				return skipValue(b, v)
			}
			return walkObject(b, v, func(k []byte, v int) int {
				if string(k) != "content" && string(k) != "tokens" {
					return skipValue(b, v)
				}
				n, e := countAt(b, v)
				if n > 0 {
					c.Tokens += int64(n)
					c.TokensFrom = SourceLogprobs
				}
				return e
			})
		}
		return skipValue(b, v)
	})
}

// openAIToolCalls assembles the elements of a tool_calls array (a
// delta's, or a whole message's when whole) into t: each
// {index, id, function: {name, arguments}}, the arguments a string that
// the deltas of the call with that index continue. An element with no
// index is a call of its own, and so is every element of a whole
// message, whatever index it carries: the schema gives a whole call
// none (ChatCompletionMessageToolCall), and an engine that adds one
// does not number the calls by it (SGLang's non-streamed answer puts
// "index":-1 on every call: https://docs.sglang.io/advanced_features/tool_parser.html,
// its two parallel calls; keyed by it, they were one call whose
// arguments were two objects end to end).
func openAIToolCalls(v []byte, t *Collector, whole bool) {
	eachElement(v, func(call []byte) bool {
		openAIToolCall(call, t, newCall, whole)
		return true
	})
}

// openAIToolCall assembles one tool call into t, under the key callKey
// gives its index (absent: the key absent; a legacy function_call has
// no index and is the first call, 0), or as a new call when whole.
func openAIToolCall(call []byte, t *Collector, absent int64, whole bool) {
	var index []byte
	var name, args []byte
	eachMember(call, func(k, v []byte) bool {
		switch string(k) {
		case "index":
			index = v
		case "function":
			eachMember(v, func(k, v []byte) bool {
				switch string(k) {
				case "name":
					name = v
				case "arguments":
					args = v
				}
				return true
			})
		case "name": // function_call
			name = v
		case "arguments":
			args = v
		}
		return true
	})
	key := callKey(index, absent)
	if whole {
		key = newCall
	}
	key = t.callName(key, name)
	// The arguments are a string of JSON text; TGI before 3.2.0 sent a
	// whole call's as the JSON object itself (huggingface/text-generation-inference
	// #3076, router/src/lib.rs FunctionDefinition): taken as it is, where
	// read as a string it was no arguments at all.
	t.callArgs(key, args, !isObject(args))
}

// usageOpenAI: CompletionUsage (completion_tokens includes the
// completion_tokens_details.reasoning_tokens).
var usageOpenAI = Usage{Input: []string{"prompt_tokens"}, Cached: []string{"prompt_tokens_details.cached_tokens"},
	Output: []string{"completion_tokens"}}

// Rejection reports whether an error chunk means the engine refused
// admission (overload) rather than failing a request it had taken.
func (c *Chunk) Rejection() bool {
	if c.ErrorCode == 429 || c.ErrorCode == 503 {
		return true
	}
	t := c.ErrorType
	return containsFold(t, "overload") || containsFold(t, "rate_limit") || containsFold(t, "capacity")
}

func containsFold(s []byte, sub string) bool {
	n := len(sub)
	for i := 0; i+n <= len(s); i++ {
		match := true
		for j := 0; j < n; j++ {
			c := s[i+j]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
