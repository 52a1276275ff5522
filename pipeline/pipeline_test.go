package pipeline_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/gpu"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
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
		rec.Arrive, rec.API, rec.Traffic, rec.Stream = base, stream.NameChat, "live", true
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
		rec.HTTPStatus, rec.Outcome, rec.OutputTokens, rec.InputTokens, rec.Terminal = 200, record.Success, 2, 3, base.Add(21*time.Millisecond)
		q.End(rec, nil)
		q.End(rec, nil) // a second End does nothing
		if i == 0 {
			spans = tracetest.NewSpanRecorder()
			tp.RegisterSpanProcessor(spans)
		}
	}
	want := "begin model=first,live done,check,sink,begin model=second,live done,check,sink"
	if got := strings.Join(log, ","); got != want {
		t.Fatalf("stages ran\n %s\nwant\n %s", got, want)
	}
	if st := book.Status(time.Now()); st.SLOs[0].Offered != 2 || st.SLOs[0].Qualified != 2 {
		t.Fatalf("the /slo book counted %+v", st.SLOs[0])
	}
	// One slot (max_models 1): the first served name took it, the second
	// is _other.
	if got := modelsOf(t, metrics); got != "_other,first" {
		t.Fatalf("model labels %s", got)
	}
}

// A name the engine rejects (404) never takes a label slot; names the
// engine lists always have one; a served name takes a free slot.
func TestModelLabelsFromTheEngine(t *testing.T) {
	metrics := exporter.New(exporter.Config{MaxModels: 1, Models: []string{"declared"}})
	metrics.Models().SetListed([]string{"listed-a", "listed-b"})
	p := pipeline.New(pipeline.Options{Live: metrics, Models: metrics.Models(), Prometheus: metrics})
	end := func(model string, status int, outcome record.Outcome) {
		rec := record.New(1)
		rec.Arrive, rec.API, rec.Traffic, rec.Stream = time.Now(), stream.NameChat, "live", true
		rec.SetModel(model)
		_, q := p.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: rec.API, Model: rec.Model, Traffic: "live"}})
		rec.HTTPStatus, rec.Outcome, rec.Terminal = status, outcome, time.Now()
		q.End(rec, nil)
	}
	for i := 0; i < 30; i++ {
		end(randomName(i), 404, record.Error) // invented names, rejected
	}
	end("served", 200, record.Success)
	end("served-too", 200, record.Success) // no slot left
	end("listed-b", 200, record.Success)
	end("declared", 200, record.Success)
	if got := modelsOf(t, metrics); got != "_other,declared,listed-b,served" {
		t.Fatalf("model labels %s", got)
	}
}

func randomName(i int) string { return "invented-" + strings.Repeat("x", i) }

// modelsOf lists the model label values of tokentap_requests_total.
func modelsOf(t *testing.T, m *exporter.Metrics) string {
	t.Helper()
	fams, _ := m.Registry.Gather()
	seen := map[string]bool{}
	for _, f := range fams {
		if f.GetName() != "tokentap_requests_total" {
			continue
		}
		for _, x := range f.GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "gen_ai_request_model" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
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

// A stage given as a nil pointer is off, as a nil field is: the sidecar
// and the tests pass the energy sampler, the tracer and the OTLP backend
// as nil pointers when they are off, and an interface holding one is not
// nil.
func TestNilPointerStagesAreOff(t *testing.T) {
	var got []*record.Record
	p := pipeline.New(pipeline.Options{
		Live: (*exporter.Metrics)(nil), Models: (*exporter.ModelLabels)(nil), Judge: (*slo.Judge)(nil),
		Energy: (*gpu.Sampler)(nil), Tracer: (*tracing.Tracer)(nil), Prometheus: (*exporter.Metrics)(nil),
		OTLP: (*exporter.OTLP)(nil), Book: (*slo.Book)(nil), Load: (*slo.LoadMeter)(nil), Scorecard: (*slo.Scorecard)(nil),
		Sinks: []record.Sink{sinkFunc(func(r *record.Record) { got = append(got, r) })},
	})
	rec := record.New(1)
	rec.Arrive, rec.API, rec.Traffic, rec.Stream = time.Now(), stream.NameChat, "live", true
	up, _ := url.Parse("http://127.0.0.1:1")
	ctx, q := p.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: rec.API, Traffic: "live"},
		HTTP: httptest.NewRequest("POST", "/v1/chat/completions", nil), Upstream: up, PromptTokens: 10})
	p.Inject(ctx, http.Header{})
	q.Gap(time.Millisecond)
	q.Tokens(1)
	rec.HTTPStatus, rec.Outcome, rec.Terminal = 200, record.Success, time.Now()
	q.End(rec, nil)
	if len(got) != 1 || p.Capturing() || rec.SLO != nil || rec.EnergySource != "" || rec.TraceID != "" {
		t.Fatalf("%d records, capturing %v, verdicts %v, energy %q, trace %q", len(got), p.Capturing(), rec.SLO, rec.EnergySource, rec.TraceID)
	}
}

// A stage that panics (here the check, and the first of two sinks) does
// not keep the record from the later ones: the second sink still gets
// it, and End raises the first panic, with its stack, once every stage
// has run, for the proxy to log and count (issue 40, item 1).
func TestPanickingStageSparesTheLaterOnes(t *testing.T) {
	var got []*record.Record
	p := pipeline.New(pipeline.Options{Sinks: []record.Sink{
		sinkFunc(func(*record.Record) { panic("sink bug") }),
		sinkFunc(func(r *record.Record) { got = append(got, r) }),
	}})
	rec := record.New(0)
	rec.Arrive, rec.API, rec.Traffic = time.Now(), stream.NameChat, "live"
	_, q := p.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: rec.API, Traffic: "live"}, PromptTokens: -1,
		Check: func(*record.Record) { panic("check bug") }})
	rec.HTTPStatus, rec.Outcome, rec.Terminal = 200, record.Success, time.Now()
	var raised any
	func() {
		defer func() { raised = recover() }()
		q.End(rec, nil)
	}()
	sp, ok := raised.(pipeline.StagePanic)
	if !ok || sp.Value != "check bug" || !strings.Contains(string(sp.Stack), "TestPanickingStageSparesTheLaterOnes") {
		t.Errorf("End raised %v, want the check's panic with its stack", raised)
	}
	if len(got) != 1 || got[0] != rec {
		t.Errorf("%d records reached the second sink, want 1", len(got))
	}
}

// The load meter costs a request no allocation: Begin and End with a
// Load allocate what they do without one, and the record gets its load.
func TestLoadAllocatesNothingPerRequest(t *testing.T) {
	run := func(load pipeline.Load) (float64, *record.Record) {
		p := pipeline.New(pipeline.Options{Load: load})
		var rec *record.Record
		n := testing.AllocsPerRun(200, func() {
			rec = record.New(1)
			rec.API, rec.Traffic = stream.NameChat, "live"
			_, q := p.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: rec.API, Traffic: "live"}, PromptTokens: -1})
			q.End(rec, nil)
		})
		return n, rec
	}
	without, _ := run(nil)
	with, rec := run(slo.NewLoadMeter(slo.NewLoadBuckets(config.Capacity{})))
	if with != without {
		t.Errorf("%v allocations per request with a load meter, %v without", with, without)
	}
	if rec.Load != 1 || rec.LoadBucket == "" {
		t.Errorf("load %v in %q, want 1 (itself alone) in a bucket", rec.Load, rec.LoadBucket)
	}
}
