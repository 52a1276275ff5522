package proxy

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Every wire format through the real proxy, in front of a scripted
// upstream whose events are read at known instants: the instants come
// from a fake clock the upstream sets before each write, and the upstream
// writes the next event only once the client has received the last one
// (the tap timestamps a read before the bytes reach the client), so every
// latency is exact, not within a tolerance.

// step is one upstream write at a known instant; client is what the
// client receives of it (the same bytes unless the sidecar cuts some).
type step struct {
	at          time.Duration
	raw, client string
}

// lockstep serves steps in lockstep with the test's client.
type lockstepUp struct {
	t      *testing.T
	ct     string
	status int
	header http.Header
	steps  []step
	clock  *testtool.Clock
	ack    chan struct{}
	body   chan []byte // the request bodies it saw
}

func (u *lockstepUp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	select {
	case u.body <- b:
	default:
	}
	for k, v := range u.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", u.ct)
	w.WriteHeader(u.status)
	for _, s := range u.steps {
		u.clock.Set(s.at)
		io.WriteString(w, s.raw)
		w.(http.Flusher).Flush()
		if s.client == "" {
			continue
		}
		select {
		case <-u.ack:
		case <-time.After(10 * time.Second):
			u.t.Errorf("the client never received %q", s.client)
			return
		}
	}
}

// runLockstep sends one request through a proxy in front of u and reads
// the answer in lockstep; it returns the record.
func runLockstep(t *testing.T, u *lockstepUp, opts Options, path, body string) (*record.Record, string) {
	t.Helper()
	u.t, u.ack, u.body = t, make(chan struct{}), make(chan []byte, 1)
	if u.status == 0 {
		u.status = 200
	}
	u.clock = testtool.NewClock(time.Unix(1_700_000_000, 0))
	opts.Clock = u.clock
	fs, sink := front(t, u, opts)
	resp, err := http.Post(fs.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got strings.Builder
	for _, s := range u.steps {
		if s.client == "" {
			continue
		}
		buf := make([]byte, len(s.client))
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatalf("reading %q: %v (so far %q)", s.client, err, got.String())
		}
		got.Write(buf)
		if string(buf) != s.client {
			t.Fatalf("client got %q, want %q", buf, s.client)
		}
		u.ack <- struct{}{}
	}
	rest, _ := io.ReadAll(resp.Body)
	if len(rest) > 0 {
		t.Fatalf("client got %q more than expected", rest)
	}
	got.Write(rest)
	return waitOne(t, sink), got.String()
}

