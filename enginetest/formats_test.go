package enginetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"
)

// maxTokens is every request's token limit; the model never stops before
// it (internal/gguf), so every answer has exactly this many tokens.
const maxTokens = 16

// timingBound is how far the record's TTFT and E2E may be from this
// client's own measurement of the same request. Issue 11 asks for 2 ms on
// /api/chat; it holds for every format.
const timingBound = 2 * time.Millisecond

// format is one way to ask Ollama for an answer.
type format struct {
	name   string
	path   string
	body   string
	api    string // the record's api
	stream bool
	// countBody, when set, is the same request asking for usage: sent
	// direct, its answer gives Ollama's own count where the answer to body
	// carries none (a stream whose client did not ask for usage).
	countBody string
	injected  bool   // the sidecar must ask for usage (and strip it)
	finish    string // the record's finish_reason ("": not asserted)
	isToken   func(line []byte) bool
	// terminal says whether a line is the format's end marker (streams).
	terminal func(line []byte) bool
}

func chatBody(stream, usage bool) string {
	b := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say something."}],"stream":%v,"max_tokens":%d,"temperature":0,"seed":%d`, modelName, stream, maxTokens, seed)
	if usage {
		b += `,"stream_options":{"include_usage":true}`
	}
	return b + "}"
}

func completionsBody(stream, usage bool) string {
	b := fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","stream":%v,"max_tokens":%d,"temperature":0,"seed":%d`, modelName, stream, maxTokens, seed)
	if usage {
		b += `,"stream_options":{"include_usage":true}`
	}
	return b + "}"
}

func formats() []format {
	var fs []format
	for _, stream := range []bool{true, false} {
		for _, usage := range []bool{false, true} {
			if !stream && usage {
				continue // include_usage is for streams only
			}
			name := map[bool]string{true: "stream", false: "plain"}[stream]
			if stream {
				name += map[bool]string{true: "+usage", false: "+nousage"}[usage]
			}
			chat := format{name: "chat/" + name, path: "/v1/chat/completions", body: chatBody(stream, usage), api: "chat", stream: stream,
				finish: "length", isToken: sseData(chatToken), terminal: sseDone}
			compl := format{name: "completions/" + name, path: "/v1/completions", body: completionsBody(stream, usage), api: "completions", stream: stream,
				finish: "length", isToken: sseData(completionsToken), terminal: sseDone}
			if stream && !usage {
				chat.countBody, chat.injected = chatBody(true, true), true
				compl.countBody, compl.injected = completionsBody(true, true), true
			}
			fs = append(fs, chat, compl)
		}
		fs = append(fs,
			format{name: "responses/" + plain(stream), path: "/v1/responses", api: "responses", stream: stream,
				body:    fmt.Sprintf(`{"model":%q,"input":"Say something.","stream":%v,"max_output_tokens":%d,"temperature":0}`, modelName, stream, maxTokens),
				isToken: sseData(typedDelta("response.output_text.delta", "response.reasoning_text.delta", "response.reasoning_summary_text.delta", "response.function_call_arguments.delta")),
				terminal: sseData(func(o map[string]any) bool {
					return o["type"] == "response.completed" || o["type"] == "response.incomplete" || o["type"] == "response.failed"
				})},
			format{name: "messages/" + plain(stream), path: "/v1/messages", api: "messages", stream: stream, finish: "max_tokens",
				body:     fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"Say something."}],"stream":%v,"temperature":0}`, modelName, maxTokens, stream),
				isToken:  sseData(messagesToken),
				terminal: sseData(func(o map[string]any) bool { return o["type"] == "message_stop" })},
			format{name: "ollama_chat/" + plain(stream), path: "/api/chat", api: "ollama_chat", stream: stream, finish: "length",
				body: fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say something."}],"stream":%v,"options":{"num_predict":%d,"temperature":0,"seed":%d}}`, modelName, stream, maxTokens, seed),
				isToken: ndjson(func(o map[string]any) bool {
					return str(o, "message", "content") != "" || str(o, "message", "thinking") != ""
				}),
				terminal: ndjson(func(o map[string]any) bool { return o["done"] == true })},
			format{name: "ollama_generate/" + plain(stream), path: "/api/generate", api: "ollama_generate", stream: stream, finish: "length",
				body:     fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","stream":%v,"options":{"num_predict":%d,"temperature":0,"seed":%d}}`, modelName, stream, maxTokens, seed),
				isToken:  ndjson(func(o map[string]any) bool { return str(o, "response") != "" || str(o, "thinking") != "" }),
				terminal: ndjson(func(o map[string]any) bool { return o["done"] == true })},
		)
	}
	return fs
}

