package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/structure"
)

// setPath sets the member at a dotted path ("options.num_predict") of m
// to v, making the objects on the way.
func setPath(m map[string]any, path string, v any) {
	top, rest, nested := strings.Cut(path, ".")
	if !nested {
		m[top] = v
		return
	}
	inner, _ := m[top].(map[string]any)
	if inner == nil {
		inner = map[string]any{}
		m[top] = inner
	}
	setPath(inner, rest, v)
}

func deletePath(m map[string]any, path string) {
	top, rest, nested := strings.Cut(path, ".")
	if !nested {
		delete(m, top)
		return
	}
	if inner, ok := m[top].(map[string]any); ok {
		deletePath(inner, rest)
	}
}

// A client's output-token limit of 2^63-1, under every name of every
// API's request description (max_tokens, max_completion_tokens,
// Messages' max_tokens, Responses' max_output_tokens, Ollama's
// options.num_predict, TGI's parameters.max_new_tokens, llama.cpp's
// n_predict, Gemini's generationConfig.maxOutputTokens), is a claim, not
// a size: the request is forwarded byte for byte, answered and recorded
// with that limit (issue 40, item 1: the record's capacity hint
// overflowed and make panicked, and the client got no answer).
func TestHugeMaxTokensForwardedAnsweredRecorded(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []byte
	)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = b
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	n := 0
	for _, a := range stream.APIs() {
		if a.Probe == nil {
			continue
		}
		for _, name := range a.Request.MaxTokens {
			t.Run(string(a.Name)+"/"+name, func(t *testing.T) {
				fs, sink := front(t, up, Options{Engine: a.Engine})
				target, m := a.Probe(stream.ProbeParams{Model: "m", Prompt: "p", MaxTokens: 1})
				for _, other := range a.Request.MaxTokens {
					deletePath(m, other)
				}
				setPath(m, name, int64(math.MaxInt64))
				body, _ := json.Marshal(m)
				if !bytes.Contains(body, []byte("9223372036854775807")) {
					t.Fatalf("no limit in %s", body)
				}
				resp, got := do(t, fs, target, string(body))
				if resp.StatusCode != http.StatusOK || got != `{}` {
					t.Fatalf("answer %d %q, want 200 {}", resp.StatusCode, got)
				}
				mu.Lock()
				fwd := seen
				mu.Unlock()
				if !bytes.Equal(fwd, body) {
					t.Errorf("forwarded %s, want %s", fwd, body)
				}
				rec := only(t, sink)
				// `{}` names no answer: recorded as such (empty_answer).
				if rec.API != a.Name || rec.MaxTokens != math.MaxInt64 || rec.Outcome != record.NoAnswer || rec.ErrorType != record.ErrEmptyAnswer || rec.HTTPStatus != http.StatusOK {
					t.Errorf("record: api %s max_tokens %d outcome %s/%s status %d", rec.API, rec.MaxTokens, rec.Outcome, rec.ErrorType, rec.HTTPStatus)
				}
				if c := cap(rec.TokenAt); c != record.MaxHint {
					t.Errorf("room for %d token events, want %d", c, record.MaxHint)
				}
			})
			n++
		}
	}
	if n < 9 {
		t.Fatalf("%d token-limit names tried", n)
	}
}

// panicTransport is an upstream whose RoundTrip panics (before any
// status is written to the client), or, with body set, whose response
// body gives body and then panics (after the status and those bytes were
// forwarded).
type panicTransport struct{ body string }

func (pt panicTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if pt.body == "" {
		panic("transport bug")
	}
	return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r, ContentLength: -1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: &panicBody{rest: pt.body}}, nil
}

type panicBody struct{ rest string }

func (b *panicBody) Read(p []byte) (int, error) {
	if b.rest == "" {
		panic("body bug")
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func (*panicBody) Close() error { return nil }

// panicTenants is a tenant resolver that panics: in prepare, before the
// request's record has begun.
type panicTenants struct{}

func (panicTenants) Identify(*http.Request, string) string { panic("tenant bug") }

// errorLogs keeps the messages and where of the error-level records.
type errorLogs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errorLogs) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }
func (l *errorLogs) Handle(_ context.Context, r slog.Record) error {
	where := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "where" {
			where = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message+" where="+where)
	l.mu.Unlock()
	return nil
}
func (l *errorLogs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *errorLogs) WithGroup(string) slog.Handler      { return l }

