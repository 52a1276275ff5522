package tracing

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// The slow causes reach the inference span: "what:cause" per slow event
// as an attribute, and each cause with its milliseconds and the record
// id it points to on its event (the first token, the stall).
func TestSpanSlowCauses(t *testing.T) {
	const ms = time.Millisecond
	spans := tracetest.NewSpanRecorder()
	tr := New(Options{Provider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), StallThreshold: 500 * ms})
	rec := record.New(4)
	rec.Arrive = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec.API, rec.Traffic, rec.Outcome, rec.Stream, rec.OutputTokens = stream.NameChat, "live", record.Success, true, 3
	rec.AddToken(rec.Arrive.Add(2000*ms), 1, true)
	rec.AddToken(rec.Arrive.Add(2100*ms), 1, true)
	rec.AddToken(rec.Arrive.Add(3000*ms), 1, true)
	rec.Terminal = rec.Arrive.Add(3001 * ms)
	rec.Causes = []record.Cause{
		{What: "ttft", Cause: "long_prefill_ahead", Ms: 1800, Ref: "r-7"},
		{What: "stall", Cause: "prefill_interference", Ms: 850, At: rec.Arrive.Add(2100 * ms), Ref: "r-9"},
	}
	_, s := tr.Start(context.Background(), httptest.NewRequest("POST", "/v1/chat/completions", nil), rec,
		&url.URL{Scheme: "http", Host: "engine:8000"}, pipeline.Params{}, nil)
	s.End(rec, nil)
	var client sdktrace.ReadOnlySpan
	for _, sp := range spans.Ended() {
		if sp.SpanKind() == trace.SpanKindClient {
			client = sp
		}
	}
	if client == nil {
		t.Fatal("no inference span")
	}
	var whys []string
	for _, kv := range client.Attributes() {
		if kv.Key == "tokentap.slow.causes" {
			whys = kv.Value.AsStringSlice()
		}
	}
	if fmt.Sprint(whys) != "[ttft:long_prefill_ahead stall:prefill_interference]" {
		t.Errorf("tokentap.slow.causes = %v", whys)
	}
	got := map[string]string{}
	for _, ev := range client.Events() {
		for _, kv := range ev.Attributes {
			got[ev.Name+" "+string(kv.Key)] = kv.Value.String()
		}
	}
	for k, want := range map[string]string{
		"gen_ai.first_token tokentap.slow.cause": "long_prefill_ahead", "gen_ai.first_token tokentap.slow.cause_ms": "1800",
		"gen_ai.first_token tokentap.slow.ref": "r-7",
		"tokentap.stall tokentap.slow.cause":   "prefill_interference", "tokentap.stall tokentap.slow.cause_ms": "850",
		"tokentap.stall tokentap.slow.ref": "r-9",
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
}
