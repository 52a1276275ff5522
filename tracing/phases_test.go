package tracing

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// The inference span carries the record's connection phases, in
// seconds, and whether the connection was reused: every phase that
// happened, none that did not, and none at all for a request that never
// reached the transport.
func TestSpanConnectionPhases(t *testing.T) {
	const ms = time.Millisecond
	spans := tracetest.NewSpanRecorder()
	tr := New(Options{Provider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	end := func(up record.Upstream) map[string]any {
		t.Helper()
		rec := record.New(1)
		rec.Arrive = time.Now()
		rec.API, rec.Traffic, rec.Outcome, rec.Stream, rec.OutputTokens = stream.NameChat, "live", record.Success, true, 1
		rec.AddToken(rec.Arrive.Add(264*ms), 1, true)
		rec.Terminal, rec.Upstream = rec.Arrive.Add(270*ms), up
		_, s := tr.Start(context.Background(), httptest.NewRequest("POST", "/v1/chat/completions", nil), rec,
			&url.URL{Scheme: "https", Host: "api.test"}, pipeline.Params{}, nil)
		s.End(rec, nil)
		ended := spans.Ended()
		got := map[string]any{}
		for _, sp := range ended[len(ended)-2:] {
			if sp.SpanKind() != trace.SpanKindClient {
				continue
			}
			for _, kv := range sp.Attributes() {
				if k := string(kv.Key); strings.HasPrefix(k, "tokentap.upstream.") {
					got[k] = kv.Value.AsInterface()
				}
			}
		}
		return got
	}
	fresh := record.Upstream{Asked: true}
	fresh.Set(record.UpConnWait, 24*ms)
	fresh.Set(record.UpConnect, 3*ms)
	fresh.Set(record.UpTLS, 20*ms)
	fresh.Set(record.UpServer, 240*ms)
	reused := record.Upstream{Asked: true, Reused: true}
	reused.Set(record.UpConnWait, 0)
	reused.Set(record.UpServer, 240*ms)
	for _, c := range []struct {
		name string
		up   record.Upstream
		want map[string]any
	}{
		{"new connection", fresh, map[string]any{"tokentap.upstream.reused": false, "tokentap.upstream.conn_wait": 0.024,
			"tokentap.upstream.connect": 0.003, "tokentap.upstream.tls": 0.02, "tokentap.upstream.server": 0.24}},
		{"reused", reused, map[string]any{"tokentap.upstream.reused": true, "tokentap.upstream.conn_wait": 0.0, "tokentap.upstream.server": 0.24}},
		{"never forwarded", record.Upstream{}, map[string]any{}},
	} {
		got := end(c.up)
		if len(got) != len(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
			continue
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s: %s = %v, want %v", c.name, k, got[k], v)
			}
		}
	}
}