// waitOne waits for the request's record: the client can read the whole
// body (a Content-Length one) before the handler has published it.
func waitOne(t *testing.T, c *collect) *record.Record {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.mu.Lock()
		n := len(c.recs)
		c.mu.Unlock()
		if n > 0 {
			break
		}
	}
	return only(t, c)
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "stream", "testdata", "fixtures", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fixtureSteps splits a recorded stream into its events (SSE events, or
// NDJSON lines), each written at its own instant: event k at at[k].
func fixtureSteps(t *testing.T, name string, ndjson bool, at func(k int) time.Duration) []step {
	t.Helper()
	b := readFixture(t, name)
	var cuts []int64
	on := func(e *stream.Event) { cuts = append(cuts, e.End) }
	if ndjson {
		var lf stream.LineFramer
		lf.Feed(b, on)
		lf.Finish(on)
	} else {
		var f stream.Framer
		f.Feed(b, on)
		f.Finish(on)
	}
	var steps []step
	prev := int64(0)
	for k, c := range cuts {
		raw := string(b[prev:c])
		steps = append(steps, step{at: at(k), raw: raw, client: raw})
		prev = c
	}
	if prev != int64(len(b)) {
		t.Fatalf("%s: %d bytes after the last event", name, int64(len(b))-prev)
	}
	return steps
}

// irregular instants: event k at the sum of the first k+1 gaps of a
// cycle, so that no two gaps in a row are equal.
func irregular(k int) time.Duration {
	gaps := []time.Duration{7, 13, 5, 31, 11, 17}
	var d time.Duration
	for i := 0; i <= k; i++ {
		d += gaps[i%len(gaps)] * time.Millisecond
	}
	return d
}

type want struct {
	api                 stream.Name
	stream              bool
	outcome             record.Outcome
	errorType           string
	errorCode           int64
	finish              string
	tokenEvents         []int // indices of the token-bearing events
	firstOutput         int   // index of the first output event (-1: none)
	terminal            int   // index of the terminal event (-1: EOF)
	in, out             int64
	source, responseID  string
	engine              record.EngineTimes
	injected, malformed bool
}

func checkRecord(t *testing.T, r *record.Record, steps []step, w want) {
	t.Helper()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	if r.API != w.api || r.Stream != w.stream || r.Outcome != w.outcome || r.ErrorType != w.errorType || r.ErrorCode != w.errorCode {
		t.Errorf("api/stream/outcome/error: %s/%v/%s/%q/%d, want %s/%v/%s/%q/%d", r.API, r.Stream, r.Outcome, r.ErrorType, r.ErrorCode,
			w.api, w.stream, w.outcome, w.errorType, w.errorCode)
	}
	if r.FinishReason != w.finish || r.InputTokens != w.in || r.OutputTokens != w.out || r.TokenSource != w.source ||
		r.ResponseID != w.responseID || r.UsageInjected != w.injected || r.Malformed != w.malformed {
		t.Errorf("finish %q in %d out %d source %s id %q injected %v malformed %v; want %q %d %d %s %q %v %v",
			r.FinishReason, r.InputTokens, r.OutputTokens, r.TokenSource, r.ResponseID, r.UsageInjected, r.Malformed,
			w.finish, w.in, w.out, w.source, w.responseID, w.injected, w.malformed)
	}
	if r.Engine != w.engine {
		t.Errorf("engine times %+v, want %+v", r.Engine, w.engine)
	}
	// Token instants, TTFT, TTFOT, gaps, TPOT, max ITL, E2E: exact.
	var wantAt []time.Duration
	for _, k := range w.tokenEvents {
		wantAt = append(wantAt, steps[k].at)
	}
	if len(r.TokenAt) != len(wantAt) {
		t.Fatalf("token_ms %v, want %v", r.TokenAt, wantAt)
	}
	var maxGap time.Duration
	for i := range wantAt {
		if r.TokenAt[i] != wantAt[i] {
			t.Errorf("token %d at %v, want %v", i, r.TokenAt[i], wantAt[i])
		}
		if i > 0 {
			maxGap = max(maxGap, wantAt[i]-wantAt[i-1])
		}
	}
	ttft, ok := r.TTFT()
	if len(wantAt) > 0 && (!ok || ttft != wantAt[0]) {
		t.Errorf("ttft %v (%v), want %v", ttft, ok, wantAt[0])
	}
	ttfot, ok := r.TTFOT()
	switch {
	case w.firstOutput >= 0 && (!ok || ttfot != steps[w.firstOutput].at):
		t.Errorf("ttfot %v (%v), want %v", ttfot, ok, steps[w.firstOutput].at)
	case w.firstOutput < 0 && ok:
		t.Errorf("ttfot %v, want none", ttfot)
	}
	if len(wantAt) >= 2 && r.MaxGap != maxGap {
		t.Errorf("max itl %v, want %v", r.MaxGap, maxGap)
	}
	tpot, ok := r.TPOT()
	if n := w.out; n >= 2 && len(wantAt) > 0 {
		want := (wantAt[len(wantAt)-1] - wantAt[0]) / time.Duration(n-1)
		if !ok || tpot != want {
			t.Errorf("tpot %v (%v), want %v = (%.3f-%.3f)/%d", tpot, ok, want, ms(wantAt[len(wantAt)-1]), ms(wantAt[0]), n-1)
		}
	} else if ok {
		t.Errorf("tpot %v, want undefined", tpot)
	}
	e2e, _ := r.E2E()
	wantE2E := steps[len(steps)-1].at
	if w.terminal >= 0 {
		wantE2E = steps[w.terminal].at
	}
	if e2e != wantE2E {
		t.Errorf("e2e %v, want %v", e2e, wantE2E)
	}
}

func TestFormatsScripted(t *testing.T) {
	ollamaEngine := record.EngineTimes{Total: 4883583458, Load: 1334875, Prompt: 342546000, Decode: 4535599000,
		Known: record.EngineTotal | record.EngineLoad | record.EnginePrompt | record.EngineDecode}
	cases := []struct {
		name, fixture, ct, path, body string
		ndjson                        bool
		w                             want
	}{
		{"chat (vLLM)", "openai_chat_vllm.sse", "text/event-stream", "/v1/chat/completions",
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, false,
			want{api: stream.NameChat, stream: true, outcome: record.Success, finish: "stop", tokenEvents: []int{1, 2}, firstOutput: 1,
				terminal: 4, in: 12, out: 2, source: "usage", responseID: "chatcmpl-X"}},
		{"responses (Ollama)", "responses_ollama.sse", "text/event-stream", "/v1/responses",
			`{"model":"tiny","stream":true,"input":"hi"}`, false,
			want{api: stream.NameResponses, stream: true, outcome: record.Success, finish: "completed", tokenEvents: []int{3, 8, 9},
				firstOutput: 8, terminal: 13, in: 9, out: 3, source: "usage", responseID: "resp_424"}},
		{"responses error event", "responses_openai_error.sse", "text/event-stream", "/v1/responses",
			`{"model":"m","stream":true,"input":"hi"}`, false,
			want{api: stream.NameResponses, stream: true, outcome: record.Error, errorType: record.ErrStreamError, tokenEvents: []int{1},
				firstOutput: 1, terminal: 2, in: -1, out: 1, source: "events", responseID: "resp_123"}},
		{"messages (Ollama)", "messages_ollama.sse", "text/event-stream", "/v1/messages",
			`{"model":"tiny","max_tokens":16,"stream":true,"messages":[]}`, false,
			want{api: stream.NameMessages, stream: true, outcome: record.Success, finish: "end_turn", tokenEvents: []int{2, 5, 6},
				firstOutput: 5, terminal: 9, in: 9, out: 3, source: "usage", responseID: "msg_0123456789abcdef01234567"}},
		{"messages overloaded", "messages_anthropic_overloaded.sse", "text/event-stream", "/v1/messages",
			`{"model":"m","max_tokens":16,"stream":true,"messages":[]}`, false,
			want{api: stream.NameMessages, stream: true, outcome: record.Rejected, errorType: record.ErrRejected, tokenEvents: []int{4},
				firstOutput: 4, terminal: 5, in: 33, out: 1, source: "events", responseID: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY"}},
		{"ollama chat", "ollama_chat.ndjson", "application/x-ndjson", "/api/chat",
			`{"model":"llama3.2","messages":[]}`, true, // Ollama streams by default
			want{api: stream.NameOllamaChat, stream: true, outcome: record.Success, finish: "stop", tokenEvents: []int{0, 1},
				firstOutput: 0, terminal: 2, in: 26, out: 282, source: "usage", engine: ollamaEngine}},
		{"ollama generate", "ollama_generate.ndjson", "application/x-ndjson", "/api/generate",
			`{"model":"qwen3","prompt":"hi","options":{"num_predict":2}}`, true,
			want{api: stream.NameOllamaGenerate, stream: true, outcome: record.Success, finish: "length", tokenEvents: []int{0, 1},
				firstOutput: 1, terminal: 2, in: 4, out: 2, source: "usage",
				engine: record.EngineTimes{Total: 99 * time.Millisecond, Load: 5 * time.Millisecond, Prompt: 20 * time.Millisecond,
					Decode: 70 * time.Millisecond, Known: record.EngineTotal | record.EngineLoad | record.EnginePrompt | record.EngineDecode}}},
		{"ollama error line", "ollama_generate_error.ndjson", "application/x-ndjson", "/api/generate",
			`{"model":"qwen3","prompt":"hi"}`, true,
			want{api: stream.NameOllamaGenerate, stream: true, outcome: record.Error, errorType: record.ErrStreamError, tokenEvents: []int{0, 1},
				firstOutput: 1, terminal: 2, in: -1, out: 2, source: "events"}},
		{"tgi generate_stream", "tgi_generate_stream.sse", "text/event-stream", "/generate_stream",
			`{"inputs":"hi","parameters":{"max_new_tokens":2,"details":true}}`, false,
			want{api: stream.NameTGIGenerate, stream: true, outcome: record.Success, finish: "eos_token", tokenEvents: []int{0, 1},
				firstOutput: 0, terminal: 1, in: 7, out: 2, source: "usage"}},
		{"tgi overloaded", "tgi_generate_stream_overloaded.sse", "text/event-stream", "/generate_stream",
			`{"inputs":"hi"}`, false,
			want{api: stream.NameTGIGenerate, stream: true, outcome: record.Rejected, errorType: record.ErrRejected, tokenEvents: []int{0},
				firstOutput: 0, terminal: 2, in: -1, out: 1, source: "token_ids"}},
		{"llama.cpp completion", "llamacpp_completion.sse", "text/event-stream", "/completion",
			`{"prompt":"hi","n_predict":2,"stream":true}`, false,
			want{api: stream.NameLlamaCppCompletion, stream: true, outcome: record.Success, finish: "limit", tokenEvents: []int{0, 1},
				firstOutput: 0, terminal: 2, in: 12, out: 2, source: "usage",
				engine: record.EngineTimes{Prompt: 12500 * time.Microsecond, Decode: 30250 * time.Microsecond, Known: record.EnginePrompt | record.EngineDecode}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := fixtureSteps(t, tc.fixture, tc.ndjson, irregular)
			u := &lockstepUp{ct: tc.ct, steps: steps}
			r, _ := runLockstep(t, u, Options{InjectUsage: true}, tc.path, tc.body)
			tc.w.malformed = false
			checkRecord(t, r, steps, tc.w)
			if tc.w.outcome == record.Success && r.TapFailed != "" {
				t.Errorf("tap failed: %s", r.TapFailed)
			}
		})
	}
}

// Ollama's /v1/completions under injected include_usage: the engine puts
// a zero usage on every chunk and a usage chunk at the end. The client
// gets the chunks as they would have been without the sidecar (the usage
// member removed, the rest byte for byte; the usage chunk cut), and the
// record has the real counts: the zeros never overwrite them.
func TestOllamaCompletionsUsageMembersRemoved(t *testing.T) {
	steps := fixtureSteps(t, "openai_completions_ollama_usage.sse", false, irregular)
	plain := fixtureSteps(t, "openai_completions_ollama.sse", false, irregular)
	for k := range steps {
		switch {
		case k < 4:
			steps[k].client = plain[k].raw
		case k == 4:
			steps[k].client = "" // the usage chunk: cut
		default:
			steps[k].client = plain[4].raw // [DONE]
		}
	}
	u := &lockstepUp{ct: "text/event-stream", steps: steps}
	r, got := runLockstep(t, u, Options{InjectUsage: true}, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":3,"stream":true}`)
	if want := string(readFixture(t, "openai_completions_ollama.sse")); got != want {
		t.Fatalf("client bytes differ from the engine's without usage:\n got %q\nwant %q", got, want)
	}
	if !bytes.Contains(<-u.body, []byte(`"include_usage":true`)) {
		t.Fatal("the sidecar did not ask for usage")
	}
	checkRecord(t, r, steps, want{api: stream.NameCompletions, stream: true, outcome: record.Success, finish: "length",
		tokenEvents: []int{0, 1, 2}, firstOutput: 0, terminal: 5, in: 5, out: 3, source: "usage", responseID: "cmpl-424", injected: true})
}

// A zero usage on content chunks, with the real usage chunk missing (the
// stream was cut): the zeros are placeholders, not a count.
func TestZeroUsageIsNotACount(t *testing.T) {
	steps := fixtureSteps(t, "openai_completions_ollama_usage.sse", false, irregular)[:4]
	u := &lockstepUp{ct: "text/event-stream", steps: steps}
	r, _ := runLockstep(t, u, Options{}, "/v1/completions", `{"model":"tiny","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`)
	if r.TokenSource != "events" || r.OutputTokens != 3 || r.InputTokens != -1 {
		t.Fatalf("source %s out %d in %d, want 3 counted events and an unknown input", r.TokenSource, r.OutputTokens, r.InputTokens)
	}
}

// Non-streaming bodies of every format: counts, finish reason, id, the
// engine's timings; no TTFT.
func TestFormatsWholeBodies(t *testing.T) {
	cases := []struct {
		name, path, req, body string
		header                http.Header
		w                     want
	}{
		{"responses", "/v1/responses", `{"model":"m","input":"hi"}`,
			`{"id":"resp_9","object":"response","status":"completed","model":"m","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":5,"output_tokens":7,"input_tokens_details":{"cached_tokens":0}}}`, nil,
			want{api: stream.NameResponses, outcome: record.Success, finish: "completed", in: 5, out: 7, source: "usage", responseID: "resp_9", terminal: -1, firstOutput: -1}},
		{"messages", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[]}`,
			`{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":4,"output_tokens":2}}`, nil,
			want{api: stream.NameMessages, outcome: record.Success, finish: "end_turn", in: 4, out: 2, source: "usage", responseID: "msg_2", terminal: -1, firstOutput: -1}},
		{"ollama chat", "/api/chat", `{"model":"m","stream":false,"messages":[]}`,
			`{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":true,"done_reason":"stop","total_duration":3000000,"prompt_eval_count":6,"eval_count":2}`, nil,
			want{api: stream.NameOllamaChat, outcome: record.Success, finish: "stop", in: 6, out: 2, source: "usage", terminal: -1, firstOutput: -1,
				engine: record.EngineTimes{Total: 3 * time.Millisecond, Known: record.EngineTotal}}},
		{"tgi generate, headers", "/generate", `{"inputs":"hi"}`, `{"generated_text":"Hi"}`,
			http.Header{"X-Queue-Time": {"3"}, "X-Inference-Time": {"40"}, "X-Total-Time": {"45"}, "X-Prompt-Tokens": {"5"}, "X-Generated-Tokens": {"4"}},
			want{api: stream.NameTGIGenerate, outcome: record.Success, in: 5, out: 4, source: "usage", terminal: -1, firstOutput: -1,
				engine: record.EngineTimes{Queue: 3 * time.Millisecond, Inference: 40 * time.Millisecond, Total: 45 * time.Millisecond,
					Known: record.EngineQueue | record.EngineInference | record.EngineTotal}}},
		{"llama.cpp", "/completion", `{"prompt":"hi"}`,
			`{"index":0,"content":"Hi","tokens":[],"id_slot":0,"stop":true,"model":"x","tokens_predicted":2,"tokens_evaluated":3,"stop_type":"eos","timings":{"prompt_ms":1.5,"predicted_ms":2.25}}`, nil,
			want{api: stream.NameLlamaCppCompletion, outcome: record.Success, finish: "eos", in: 3, out: 2, source: "usage", terminal: -1, firstOutput: -1,
				engine: record.EngineTimes{Prompt: 1500 * time.Microsecond, Decode: 2250 * time.Microsecond, Known: record.EnginePrompt | record.EngineDecode}}},
		// Several prompts: an array of results (tools/server/README.md,
		// /completion), which was malformed, its counts lost.
		{"llama.cpp, several prompts", "/completion", `{"prompt":["hi","yo"]}`,
			`[{"index":0,"content":"Hi","tokens":[],"id_slot":0,"stop":true,"model":"x","tokens_predicted":2,"tokens_evaluated":3,"stop_type":"eos","timings":{"prompt_ms":1.5,"predicted_ms":2.25}},` +
				`{"index":1,"content":"Yo","tokens":[],"id_slot":1,"stop":true,"model":"x","tokens_predicted":4,"tokens_evaluated":3,"stop_type":"limit","timings":{"prompt_ms":1.25,"predicted_ms":4}}]`, nil,
			want{api: stream.NameLlamaCppCompletion, outcome: record.Success, finish: "limit", in: 6, out: 6, source: "usage", terminal: -1, firstOutput: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := []step{{at: 9 * time.Millisecond, raw: tc.body, client: tc.body}}
			u := &lockstepUp{ct: "application/json", steps: steps, header: tc.header}
			opts := Options{}
			if tc.path == "/generate" {
				opts.Engine = EngineTGI
			}
			r, _ := runLockstep(t, u, opts, tc.path, tc.req)
			checkRecord(t, r, steps, tc.w)
		})
	}
}

// TGI's response headers are read from TGI only (stream.API's
// EngineHeaders): the same headers from another engine, or on an API
// that is not TGI's, say nothing.
func TestEngineHeadersByEngine(t *testing.T) {
	hdr := http.Header{"X-Queue-Time": {"3"}, "X-Prompt-Tokens": {"5"}, "X-Generated-Tokens": {"4"}}
	chat := `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}`
	msg := `{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn"}`
	for _, c := range []struct {
		name, engine, path, req, body string
		read                          bool
	}{
		{"chat from TGI", EngineTGI, "/v1/chat/completions", `{"model":"m"}`, chat, true},
		{"chat from another engine", "vllm", "/v1/chat/completions", `{"model":"m"}`, chat, false},
		{"chat from an unknown engine", "", "/v1/chat/completions", `{"model":"m"}`, chat, false},
		{"messages from TGI", EngineTGI, "/v1/messages", `{"model":"m","max_tokens":5,"messages":[]}`, msg, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			steps := []step{{at: 9 * time.Millisecond, raw: c.body, client: c.body}}
			u := &lockstepUp{ct: "application/json", steps: steps, header: hdr}
			r, _ := runLockstep(t, u, Options{Engine: c.engine}, c.path, c.req)
			read := r.Engine.Known&record.EngineQueue != 0 && r.Engine.Queue == 3*time.Millisecond && r.InputTokens == 5 && r.OutputTokens == 4
			unread := r.Engine.Known == 0 && r.InputTokens == -1 && r.OutputTokens != 4
			if (c.read && !read) || (!c.read && !unread) {
				t.Fatalf("engine %+v in %d out %d (%s), headers read: want %v", r.Engine, r.InputTokens, r.OutputTokens, r.TokenSource, c.read)
			}
		})
	}
}

// An HTTP error status is http_4xx / http_5xx for every format, with the
// engine's numeric code (when its error body has one) in error_code;
// 429 and 503 are rejections.
func TestHTTPErrorsEveryFormat(t *testing.T) {
	cases := []struct {
		path, req, ct, body string
		status              int
		errorType           string
		code                int64
		outcome             record.Outcome
	}{
		{"/v1/chat/completions", `{"model":"x","stream":true}`, "application/json",
			`{"error":{"message":"model \"x\" not found","type":"not_found_error","param":null,"code":null}}`, 404, record.ErrHTTP4xx, 0, record.Error},
		{"/v1/completions", `{"model":"x"}`, "application/json",
			`{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, 400, record.ErrHTTP4xx, 400, record.Error},
		{"/v1/responses", `{"model":"x","stream":true}`, "application/json",
			`{"error":{"message":"boom","type":"api_error","code":500}}`, 500, record.ErrHTTP5xx, 500, record.Error},
		{"/v1/messages", `{"model":"x","stream":true}`, "application/json",
			`{"type":"error","error":{"type":"not_found_error","message":"model not found"}}`, 404, record.ErrHTTP4xx, 0, record.Error},
		{"/v1/messages", `{"model":"x","stream":true}`, "application/json",
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, 529, record.ErrHTTP5xx, 0, record.Error},
		{"/api/chat", `{"model":"x"}`, "application/json", `{"error":"model 'x' not found"}`, 404, record.ErrHTTP4xx, 0, record.Error},
		{"/api/generate", `{"model":"x"}`, "application/json", `{"error":"server busy, please try again.  maximum pending requests exceeded"}`,
			503, record.ErrRejected, 0, record.Rejected},
		{"/generate_stream", `{"inputs":"x"}`, "application/json", `{"error":"Input validation error","error_type":"validation"}`,
			422, record.ErrHTTP4xx, 0, record.Error},
		{"/generate_stream", `{"inputs":"x"}`, "application/json", `{"error":"Model is overloaded","error_type":"overloaded"}`,
			429, record.ErrRejected, 0, record.Rejected},
		{"/completion", `{"prompt":"x"}`, "application/json", `{"error":{"code":500,"message":"x","type":"server_error"}}`,
			500, record.ErrHTTP5xx, 500, record.Error},
		{"/api/chat", `{"model":"x"}`, "text/plain", `404 page not found`, 404, record.ErrHTTP4xx, 0, record.Error},
	}
	for _, tc := range cases {
		t.Run(tc.path+" "+http.StatusText(tc.status), func(t *testing.T) {
			fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ct)
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}), Options{InjectUsage: true})
			resp, body := do(t, fs, tc.path, tc.req)
			if resp.StatusCode != tc.status || body != tc.body {
				t.Fatalf("client got %d %q", resp.StatusCode, body)
			}
			r := waitOne(t, sink)
			if r.Outcome != tc.outcome || r.ErrorType != tc.errorType || r.ErrorCode != tc.code || r.HTTPStatus != tc.status {
				t.Fatalf("record %s/%s code %d status %d; want %s/%s code %d", r.Outcome, r.ErrorType, r.ErrorCode, r.HTTPStatus,
					tc.outcome, tc.errorType, tc.code)
			}
		})
	}
}

// TestLlamaCppErrorField: llama.cpp before ggml-org/llama.cpp#16109 sent
// a stream's error as an SSE "error:" field (tools/server/server.cpp,
// server_sent_event(sink, "error", error_data)), then "data: [DONE]" on
// its OpenAI routes, and nothing more on its native one. The request
// failed: with the field ignored, the chat one was a success, and the
// native one an incomplete stream with no code.
func TestLlamaCppErrorField(t *testing.T) {
	errField := `error: {"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}` + "\n\n"
	for _, tc := range []struct{ path, req, done string }{
		{"/v1/chat/completions", streamBody, "data: [DONE]\n\n"},
		{"/completion", `{"prompt":"hi","n_predict":4,"stream":true}`, ""},
	} {
		for _, inject := range []bool{false, true} { // usage injected: strip mode reads the events
			t.Run(tc.path+map[bool]string{false: " plain", true: " injected"}[inject], func(t *testing.T) {
				fs, sink := front(t, sse(errField, tc.done), Options{InjectUsage: inject})
				resp, body := do(t, fs, tc.path, tc.req)
				if resp.StatusCode != 200 || body != errField+tc.done {
					t.Fatalf("client got %d %q", resp.StatusCode, body)
				}
				r := waitOne(t, sink)
				if r.Outcome != record.Error || r.ErrorType != record.ErrStreamError || r.ErrorCode != 400 || r.TokenEvents() != 0 {
					t.Fatalf("record %s/%s code %d, %d token events; want error/%s code 400, none", r.Outcome, r.ErrorType, r.ErrorCode, r.TokenEvents(), record.ErrStreamError)
				}
			})
		}
	}
}

// TestTGIToolCallObject: TGI before 3.2.0 streamed a tool call's deltas
// with tool_calls one object, not an array (its integration-tests
// snapshots at v3.1.0; huggingface/text-generation-inference #3075):
// each is a token event, where none was.
func TestTGIToolCallObject(t *testing.T) {
	chunk := func(args, finish string) string {
		return `data: {"choices":[{"delta":{"content":null,"role":"assistant","tool_calls":{"function":{"arguments":` + q(args) +
			`,"name":null},"id":"","index":0,"type":"function"}},"finish_reason":` + finish + `,"index":0,"logprobs":null}],"created":1732293235,"id":"",` +
			`"model":"meta-llama/Llama-3.1-8B-Instruct","object":"chat.completion.chunk","system_fingerprint":"2.4.1-dev0-native","usage":null}` + "\n\n"
	}
	fs, sink := front(t, sse(chunk(`{"function": {"_name": "get_weather",`, "null"), chunk(` "location": "Paris"}}`, "null"),
		chunk("<|eot_id|>", `"stop"`), "data: [DONE]\n\n"), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	r := waitOne(t, sink)
	if r.Outcome != record.Success || r.TokenEvents() != 3 || r.FinishReason != "stop" {
		t.Fatalf("outcome %s, %d token events, finish %q; want success, 3, stop", r.Outcome, r.TokenEvents(), r.FinishReason)
	}
}

// Every API has its format (stream.FormatOfAPI spells the api values out).
func TestFormatOfEveryAPI(t *testing.T) {
	want := map[stream.Name]stream.Format{stream.NameChat: stream.FormatOpenAI, stream.NameCompletions: stream.FormatOpenAI,
		stream.NameResponses: stream.FormatResponses, stream.NameMessages: stream.FormatMessages,
		stream.NameOllamaChat: stream.FormatOllama, stream.NameOllamaGenerate: stream.FormatOllama,
		stream.NameTGIGenerate: stream.FormatTGI, stream.NameLlamaCppCompletion: stream.FormatLlamaCpp, stream.NameUpgrade: stream.FormatOpenAI, stream.NameOther: stream.FormatOpenAI,
		stream.NameGemini: stream.FormatGemini}
	for _, a := range stream.APIs() {
		if f, ok := want[a.Name]; !ok || formatOf(a) != f {
			t.Errorf("%s: format %v, want %v", a.Name, formatOf(a), f)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		method, path, engine string
		want                 stream.Name
	}{
		{"POST", "/v1/chat/completions", "", stream.NameChat},
		{"POST", "/chat/completions/", "", stream.NameChat},
		{"POST", "/v1/completions", "llamacpp", stream.NameCompletions},
		{"POST", "/completions", "", stream.NameCompletions},
		{"POST", "/completions", "llamacpp", stream.NameLlamaCppCompletion},
		{"POST", "/completion", "", stream.NameLlamaCppCompletion},
		{"POST", "/v1/responses", "", stream.NameResponses},
		{"POST", "/responses", "", stream.NameResponses},
		{"POST", "/v1/responses/input_tokens", "", stream.NameOther},
		{"POST", "/v1/messages", "", stream.NameMessages},
		{"POST", "/anthropic/v1/messages", "", stream.NameMessages},
		{"POST", "/v1/messages/count_tokens", "", stream.NameOther},
		{"POST", "/v1/threads/t1/messages", "", stream.NameOther},
		{"POST", "/api/chat", "", stream.NameOllamaChat},
		{"POST", "/api/generate", "", stream.NameOllamaGenerate},
		{"POST", "/generate_stream", "", stream.NameTGIGenerate},
		{"POST", "/generate", "tgi", stream.NameTGIGenerate},
		{"POST", "/generate", "sglang", stream.NameOther},
		{"POST", "/v1/embeddings", "", stream.NameOther},
		{"GET", "/v1/chat/completions", "", stream.NameOther},
	}
	for _, c := range cases {
		r, _ := http.NewRequest(c.method, "http://x"+c.path, nil)
		if got := classify(r, c.engine); got.Name != c.want {
			t.Errorf("%s %s (engine %q): %s, want %s", c.method, c.path, c.engine, got.Name, c.want)
		}
	}
}

// Request fields per format: stream (Ollama streams unless told not to;
// TGI's /generate_stream always does), max tokens under each format's
// own name, and no usage injection where the format cannot ask.
func TestPeekFormats(t *testing.T) {
	cases := []struct {
		api           *stream.API
		path, body    string
		stream        bool
		maxTokens     int64
		includeUsage  bool
		temperature   float64
		hasTemprature bool
	}{
		{stream.APIChat, "/v1/chat/completions", `{"stream":true,"max_completion_tokens":9,"max_tokens":3,"stream_options":{"include_usage":true}}`, true, 9, true, 0, false},
		{stream.APIResponses, "/v1/responses", `{"stream":true,"max_output_tokens":12,"stream_options":{"include_usage":true}}`, true, 12, false, 0, false},
		{stream.APIMessages, "/v1/messages", `{"stream":true,"max_tokens":7,"temperature":0.5}`, true, 7, false, 0.5, true},
		{stream.APIOllamaChat, "/api/chat", `{"model":"m","options":{"num_predict":5,"temperature":0.2}}`, true, 5, false, 0.2, true},
		{stream.APIOllamaGenerate, "/api/generate", `{"model":"m","stream":false}`, false, 0, false, 0, false},
		{stream.APITGIGenerate, "/generate_stream", `{"inputs":"x","parameters":{"max_new_tokens":20,"temperature":0.7}}`, true, 20, false, 0.7, true},
		{stream.APITGIGenerate, "/generate", `{"inputs":"x"}`, false, 0, false, 0, false},
		{stream.APILlamaCppCompletion, "/completion", `{"prompt":"x","n_predict":30,"stream":true}`, true, 30, false, 0, false},
	}
	for _, c := range cases {
		in, _, _, err := peek(io.NopCloser(strings.NewReader(c.body)), c.api, c.path, 1<<20, -1, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if in.Stream != c.stream || in.MaxTokens != c.maxTokens || in.IncludeUsage != c.includeUsage ||
			(in.Temperature != nil) != c.hasTemprature || (in.Temperature != nil && *in.Temperature != c.temperature) {
			t.Errorf("%s %s: %+v", c.api.Name, c.body, in)
		}
	}
	// A truncated body is read best-effort, the format's fields included.
	long := `{"model":"m","options":{"num_predict":4},"stream":false,"prompt":"` + strings.Repeat("x", 100) + `"}`
	in, _, _, _ := peek(io.NopCloser(strings.NewReader(long)), stream.APIOllamaGenerate, "/api/generate", 64, -1, false, nil)
	if in.Stream || in.MaxTokens != 4 || in.Whole {
		t.Errorf("truncated Ollama body: %+v", in)
	}
}

// Usage is injected only where the format can ask for it.
func TestNoInjectionOutsideOpenAI(t *testing.T) {
	for _, path := range []string{"/v1/responses", "/v1/messages", "/api/chat", "/generate_stream", "/completion"} {
		got := make(chan []byte, 1)
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- b
			w.Header().Set("Content-Type", "text/event-stream")
		}), Options{InjectUsage: true})
		body := `{"model":"m","stream":true,"messages":[]}`
		do(t, fs, path, body)
		if b := <-got; string(b) != body {
			t.Errorf("%s: the engine got %q, want the client's body unchanged", path, b)
		}
		if r := waitOne(t, sink); r.UsageInjected {
			t.Errorf("%s: usage_injected", path)
		}
	}
}

// The hot path allocates nothing per event in steady state, in every
// format (TestTapZeroAllocsPerEvent does the OpenAI one, both modes).
func TestTapZeroAllocsPerEventEveryFormat(t *testing.T) {
	cases := []struct {
		f    stream.Format
		kind bodyKind
		ev   string
	}{
		{stream.FormatResponses, bodySSE, "event: response.output_text.delta\ndata: " +
			`{"content_index":0,"delta":" x","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}` + "\n\n"},
		{stream.FormatMessages, bodySSE, "event: content_block_delta\ndata: " +
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" x"}}` + "\n\n"},
		{stream.FormatOllama, bodyNDJSON, `{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":" x"},"done":false}` + "\n"},
		{stream.FormatTGI, bodySSE, `data:{"index":3,"token":{"id":5,"text":" x","logprob":-0.3,"special":false},"generated_text":null,"details":null}` + "\n\n"},
		{stream.FormatLlamaCpp, bodySSE, `data: {"index":0,"content":" x","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":3,"tokens_evaluated":12}` + "\n\n"},
		{stream.FormatGemini, bodySSE, `data: {"candidates": [{"content": {"parts": [{"text": " x"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "r"}` + "\n\n"},
		{stream.FormatOpenAI, bodySSE, `data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":" x","finish_reason":null}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}` + "\n\n"},
	}
	for i, c := range cases {
		strip := i == len(cases)-1 // Ollama's completions chunk: its usage member is cut in strip mode
		st := newTestState()
		tp := newTap(&loopReader{ev: []byte(c.ev)}, st, c.kind, c.f, strip, 1<<20)
		p := make([]byte, 32<<10)
		for i := 0; i < 100; i++ {
			tp.Read(p)
		}
		if st.rec.TokenEvents() < 90 {
			t.Fatalf("%v: %d token events in 100 reads", c.f, st.rec.TokenEvents())
		}
		st.rec.Reset()
		if n := testing.AllocsPerRun(500, func() { tp.Read(p) }); n != 0 {
			t.Errorf("%v: %.2f allocations per event", c.f, n)
		}
	}
}
