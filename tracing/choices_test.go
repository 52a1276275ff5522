package tracing

import (
	"context"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// A response with two choices: the span carries both finish reasons and
// the worst choice's TPOT and max ITL, as the record, the verdict and
// the metrics do.
func TestSpanOfTwoChoices(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tr := New(Options{Provider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	const ms = time.Millisecond
	rec := record.New(8)
	rec.Arrive = time.Now()
	rec.API, rec.Traffic, rec.Outcome, rec.Stream, rec.OutputTokens = stream.NameChat, "live", record.Success, true, 8
	rec.SetModel("m")
	rec.AddToken(rec.Arrive.Add(100*ms), 0, true)
	rec.SplitChoices(0)
	rec.ChoiceSlot(1)
	for k := range 4 {
		if k > 0 {
			rec.AddChoiceToken(0, rec.Arrive.Add(time.Duration(100+60*k)*ms), 0, true)
		}
		rec.AddChoiceToken(1, rec.Arrive.Add(time.Duration(130+60*k)*ms), 0, true)
	}
	rec.SetChoiceFinish(0, []byte("stop"))
	rec.SetChoiceFinish(1, []byte("length"))
	rec.Terminal = rec.Arrive.Add(320 * ms)
	_, s := tr.Start(context.Background(), httptest.NewRequest("POST", "/v1/chat/completions", nil), rec,
		&url.URL{Scheme: "http", Host: "engine:8000"}, pipeline.Params{}, nil)
	s.End(rec, nil)
	found := 0
	for _, sp := range spans.Ended() {
		for _, kv := range sp.Attributes() {
			switch kv.Key {
			case "gen_ai.response.finish_reasons":
				found++
				if got := kv.Value.AsStringSlice(); !slices.Equal(got, []string{"stop", "length"}) {
					t.Errorf("finish reasons %q, want stop, length", got)
				}
			case "tokentap.tpot", "tokentap.max_itl":
				found++
				if kv.Value.AsFloat64() != 0.06 {
					t.Errorf("%s = %v, want the worst choice's 0.06 s", kv.Key, kv.Value.AsFloat64())
				}
			}
		}
	}
	if found != 3 {
		t.Fatalf("%d of the 3 attributes found", found)
	}
}