func plain(stream bool) string {
	if stream {
		return "stream"
	}
	return "plain"
}

// TestFormats sends each format's request to Ollama directly, then the
// same request through the sidecar, and checks:
//
//   - bytes: the client's body through the sidecar equals the direct one
//     after masks_test.go's masks (ids and clock values), with the same
//     status and Content-Type;
//   - tokens: the record's output_tokens and input_tokens equal Ollama's
//     own counts (usage.completion_tokens/prompt_tokens, output_tokens/
//     input_tokens, eval_count/prompt_eval_count), its api, stream,
//     outcome and finish reason are right, and for Ollama's native API the
//     engine's own durations (engine_*) are in the record;
//   - timing (streams): the record's TTFT and E2E are within timingBound
//     of this client's own instants of the first token-bearing line and of
//     the end marker. Clocks: the record's "start" is the wall-clock time
//     of t_arrive and every *_ms is a monotonic offset from it; the client
//     stamps each line with the wall clock of the same machine (one
//     CLOCK_REALTIME for both processes), so client_ms = line − start is
//     on the record's axis, and client_ms − ttft_ms is the time from the
//     sidecar's read of those bytes to this client's read of the line. The
//     client's TTFT from its own send instant (line − sent) is checked
//     against ttft_ms as well: it differs by the request's trip from the
//     client to the sidecar.
func TestFormats(t *testing.T) {
	w := setup(t)
	for _, mode := range ioModes {
		t.Run(mode.name, func(t *testing.T) {
			s := startSidecar(t, w, mode.args...)
			for _, f := range formats() {
				t.Run(f.name, func(t *testing.T) {
					var tok func([]byte) bool
					if f.stream {
						tok = f.isToken
					}
					direct := post(t, w.ollama, f.path, f.body, tok)
					via := post(t, s.proxy, f.path, f.body, tok)
					r := s.next(t)
					if direct.status != 200 {
						t.Fatalf("direct: %d %s", direct.status, direct.body)
					}
					countFrom := direct.body
					if f.countBody != "" {
						countFrom = post(t, w.ollama, f.path, f.countBody, nil).body
					}
					in, out, ok := engineCounts(countFrom)
					if !ok {
						t.Fatalf("no token counts in Ollama's answer:\n%s", countFrom)
					}
					t.Logf("ollama: %d input, %d output tokens; record: %s", in, out, r)

					t.Run("bytes", func(t *testing.T) {
						if via.status != direct.status || via.header.Get("Content-Type") != direct.header.Get("Content-Type") {
							t.Errorf("status %d %q through the sidecar, direct %d %q", via.status, via.header.Get("Content-Type"), direct.status, direct.header.Get("Content-Type"))
						}
						a, b := mask(direct.body), mask(via.body)
						if !bytes.Equal(a, b) {
							t.Errorf("masked bodies differ: %d bytes direct, %d through the sidecar; first difference:\n%s", len(a), len(b), firstDiff(a, b))
						} else {
							t.Logf("equal after masks: %d bytes (%d raw direct, %d raw through the sidecar)", len(a), len(direct.body), len(via.body))
						}
					})
					t.Run("tokens", func(t *testing.T) {
						if out != maxTokens {
							t.Errorf("ollama counted %d output tokens, the model should always give %d", out, maxTokens)
						}
						if r.API != f.api || r.Stream != f.stream || r.Outcome != "success" || r.HTTPStatus != 200 {
							t.Errorf("record api %q stream %v outcome %q status %d; want %q %v success 200", r.API, r.Stream, r.Outcome, r.HTTPStatus, f.api, f.stream)
						}
						if r.OutputTokens == nil || *r.OutputTokens != out {
							t.Errorf("record output_tokens %v (token_source %q), ollama's %d", deref(r.OutputTokens), r.TokenSource, out)
						}
						if r.InputTokens == nil || *r.InputTokens != in {
							t.Errorf("record input_tokens %v, ollama's %d", deref(r.InputTokens), in)
						}
						if f.finish != "" && r.FinishReason != f.finish {
							t.Errorf("record finish_reason %q, want %q", r.FinishReason, f.finish)
						}
						if r.Injected != f.injected {
							t.Errorf("record usage_injected %v, want %v", r.Injected, f.injected)
						}
						if r.Malformed || r.TapFailed != "" {
							t.Errorf("record malformed %v tap_failed %q", r.Malformed, r.TapFailed)
						}
						if f.stream && r.TokenEvents != via.tokens {
							t.Errorf("record token_events %d, this client saw %d token-bearing lines", r.TokenEvents, via.tokens)
						}
						if strings.HasPrefix(f.api, "ollama_") {
							var eng []string
							for k, v := range r.raw {
								if _, num := v.(float64); strings.HasPrefix(k, "engine_") && num {
									eng = append(eng, fmt.Sprintf("%s=%v", k, v))
								}
							}
							sort.Strings(eng)
							if len(eng) == 0 {
								t.Errorf("no engine_* durations in the record (ollama reports prompt_eval_duration, eval_duration, load_duration)")
							}
							t.Logf("engine fields: %s", strings.Join(eng, " "))
						}
					})
					t.Run("timing", func(t *testing.T) {
						// Up to timingAttempts requests: a core taken by another
						// process for a millisecond on a busy two-core machine is
						// not the sidecar's error, but a wrong instant fails every
						// attempt.
						x, r := via, r
						for attempt := 1; ; attempt++ {
							var errs []error
							check := func(what string, at time.Time, got *float64) {
								msg, err := near(what, at, r, got, x.sent)
								t.Logf("attempt %d: %s", attempt, msg)
								if err != nil {
									errs = append(errs, err)
								}
							}
							switch {
							case !f.stream:
								// One JSON body: its end is E2E.
								check("E2E (end of body)", x.end, r.E2Ems)
							case x.first.IsZero():
								t.Fatalf("no token-bearing line through the sidecar:\n%s", x.body)
							default:
								check("TTFT (first token line)", x.first, r.TTFTms)
								check("E2E (end-marker line)", x.last, r.E2Ems)
							}
							if len(errs) == 0 {
								return
							}
							if attempt == timingAttempts {
								for _, err := range errs {
									t.Error(err)
								}
								return
							}
							x, r = post(t, s.proxy, f.path, f.body, tok), s.next(t)
						}
					})
				})
			}
			loopCarried(t, s, mode.loop)
		})
	}
}

