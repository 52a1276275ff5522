// Package pipeline is the life of a request after the proxy has read it,
// in one place: Begin at arrival, and End, the ordered stages that every
// finished request goes through. Read End top to bottom: it is the order
// in which the record is completed and published.
//
//	proxy/tap ─ outcome, tokens final ─► End
//	  1. live observers done            (in-flight gauges; the load it ran under)
//	  2. canary check                   (probe: quality check, rec.Probe)
//	  3. SLO verdict                    (slo.Judge: classes, stalls, verdicts)
//	     engine signals                 (engine.Scraper: preemptions during, stall cause)
//	  4. energy hold                    (gpu.Sampler: energy fields; waits ≤ one interval)
//	  5. spans end                      (tracing: attributes from the record)
//	  6. metric backends                (exporter.Map → Prometheus, OTLP; /slo book)
//	  7. record sinks                   (JSONL)
//
// Stages 1-3 run on the request's goroutine. With energy on, 5-7 run
// when the sampler has attributed the interval the request ended in, on
// the sampler's publisher goroutine (never the sampler's own: see
// gpu.Sampler.Run); nothing writes the record after stage 4.
package pipeline

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/gpu"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/tracing"
)

// Options are the stages' components. A nil field skips its stage.
type Options struct {
	// Live observes requests while they run (the Prometheus backend's
	// live instruments). Nil observes nothing live.
	Live record.Observer
	// Models bounds the model label of every backend at the end (the
	// Prometheus live observer shares it); nil keeps names as they are.
	Models *exporter.ModelLabels
	// Judge gives the SLO verdict (stage 3); nil judges nothing.
	Judge *slo.Judge
	// Engine ties the engine's own signals to the request, right after
	// the verdict (stage 3); nil: no engine scraper.
	Engine EngineSignals
	// Energy holds records for their energy (stage 4); nil: energy off.
	Energy *gpu.Sampler
	// Tracer ends the spans (stage 5); nil traces nothing.
	Tracer *tracing.Tracer
	// Prometheus and OTLP are the metric backends (stage 6).
	Prometheus *exporter.Metrics
	OTLP       *exporter.OTLP
	// Book is this instance's /slo view (stage 6).
	Book *slo.Book
	// Load measures the load each request ran under (stage 1: rec.Load,
	// rec.LoadBucket); nil measures none.
	Load *slo.LoadMeter
	// Scorecard adds cost, energy, latency tail and the knee to /slo
	// (stage 6); nil: none.
	Scorecard *slo.Scorecard
	// Sinks receive every record last (stage 7).
	Sinks []record.Sink
}

// EngineSignals is what the engine scraper (package engine) says about a
// finished request: the engine's preemptions during its life (-1 when
// unknown) and what coincided with its stalls, the gaps above
// stallThreshold ("" when none).
type EngineSignals interface {
	Signals(rec *record.Record, stallThreshold time.Duration) (preemptions int, cause string)
}

// Pipeline runs the stages. Its methods are safe for concurrent use.
type Pipeline struct{ o Options }

// New returns a pipeline of the given stages.
func New(o Options) *Pipeline {
	if o.Live == nil {
		o.Live = record.Nop{}
	}
	return &Pipeline{o: o}
}

// Start describes a request at arrival.
type Start struct {
	// Key labels the request; its Model is the raw name, bounded here.
	Key record.Key
	// HTTP is the client's request, for the spans; nil: no spans.
	HTTP *http.Request
	// Upstream is where the request goes (server.address on the span).
	Upstream *url.URL
	// Params and Body are the sampling parameters and the request body
	// (kept only when content capture is on), for the spans.
	Params tracing.Params
	Body   []byte
	// PromptTokens estimates the prompt's tokens for the energy share;
	// negative: the request is not tracked for energy.
	PromptTokens int64
	// Check, if set, is the canary probe's end-of-request check (stage 2).
	Check func(*record.Record)
}

// Request is one request in flight: the per-event calls the tap makes,
// and End. Its per-event methods allocate nothing and take no lock
// shared across requests.
type Request struct {
	p      *Pipeline
	live   record.Observation
	model  string // as requested
	labels exporter.Labels
	energy *gpu.Req
	load   slo.LoadSpan
	spans  *tracing.Spans
	check  func(*record.Record)
	ended  bool
}

// Begin starts a request whose record rec has its arrival, identity and
// request fields set. It returns the context the upstream request must
// carry (the inference span's, when traced).
func (p *Pipeline) Begin(ctx context.Context, rec *record.Record, s Start) (context.Context, *Request) {
	k := s.Key
	q := &Request{p: p, live: p.o.Live.Begin(k), model: k.Model, labels: exporter.BaseLabels(k), check: s.Check}
	if p.o.Energy != nil && s.PromptTokens >= 0 {
		q.energy = p.o.Energy.Start(s.PromptTokens)
	}
	if p.o.Load != nil {
		q.load = p.o.Load.Begin()
	}
	if s.HTTP != nil {
		ctx, q.spans = p.o.Tracer.Start(ctx, s.HTTP, rec, s.Upstream, s.Params, s.Body)
	}
	return ctx, q
}

