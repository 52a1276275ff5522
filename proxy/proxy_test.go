package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// front runs a proxy with opts in front of h; its records are collected,
// and live observes the requests while they run (nil: nothing).
func front(t testing.TB, h http.Handler, opts Options, live ...record.Observer) (*httptest.Server, *collect) {
	t.Helper()
	var sink collect
	if h != nil {
		us := httptest.NewServer(h)
		t.Cleanup(us.Close)
		opts.Upstream, _ = url.Parse(us.URL)
	}
	po := pipeline.Options{Sinks: []record.Sink{&sink}}
	if len(live) > 0 {
		po.Live = live[0]
	}
	opts.Pipeline = pipeline.New(po)
	if loopAll {
		opts.EventLoop = true
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	fs := serve(p, opts.EventLoop)
	t.Cleanup(fs.Close)
	return fs, &sink
}

// loopAll runs every proxy of front on the event loop's path, where it
// applies (TOKENTAP_TEST_EVENT_LOOP=1): scripts/test.sh runs this
// package's tests both ways.
var loopAll = os.Getenv("TOKENTAP_TEST_EVENT_LOOP") == "1"

// serve starts a test server for p, keeping its connections in its
// requests' context when loop is set (ConnContext).
func serve(p http.Handler, loop bool) *httptest.Server {
	fs := httptest.NewUnstartedServer(p)
	if loop {
		fs.Config.ConnContext = ConnContext
	}
	fs.Start()
	return fs
}

func do(t *testing.T, fs *httptest.Server, path, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(fs.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// only returns the one record collected. A client can read the end of a
// response with a Content-Length before the handler has returned and
// the record is written: wait for it, briefly.
func only(t *testing.T, c *collect) *record.Record {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.mu.Lock()
		n := len(c.recs)
		c.mu.Unlock()
		if n > 0 {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.recs) != 1 {
		t.Fatalf("%d records, want 1", len(c.recs))
	}
	return c.recs[0]
}

// waitGone blocks until the proxy drops the request. The body must be read
// first: net/http notices a closed connection only once it has.
func waitGone(r *http.Request) {
	io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

func sse(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}
}

const streamBody = `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

func TestTimeoutIsRecorded(t *testing.T) {
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		waitGone(r) // never finishes on its own
	}), Options{Timeout: 150 * time.Millisecond})
	t0 := time.Now()
	do(t, fs, "/v1/chat/completions", streamBody)
	took := time.Since(t0) // the client's view bounds the record's from above
	r := only(t, sink)
	if r.Outcome != record.Timeout || r.ErrorType != record.ErrTimeout {
		t.Fatalf("outcome %s/%s, want timeout", r.Outcome, r.ErrorType)
	}
	if e, _ := r.E2E(); e < 150*time.Millisecond || e > took {
		t.Fatalf("e2e %v, want at least the 150 ms timeout and at most the %v the client waited", e, took)
	}
}

func TestTimeoutBeforeHeadersIs504(t *testing.T) {
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waitGone(r)
	}), Options{Timeout: 100 * time.Millisecond})
	resp, body := do(t, fs, "/v1/chat/completions", streamBody)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(body, "tokentap_timeout") {
		t.Fatalf("status %d body %q, want 504 naming the timeout", resp.StatusCode, body)
	}
	if r := only(t, sink); r.Outcome != record.Timeout || r.HTTPStatus != 504 {
		t.Fatalf("record %s/%d, want timeout/504", r.Outcome, r.HTTPStatus)
	}
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	u, _ := url.Parse("http://" + addr)
	fs, sink := front(t, nil, Options{Upstream: u})
	resp, body := do(t, fs, "/v1/chat/completions", streamBody)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "tokentap_upstream_unreachable") {
		t.Fatalf("status %d body %q, want a clear 502", resp.StatusCode, body)
	}
	if r := only(t, sink); r.Outcome != record.Error || r.ErrorType != record.ErrUpstreamConnect || r.HTTPStatus != 502 {
		t.Fatalf("record %s/%s/%d", r.Outcome, r.ErrorType, r.HTTPStatus)
	}
}

func TestNonStreamingUsage(t *testing.T) {
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`)
	}), Options{InjectUsage: true})
	_, body := do(t, fs, "/v1/chat/completions", `{"model":"m","messages":[]}`)
	if !strings.Contains(body, `"content":"hello"`) {
		t.Fatalf("body %q", body)
	}
	r := only(t, sink)
	if r.Outcome != record.Success || r.OutputTokens != 2 || r.InputTokens != 9 || r.TokenSource != "usage" || r.FinishReason != "stop" {
		t.Fatalf("record %+v", r)
	}
	if _, ok := r.TTFT(); ok {
		t.Fatal("a non-streaming response has no TTFT")
	}
	if r.UsageInjected {
		t.Fatal("usage must not be injected into a non-streaming request")
	}
}