// timingAttempts bounds the requests of one timing check.
const timingAttempts = 3

// near compares the record's offset got (ms from t_arrive) with the
// client's wall-clock instant at: aligned through the record's start, and
// from the client's own send instant.
func near(what string, at time.Time, r rec, got *float64, sent time.Time) (string, error) {
	if got == nil {
		return what + ": none in the record", fmt.Errorf("%s: the record has none: %s", what, r)
	}
	start, err := time.Parse(time.RFC3339Nano, r.Start)
	if err != nil {
		return "", fmt.Errorf("record start %q: %v", r.Start, err)
	}
	clientMs := float64(at.Sub(start).Nanoseconds()) / 1e6
	fromSend := float64(at.Sub(sent).Nanoseconds()) / 1e6
	arriveLag := float64(start.Sub(sent).Nanoseconds()) / 1e6
	d := clientMs - *got
	msg := fmt.Sprintf("%s: record %.3f ms; client %.3f ms on the record's clock (Δ %+.3f ms), %.3f ms from its send (Δ %+.3f ms); send→t_arrive %.3f ms",
		what, *got, clientMs, d, fromSend, fromSend-*got, arriveLag)
	bound := float64(timingBound.Microseconds()) / 1e3
	if math.Abs(d) > bound {
		return msg, fmt.Errorf("%s: record %.3f ms, client %.3f ms: |Δ| %.3f ms > %.1f ms", what, *got, clientMs, math.Abs(d), bound)
	}
	if math.Abs(fromSend-*got) > bound {
		return msg, fmt.Errorf("%s: record %.3f ms, client (from its send) %.3f ms: |Δ| %.3f ms > %.1f ms", what, *got, fromSend, math.Abs(fromSend-*got), bound)
	}
	return msg, nil
}

