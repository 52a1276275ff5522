package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/tracing"
)

type traced struct {
	front    *httptest.Server
	spans    *tracetest.SpanRecorder
	sink     *collect
	upstream chan http.Header
}

func newTraced(t *testing.T, events []string, capture *tracing.ContentCapture) *traced {
	tr := &traced{spans: tracetest.NewSpanRecorder(), sink: &collect{}, upstream: make(chan http.Header, 4)}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		tr.upstream <- r.Header.Clone()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(us.Close)
	u, _ := url.Parse(us.URL)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.spans))
	pipe := pipeline.New(pipeline.Options{Tracer: tracing.New(tracing.Options{Provider: tp, ProviderName: "vllm", Capture: capture}),
		Sinks: []record.Sink{tr.sink}})
	p, err := New(Options{Upstream: u, Pipeline: pipe, InjectUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	tr.front = httptest.NewServer(p)
	t.Cleanup(tr.front.Close)
	return tr
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

var okEvents = []string{
	`data: {"id":"chatcmpl-7","model":"llama-resp","choices":[{"delta":{"content":"Hi alice@example.com"}}]}` + "\n\n",
	`data: {"id":"chatcmpl-7","model":"llama-resp","choices":[{"delta":{"content":" there"},"finish_reason":"stop"}]}` + "\n\n",
	`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}` + "\n\n",
	"data: [DONE]\n\n",
}

const tracedBody = `{"model":"llama","stream":true,"max_tokens":50,"temperature":0.5,"top_p":0.9,"seed":7,"messages":[{"role":"user","content":"my key is sk-abcdefghijklmnopqrstuvwxyz and mail bob@example.com"}]}`

func TestSpansContinueIncomingTraceAndMatchTheRecord(t *testing.T) {
	tr := newTraced(t, okEvents, nil)
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, _ := http.NewRequest("POST", tr.front.URL+"/v1/chat/completions", strings.NewReader(tracedBody))
	req.Header.Set("traceparent", parent)
	req.Header.Set("baggage", "tenant=acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	up := <-tr.upstream
	ended := tr.spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans, want 2", len(ended))
	}
	client, server := ended[0], ended[1]
	if server.SpanKind() != trace.SpanKindServer || client.SpanKind() != trace.SpanKindClient {
		t.Fatalf("kinds %v/%v", server.SpanKind(), client.SpanKind())
	}
	if server.Name() != "POST /v1/chat/completions" || client.Name() != "chat llama" {
		t.Fatalf("names %q / %q", server.Name(), client.Name())
	}
	if server.Parent().SpanID().String() != "00f067aa0ba902b7" || server.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("server span does not continue the client's trace: parent %v trace %v", server.Parent().SpanID(), server.SpanContext().TraceID())
	}
	if client.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatal("inference span is not the server span's child")
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + client.SpanContext().SpanID().String() + "-01"
	if got := up.Get("traceparent"); got != want {
		t.Fatalf("upstream got traceparent %q, want ours %q", got, want)
	}
	if up.Get("baggage") != "tenant=acme" {
		t.Fatalf("baggage %q not propagated", up.Get("baggage"))
	}
	r := tr.sink.recs[0]
	a := attrs(client)
	ttft, _ := r.TTFT()
	checks := map[attribute.Key]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": "llama",
		"gen_ai.response.model": "llama-resp", "gen_ai.response.id": "chatcmpl-7", "gen_ai.request.stream": true,
		"gen_ai.request.max_tokens": int64(50), "gen_ai.request.temperature": 0.5, "gen_ai.request.top_p": 0.9, "gen_ai.request.seed": int64(7),
		"gen_ai.usage.input_tokens": int64(9), "gen_ai.usage.output_tokens": int64(2), "gen_ai.response.time_to_first_chunk": ttft.Seconds(),
		"tokentap.outcome": "success", "tokentap.record_id": r.ID, "server.address": "127.0.0.1",
	}
	for k, v := range checks {
		if got := a[k].AsInterface(); got != v {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, v, v)
		}
	}
	if fr := a["gen_ai.response.finish_reasons"].AsStringSlice(); len(fr) != 1 || fr[0] != "stop" {
		t.Errorf("finish_reasons %v", fr)
	}
	if len(client.Events()) == 0 || client.Events()[0].Name != "gen_ai.first_token" || !client.Events()[0].Time.Equal(r.FirstToken) {
		t.Errorf("first-token event %v", client.Events())
	}
	if !client.EndTime().Equal(r.Terminal) || !client.StartTime().Equal(r.Arrive) {
		t.Errorf("span times %v..%v, record %v..%v", client.StartTime(), client.EndTime(), r.Arrive, r.Terminal)
	}
	if r.TraceID != client.SpanContext().TraceID().String() {
		t.Errorf("record trace id %q", r.TraceID)
	}
	// No content by default.
	for _, s := range ended {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "alice") || strings.Contains(kv.Value.String(), "sk-abc") || strings.HasPrefix(string(kv.Key), "gen_ai.input") || strings.HasPrefix(string(kv.Key), "gen_ai.output") {
				t.Errorf("content in span %s: %s=%s", s.Name(), kv.Key, kv.Value.String())
			}
		}
	}
}

func TestSpanErrorTypeOnFailedStream(t *testing.T) {
	tr := newTraced(t, []string{
		`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n",
		`data: {"error":{"message":"boom","type":"InternalServerError","code":500}}` + "\n\n",
	}, nil)
	resp, _ := http.Post(tr.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(tracedBody))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-tr.upstream
	for _, s := range tr.spans.Ended() {
		if attrs(s)["error.type"].AsString() != "stream_error" || s.Status().Code != codes.Error {
			t.Errorf("span %s: error.type %q status %v", s.Name(), attrs(s)["error.type"].AsString(), s.Status())
		}
	}
	if fr := attrs(tr.spans.Ended()[0])["gen_ai.response.finish_reasons"].AsStringSlice(); len(fr) != 1 || fr[0] != "error" {
		t.Errorf("finish_reasons %v, want [error] for a stream that ended early", fr)
	}
}

func TestContentCaptureRedactedAndTruncated(t *testing.T) {
	tr := newTraced(t, okEvents, &tracing.ContentCapture{MaxBytes: 30, Redact: tracing.DefaultRedactions()})
	resp, _ := http.Post(tr.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(tracedBody))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-tr.upstream
	a := attrs(tr.spans.Ended()[0])
	in, out := a["gen_ai.input.messages"].AsString(), a["gen_ai.output.messages"].AsString()
	if !strings.Contains(in, `"role":"user"`) || !strings.Contains(in, "[REDACTED]") || strings.Contains(in, "sk-abc") || !strings.Contains(in, "…[truncated]") {
		t.Errorf("input messages %s", in)
	}
	if !strings.Contains(out, `"content":"Hi [REDACTED] there"`) || !strings.Contains(out, `"finish_reason":"stop"`) {
		t.Errorf("output messages %s", out)
	}
}

func TestRecordCarriesNoTraceWithoutTracing(t *testing.T) {
	fs, sink := front(t, sse(okEvents...), Options{})
	do(t, fs, "/v1/chat/completions", tracedBody)
	if r := only(t, sink); r.TraceID != "" {
		t.Fatalf("trace id %q without tracing", r.TraceID)
	}
	_ = context.Background
	_ = record.Success
}