func TestMalformedStreamIsForwardedAndRecorded(t *testing.T) {
	events := []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "data: {broken\n\n", "data: [DONE]\n\n"}
	fs, sink := front(t, sse(events...), Options{})
	_, body := do(t, fs, "/v1/chat/completions", streamBody)
	if body != strings.Join(events, "") {
		t.Fatalf("client got %q", body)
	}
	r := only(t, sink)
	if r.Outcome != record.Error || r.ErrorType != record.ErrMalformed || !r.Malformed {
		t.Fatalf("record %s/%s malformed=%v", r.Outcome, r.ErrorType, r.Malformed)
	}
}

func TestIncompleteStreamWithoutOutputIsAnError(t *testing.T) {
	fs, sink := front(t, sse("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	if r := only(t, sink); r.Outcome != record.Error || r.ErrorType != record.ErrIncomplete {
		t.Fatalf("record %s/%s, want error/incomplete_stream", r.Outcome, r.ErrorType)
	}
}

// A clean EOF ends a stream successfully only after a finish reason; a
// stream cut short after output, with neither the end marker nor a
// finish reason, is a truncated generation: error/incomplete_stream.
func TestCleanEOFNeedsAFinishReason(t *testing.T) {
	fs, sink := front(t, sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n"), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	if r := only(t, sink); r.Outcome != record.Success || r.TokenSource != "events" || r.OutputTokens != 1 {
		t.Fatalf("record %s source=%s n=%d", r.Outcome, r.TokenSource, r.OutputTokens)
	}
	fs, sink = front(t, sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	if r := only(t, sink); r.Outcome != record.Error || r.ErrorType != record.ErrIncomplete || r.OutputTokens != 1 {
		t.Fatalf("truncated: record %s/%s n=%d", r.Outcome, r.ErrorType, r.OutputTokens)
	}
}

func TestOtherRoutesPassThroughUntouched(t *testing.T) {
	var gotBody string
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody = r.Method + " " + r.URL.Path + " " + string(b)
		w.Header().Set("X-Engine", "yes")
		w.WriteHeader(201)
		io.WriteString(w, "engine says hi")
	}), Options{InjectUsage: true})
	resp, body := do(t, fs, "/v1/embeddings", `{"input":"x","stream":true}`)
	if resp.StatusCode != 201 || body != "engine says hi" || resp.Header.Get("X-Engine") != "yes" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if gotBody != `POST /v1/embeddings {"input":"x","stream":true}` {
		t.Fatalf("upstream saw %q", gotBody)
	}
	if r := only(t, sink); r.API != stream.NameOther || r.Outcome != record.Success {
		t.Fatalf("record api=%s outcome=%s", r.API, r.Outcome)
	}
}

// A tap that breaks must not break the traffic: the bytes still flow and
// the failure is counted.
type failObs struct {
	record.Nop
	failures []string
}

func (f *failObs) Begin(record.Key) record.Observation { return f }
func (f *failObs) Gap(time.Duration)                   { panic("observer bug") }
func (f *failObs) ForwardDelay(time.Duration)          {}
func (f *failObs) Malformed()                          {}
func (f *failObs) UsageInjected()                      {}
func (f *failObs) TapFailed(r string)                  { f.failures = append(f.failures, r) }
func (f *failObs) Done()                               {}

func TestTapFailsOpen(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n", // the second token's Gap panics
		"data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3}}\n\n",
		"data: [DONE]\n\n",
	}
	for _, inject := range []bool{false, true} {
		obs := &failObs{}
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range events {
				io.WriteString(w, e)
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond)
			}
		}), Options{InjectUsage: inject}, obs)
		_, body := do(t, fs, "/v1/chat/completions", streamBody)
		want := strings.Join(events, "")
		if body != want {
			t.Fatalf("inject=%v: client got %q\nwant %q", inject, body, want)
		}
		if len(obs.failures) != 1 || obs.failures[0] != "panic" {
			t.Fatalf("inject=%v: failures %v, want one panic", inject, obs.failures)
		}
		if r := only(t, sink); r.TapFailed != "panic" {
			t.Fatalf("inject=%v: record does not say the tap failed", inject)
		}
	}
}