// jsonObjects are the JSON objects of an answer: each SSE data line, each
// NDJSON line, or the whole body.
func jsonObjects(body []byte) []map[string]any {
	var out []map[string]any
	for line := range bytes.Lines(body) {
		line = bytes.TrimSpace(line)
		line = bytes.TrimPrefix(line, []byte("data: "))
		var o map[string]any
		if json.Unmarshal(line, &o) == nil {
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		var o map[string]any
		if json.Unmarshal(body, &o) == nil {
			out = append(out, o)
		}
	}
	return out
}

// engineCounts finds Ollama's own token counts in an answer: the last
// non-zero usage (OpenAI, Responses, Messages) or the done line's
// prompt_eval_count and eval_count (native).
func engineCounts(body []byte) (in, out int, ok bool) {
	for _, o := range jsonObjects(body) {
		if o["done"] == true {
			in, out, ok = num(o, "prompt_eval_count"), num(o, "eval_count"), true
		}
		for _, u := range []any{o["usage"], dig(o, "response", "usage"), dig(o, "message", "usage")} {
			u, _ := u.(map[string]any)
			if u == nil {
				continue
			}
			if n := num(u, "completion_tokens") + num(u, "output_tokens"); n > 0 {
				in, out, ok = num(u, "prompt_tokens")+num(u, "input_tokens"), n, true
			}
		}
	}
	return in, out, ok
}

func dig(o map[string]any, path ...string) any {
	var v any = o
	for _, k := range path {
		m, _ := v.(map[string]any)
		if m == nil {
			return nil
		}
		v = m[k]
	}
	return v
}

func num(o map[string]any, k string) int {
	f, _ := o[k].(float64)
	return int(f)
}

func str(o map[string]any, path ...string) string {
	s, _ := dig(o, path...).(string)
	return s
}

// Line classifiers.

func sseData(f func(map[string]any) bool) func([]byte) bool {
	return func(line []byte) bool {
		d, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			return false
		}
		var o map[string]any
		return json.Unmarshal(d, &o) == nil && f(o)
	}
}

func sseDone(line []byte) bool { return string(bytes.TrimSpace(line)) == "data: [DONE]" }

func ndjson(f func(map[string]any) bool) func([]byte) bool {
	return func(line []byte) bool {
		var o map[string]any
		return json.Unmarshal(line, &o) == nil && f(o)
	}
}

func chatToken(o map[string]any) bool {
	cs, _ := o["choices"].([]any)
	for _, c := range cs {
		c, _ := c.(map[string]any)
		if str(c, "delta", "content") != "" || str(c, "delta", "reasoning") != "" || str(c, "delta", "reasoning_content") != "" || dig(c, "delta", "tool_calls") != nil {
			return true
		}
	}
	return false
}

func completionsToken(o map[string]any) bool {
	cs, _ := o["choices"].([]any)
	for _, c := range cs {
		c, _ := c.(map[string]any)
		if str(c, "text") != "" {
			return true
		}
	}
	return false
}

func typedDelta(types ...string) func(map[string]any) bool {
	return func(o map[string]any) bool {
		for _, ty := range types {
			if o["type"] == ty && str(o, "delta") != "" {
				return true
			}
		}
		return false
	}
}

func messagesToken(o map[string]any) bool {
	return o["type"] == "content_block_delta" &&
		(str(o, "delta", "text") != "" || str(o, "delta", "thinking") != "" || str(o, "delta", "partial_json") != "")
}

// firstDiff shows where a and b first differ, with some context.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-120)
	cut := func(x []byte) string { return string(x[lo:min(len(x), i+120)]) }
	return fmt.Sprintf("at byte %d\n  direct:  %q\n  sidecar: %q", i, cut(a), cut(b))
}
