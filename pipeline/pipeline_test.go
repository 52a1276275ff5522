package pipeline_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/tracing"
)

// liveSpy records the order of the live calls.
type liveSpy struct{ log *[]string }

func (l liveSpy) Begin(k record.Key) record.Observation {
	*l.log = append(*l.log, "begin model="+k.Model)
	return l
}
func (l liveSpy) Gap(time.Duration)          {}
func (l liveSpy) ForwardDelay(time.Duration) {}
func (l liveSpy) Malformed()                 {}
func (l liveSpy) UsageInjected()             {}
func (l liveSpy) TapFailed(string)           {}
func (l liveSpy) Done()                      { *l.log = append(*l.log, "live done") }

type sinkFunc func(*record.Record)

func (f sinkFunc) Write(r *record.Record) { f(r) }

// End runs its stages in the documented order, each seeing the fields
// set by the stages before it: live done, canary check (no verdict yet),
// SLO verdict, spans ended, metric backends, then the sinks.
func TestStagesRunInOrder(t *testing.T) {
	var log []string
	sunk := 0
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	metrics := exporter.New(exporter.Config{MaxModels: 1, SLOs: []string{"chat"}})
	cfg := slo.Config{Objectives: []slo.Objective{{Name: "chat", Target: 0.9, Thresholds: slo.Thresholds{TTFT: time.Second}}}}
	book := slo.NewBook(cfg, nil)
	p := pipeline.New(pipeline.Options{
		Live: liveSpy{&log}, Models: metrics.Models(), Judge: slo.NewJudge(cfg),
		Tracer: tracing.New(tracing.Options{Provider: tp}), Prometheus: metrics, Book: book,
		Sinks: []record.Sink{sinkFunc(func(r *record.Record) {
			log = append(log, "sink")
			if len(spans.Ended()) != 2 {
				t.Errorf("sink before the spans ended (%d ended)", len(spans.Ended()))
			}
			if n := requests(t, metrics); n != float64(sunk+1) {
				t.Errorf("sink before the Prometheus backend counted the request (%v counted, %d sunk)", n, sunk)
			}
			sunk++
			if len(r.SLO) != 1 || !r.SLO[0].Qualified || r.PromptClass != "short" {
				t.Errorf("sink got no verdict: %+v", r.SLO)
			}
		})},
	})
	base := time.Now()
	for i, model := range []string{"first", "second"} {
		rec := record.New(2)
		rec.Arrive, rec.API, rec.Traffic, rec.Stream = base, record.APIChat, "live", true
		rec.SetModel(model)
		up, _ := url.Parse("http://127.0.0.1:1")
		_, q := p.Begin(context.Background(), rec, pipeline.Start{
			Key: record.Key{API: rec.API, Model: rec.Model, Traffic: "live"}, HTTP: httptest.NewRequest("POST", "/v1/chat/completions", nil), Upstream: up,
			Check: func(r *record.Record) {
				log = append(log, "check")
				if r.SLO != nil || r.PromptClass != "" {
					t.Error("the canary check ran after the SLO verdict")
				}
			},
		})
		if rec.TraceID == "" {
			t.Fatal("Begin did not start the spans")
		}
		q.Tokens(1) // energy off: a no-op, never a panic
		rec.AddToken(base.Add(10*time.Millisecond), 1, true)
		rec.AddToken(base.Add(20*time.Millisecond), 1, true)
		rec.Outcome, rec.OutputTokens, rec.InputTokens, rec.Terminal = record.Success, 2, 3, base.Add(21*time.Millisecond)
		q.End(rec, nil)
		q.End(rec, nil) // a second End does nothing
		if i == 0 {
			spans = tracetest.NewSpanRecorder()
			tp.RegisterSpanProcessor(spans)
		}
	}
	want := "begin model=first,live done,check,sink,begin model=_other,live done,check,sink"
	if got := strings.Join(log, ","); got != want {
		t.Fatalf("stages ran\n %s\nwant\n %s", got, want)
	}
	if st := book.Status(time.Now()); st.SLOs[0].Offered != 2 || st.SLOs[0].Qualified != 2 {
		t.Fatalf("the /slo book counted %+v", st.SLOs[0])
	}
}

// requests sums tokentap_requests_total over its series.
func requests(t *testing.T, m *exporter.Metrics) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() == "tokentap_requests_total" {
			for _, x := range f.GetMetric() {
				sum += x.GetCounter().GetValue()
			}
		}
	}
	return sum
}