// A handler that panics answers 502 when no status was written, cuts
// the connection when one was, logs the panic at error, counts it in
// tokentap_internal_errors_total{where="request"}, and still writes the
// request's record, error type internal (issue 40, item 1). The panics
// are real components': the tenant resolver (in prepare, before the
// record began), the transport (forwarding, before the status), the
// upstream's body (after the status and the first event).
func TestHandlerPanicAnswers502RecordsAndCounts(t *testing.T) {
	const event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"
	cases := []struct {
		name   string
		opts   Options
		status int // the client's, and the record's
		answer string
		cut    bool // the connection was cut after the status
		events int
	}{
		{"tenant resolver", Options{Tenants: panicTenants{}}, http.StatusBadGateway, `{"error":{"message":"tokentap: internal error","type":"tokentap_internal","code":502}}` + "\n", false, 0},
		{"transport", Options{Transport: panicTransport{}}, http.StatusBadGateway, `{"error":{"message":"tokentap: internal error","type":"tokentap_internal","code":502}}` + "\n", false, 0},
		{"response body", Options{Transport: panicTransport{body: event}}, http.StatusOK, event, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs errorLogs
			c.opts.Logger = slog.New(&logs)
			fs, sink, m := judged(t, http.NotFoundHandler(), c.opts)
			resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if cut := errors.Is(err, io.ErrUnexpectedEOF); cut != c.cut || (!c.cut && err != nil) {
				t.Errorf("read: %v, want cut %v", err, c.cut)
			}
			if resp.StatusCode != c.status || string(b) != c.answer {
				t.Errorf("answer %d %q, want %d %q", resp.StatusCode, b, c.status, c.answer)
			}
			rec := only(t, sink)
			if rec.Outcome != record.Error || rec.ErrorType != record.ErrInternal || rec.HTTPStatus != c.status || rec.TokenEvents() != c.events || rec.Terminal.IsZero() {
				t.Errorf("record: %s %s status %d, %d events, terminal %v", rec.Outcome, rec.ErrorType, rec.HTTPStatus, rec.TokenEvents(), rec.Terminal)
			}
			if n := counterValue(t, m, "tokentap_internal_errors_total", "where", InternalRequest); n != 1 {
				t.Errorf("internal errors (request) %v, want 1", n)
			}
			if n := counterValue(t, m, "tokentap_requests_total", "outcome", string(record.Error)); n != 1 {
				t.Errorf("requests (error) %v, want 1", n)
			}
			logs.mu.Lock()
			defer logs.mu.Unlock()
			if len(logs.msgs) != 1 || logs.msgs[0] != "request panicked where=request" {
				t.Errorf("error logs %q", logs.msgs)
			}
		})
	}
}

// A panic in an end stage (here the canary's check, the first), run on
// its own goroutine after the answer (Options.Ends, as the sidecar runs
// them), leaves the answer whole; the later stages still run, so the
// record is written, as it was settled; the panic is logged at error and
// counted in tokentap_internal_errors_total{where="end"}.
func TestEndStagePanicIsCounted(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("own goroutine %v", own), func(t *testing.T) {
			var (
				logs errorLogs
				ends *Ends
			)
			msg := "request panicked where=end" // Ends nil: the stages run in the handler (the canary's)
			if own {
				ends, msg = &Ends{}, "end of request panicked where=end"
			}
			fs, sink, m := judgedWith(t, sse(`data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n"),
				Options{Ends: ends, Logger: slog.New(&logs)}, &Hook{Check: func(*record.Record) { panic("check bug") }})
			endPanicked(t, fs, sink, m, ends, &logs, streamBody, "stop", msg)
		})
	}
}

// panicStructure is a Structure whose check panics.
type panicStructure struct{ *structure.Checker }

func (panicStructure) Record(*record.Record, *stream.Declared, *stream.Collector, bool, bool, bool) {
	panic("check bug")
}

// A structure check that panics (a Structure other than
// structure.Checker, which recovers its own) still leaves a record: the
// end stages run after it, in the handler or on their own goroutine; the
// panic is logged at error and counted under where="end", and the
// answer is whole.
func TestStructureCheckPanicKeepsTheRecord(t *testing.T) {
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("own goroutine %v", own), func(t *testing.T) {
			var (
				logs errorLogs
				ends *Ends
			)
			if own {
				ends = &Ends{}
			}
			call := `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}` + "\n\n"
			fs, sink, m := judged(t, sse(call, "data: [DONE]\n\n"),
				Options{Ends: ends, Logger: slog.New(&logs), Structure: panicStructure{&structure.Checker{}}})
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`
			endPanicked(t, fs, sink, m, ends, &logs, body, "tool_calls", "structure check panicked where=end")
		})
	}
}

// endPanicked sends body to fs, whose end of request panics once, and
// checks what must survive it: the answer whole (200, ending [DONE]), the
// record written as settled (success, finish), the later stages run
// (tokentap_requests_total counts it), the panic counted once under
// where="end" and none under where="request", and logged once as msg.
func endPanicked(t *testing.T, fs *httptest.Server, sink *collect, m *exporter.Metrics, ends *Ends, logs *errorLogs, body, finish, msg string) {
	t.Helper()
	resp, got := do(t, fs, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Fatalf("answer %d %q", resp.StatusCode, got)
	}
	fs.Close() // the handler has returned: its end stages were started
	if ends != nil {
		if err := ends.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := counterValue(t, m, "tokentap_internal_errors_total", "where", InternalEnd); n != 1 {
		t.Errorf("internal errors (end) %v, want 1", n)
	}
	if n := counterValue(t, m, "tokentap_internal_errors_total", "where", InternalRequest); n != 0 {
		t.Errorf("internal errors (request) %v, want 0", n)
	}
	if rec := only(t, sink); rec.Outcome != record.Success || rec.HTTPStatus != http.StatusOK || rec.FinishReason != finish {
		t.Errorf("record %s %s %d %q, want success 200 %q", rec.Outcome, rec.ErrorType, rec.HTTPStatus, rec.FinishReason, finish)
	}
	if n := counterValue(t, m, "tokentap_requests_total", "outcome", string(record.Success)); n != 1 {
		t.Errorf("successful requests %v, want 1: the metrics stage ran after the panicking one", n)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.msgs) != 1 || logs.msgs[0] != msg {
		t.Errorf("error logs %q, want %q", logs.msgs, msg)
	}
}