// Inject writes the request's trace context into the upstream headers.
func (p *Pipeline) Inject(ctx context.Context, h http.Header) { p.o.Tracer.Inject(ctx, h) }

// Capturing reports whether content capture is on.
func (p *Pipeline) Capturing() bool { return p.o.Tracer.Capturing() }

// Gap observes one inter-token gap (hot path).
func (q *Request) Gap(d time.Duration) { q.live.Gap(d) }

// ForwardDelay observes the forwarding delay of one chunk (hot path).
func (q *Request) ForwardDelay(d time.Duration) { q.live.ForwardDelay(d) }

// Malformed counts an event that could not be parsed.
func (q *Request) Malformed() { q.live.Malformed() }

// UsageInjected counts a request whose usage the sidecar asked for.
func (q *Request) UsageInjected() { q.live.UsageInjected() }

// TapFailed counts a fail-open fallback.
func (q *Request) TapFailed(reason string) { q.live.TapFailed(reason) }

// ResponseModel names the model of a request that named none, from its
// response (the proxy's, when the request's body was not read whole):
// its model label, live and at the end, is that name from then on. Once
// per request.
func (q *Request) ResponseModel(name string) {
	if q.model != "" {
		return
	}
	q.model, q.labels[exporter.LModel] = name, name
	if m, ok := q.live.(interface{ ResponseModel(string) }); ok {
		m.ResponseModel(name)
	}
}

// Tokens counts n tokens produced now, for the energy share (hot path:
// an atomic add on the request's own counter).
func (q *Request) Tokens(n int64) {
	if q.energy != nil {
		q.energy.Tokens(n)
	}
}

// End runs the end-of-request stages on a finished record: its outcome,
// instants and token counts are final. captured is the response body kept
// for content capture, or nil. End is called once; later calls do
// nothing.
func (q *Request) End(rec *record.Record, captured []byte) {
	if q.ended {
		return
	}
	q.ended = true
	p := q.p
	// 1. The request is over for the live observers; its model label is
	// decided (a name the engine served may take a slot); the load it
	// ran under is known.
	q.live.Done()
	if p.o.Load != nil {
		rec.Load, rec.LoadBucket = q.load.End()
	}
	if p.o.Models != nil {
		if served(rec) {
			q.labels[exporter.LModel] = p.o.Models.Admit(q.model)
		} else {
			q.labels[exporter.LModel] = p.o.Models.Label(q.model)
		}
	}
	// 2. A canary probe checks its answer and says so in the record.
	if q.check != nil {
		q.check(rec)
	}
	// 3. The SLO verdict: classes, stalls, one verdict per SLO in scope.
	if p.o.Judge != nil {
		v := p.o.Judge.Judge(rec)
		rec.PromptClass, rec.OutputClass, rec.Stalls, rec.SLO = v.PromptClass, v.OutputClass, v.Stalls, v.SLO
	}
	// The engine's signals: its preemptions while the request ran, and
	// what coincided with the stalls the verdict counted.
	if p.o.Engine != nil {
		var th time.Duration
		if p.o.Judge != nil {
			th = p.o.Judge.Config().StallThreshold
		}
		rec.PreemptionsDuring, rec.StallCause = p.o.Engine.Signals(rec, th)
	}
	// 4. Energy: held until the interval the request ended in is
	// attributed; the rest continues then, on the sampler's publisher.
	if q.energy != nil {
		p.o.Energy.Hold(q.energy, rec, func(a gpu.Attribution) {
			rec.EnergyJ, rec.EnergyDynamicJ, rec.EnergySource, rec.DecodeSOL = a.EnergyJ, a.DynamicJ, a.Source, a.DecodeSOL
			q.publish(rec, captured)
		})
		return
	}
	q.publish(rec, captured)
}

// served reports whether the engine served the request's model: a 2xx
// response that succeeded or produced a token.
func served(rec *record.Record) bool {
	return rec.HTTPStatus >= 200 && rec.HTTPStatus < 300 && (rec.Outcome == record.Success || rec.TokenEvents() > 0)
}

// Record hands a record with no request behind it (a probe that could
// not be sent) to the sinks alone: it is neither judged nor counted.
func (p *Pipeline) Record(rec *record.Record) {
	for _, s := range p.o.Sinks {
		s.Write(rec)
	}
}

// publish runs stages 5 to 7; the record is complete and no longer
// written.
func (q *Request) publish(rec *record.Record, captured []byte) {
	p := q.p
	// 5. The spans end at the record's terminal instant, with its numbers.
	q.spans.End(rec, captured)
	// 6. The metric backends, through the one mapping.
	if p.o.Prometheus != nil {
		p.o.Prometheus.Publish(rec, q.labels)
	}
	if p.o.OTLP != nil {
		p.o.OTLP.Publish(rec, q.labels)
	}
	if p.o.Book != nil {
		p.o.Book.Add(rec)
	}
	if p.o.Scorecard != nil {
		p.o.Scorecard.Add(rec)
	}
	// 7. The record sinks, last.
	p.Record(rec)
}
