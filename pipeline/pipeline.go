// Package pipeline is the life of a request after the proxy has read it,
// in one place: Begin at arrival, and End, the ordered stages that every
// finished request goes through. Read End top to bottom: it is the order
// in which the record is completed and published.
//
//	proxy/tap ─ outcome, tokens final ─► End
//	  1. live observers done            (in-flight gauges; the load it ran under;
//	                                     the model and tenant labels bounded)
//	  2. canary check                   (probe: quality check, rec.Probe)
//	  3. SLO verdict                    (slo.Judge: classes, stalls, verdicts)
//	     engine signals                 (engine.Scraper: preemptions during, stall cause)
//	     slow causes                    (cause.Attributor: a cause per slow first token and stall)
//	     workload capture               (capture.Capture: the trace line, live traffic only)
//	  4. energy hold                    (gpu.Sampler: energy fields; waits ≤ one interval)
//	  5. spans end                      (tracing: attributes from the record)
//	  6. metric backends                (exporter.Map → Prometheus, OTLP; /slo book)
//	  7. record sinks                   (records file, stdout)
//
// Stages 1-4 run on End's caller (the proxy's end-stages goroutine with
// proxy.Options.Ends, else the request's handler), and so do 5-7 with
// energy off. With energy on, 5-7 run when the sampler has attributed the
// interval the request ended in, off the sampler's own goroutine (see
// gpu.Sampler.Run). Nothing writes the record after stage 4. A stage
// that panics keeps the record from none of the later ones; End raises
// its panic (StagePanic) once they ran.
//
// Each stage is an interface declared here, with record types alone in
// its methods: the pipeline, and the proxy above it, compile without
// NVML, gRPC or the OTel SDK (docs/design.md, "Packages and their
// direction").
package pipeline

import (
	"context"
	"net/http"
	"net/url"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Options are the stages' components, each behind the small interface
// declared below (app wires the concrete ones). A nil field, or one
// holding a nil pointer, skips its stage.
type Options struct {
	// Live observes requests while they run (the Prometheus backend's
	// live instruments). Nil observes nothing live.
	Live record.Observer
	// Models bounds the model label of every backend at the end (the
	// Prometheus live observer shares it); nil keeps names as they are.
	Models Models
	// Tenants bounds the tenant label (tenant.Resolver): the record's
	// identity becomes its label at the end; nil keeps it as it is.
	Tenants Tenants
	// Judge gives the SLO verdict (stage 3); nil judges nothing.
	Judge Judge
	// Engine ties the engine's own signals to the request, right after
	// the verdict (stage 3); nil: no engine scraper.
	Engine EngineSignals
	// Energy holds records for their energy (stage 4); nil: energy off.
	Energy Energy
	// Tracer starts and ends the spans (stage 5); nil traces nothing.
	Tracer Tracer
	// Prometheus and OTLP are the metric backends (stage 6).
	Prometheus Metrics
	OTLP       Metrics
	// Book is this instance's /slo view (stage 6).
	Book Tally
	// Load measures the load each request ran under (stage 1: rec.Load,
	// rec.LoadBucket); nil measures none.
	Load Load
	// Scorecard adds cost, energy, latency tail and the knee to /slo
	// (stage 6); nil: none.
	Scorecard Tally
	// Sinks receive every record last (stage 7).
	Sinks []record.Sink
	// Capture writes the workload trace, after the verdict (stage 3);
	// nil: capture off.
	Capture Capture
	// Causes attributes the slow first tokens and stalls, after the
	// engine signals (stage 3); nil: no attribution.
	Causes Causes
}

// Causes says why each request was slow (cause.Attributor,
// docs/measurement.md §6b).
type Causes interface {
	// Begin tracks a request from its arrival: rec has its id and
	// arrival; promptBytes (> 0) is its prompt's size in body bytes.
	Begin(rec *record.Record, promptBytes int64) CauseEntry
}

// CauseEntry is one tracked request: Sent stamps when it was written to
// the engine, First its first token (each once, an atomic store), End
// attributes its slow events into rec.Causes.
type CauseEntry = interface {
	Sent(t time.Time)
	First(t time.Time)
	End(rec *record.Record)
}

// Capture writes one trace line per finished live request
// (capture.Capture, docs/capture.md).
type Capture interface {
	// Begin tracks a live request from its start: body is its request
	// body, or the peek's prefix of it when partial, kept to be hashed
	// when the request ends; h its headers (the session header). nil:
	// the request is not captured.
	Begin(rec *record.Record, body []byte, partial bool, h http.Header) CaptureEntry
}

// CaptureEntry is one captured request: End writes its line from the
// finished record, under the bounded model label.
type CaptureEntry = interface {
	End(rec *record.Record, model string)
}

// Models bounds the model label (exporter.ModelLabels).
type Models interface {
	// Admit returns the label of a model the engine has just served,
	// giving it a slot of its own while there is room.
	Admit(model string) string
	// Label returns the label of a model without admitting it.
	Label(model string) string
}

// Tenants bounds the tenant label (tenant.Resolver).
type Tenants interface {
	// Admit returns the label of the identity of a request the engine
	// has just served, giving it a slot of its own while there is room.
	Admit(id string) string
	// Label returns the label of an identity without admitting it.
	Label(id string) string
}

// Judge gives a finished record its SLO verdict (slo.Judge).
type Judge interface {
	// Apply sets rec's classes, stall count and one verdict per SLO in
	// whose scope it is.
	Apply(rec *record.Record)
	// StallThreshold is the gap above which a gap is a stall.
	StallThreshold() time.Duration
}

// EngineSignals is what the engine scraper (package engine) says about a
// finished request: the engine's preemptions during its life (-1 when
// unknown) and what coincided with its stalls, the gaps above
// stallThreshold ("" when none).
type EngineSignals interface {
	Signals(rec *record.Record, stallThreshold time.Duration) (preemptions int, cause string)
}

// Energy attributes the GPUs' energy to requests (gpu.Sampler).
type Energy interface {
	// Start tracks a request from now; promptTokens estimates its
	// prompt's tokens.
	Start(promptTokens int64) EnergyShare
}

// EnergyShare is one request's share of the energy.
type EnergyShare interface {
	// Tokens counts n tokens produced now (hot path: it allocates
	// nothing and takes no lock shared across requests).
	Tokens(n int64)
	// Hold is called once, when the request has ended, with its finished
	// record; then runs once the interval it ended in is attributed,
	// with rec's energy fields set.
	Hold(rec *record.Record, then func())
}

// Tracer starts and ends each request's spans (tracing.Tracer).
type Tracer interface {
	// Start opens the request's spans and returns the context the
	// upstream request must carry; nil Spans: the request is not traced.
	Start(ctx context.Context, r *http.Request, rec *record.Record, upstream *url.URL, p Params, body []byte) (context.Context, Spans)
	// Inject writes ctx's trace context into the upstream headers.
	Inject(ctx context.Context, h http.Header)
	// Capturing reports whether content capture is on.
	Capturing() bool
}

// Spans are one traced request's spans.
type Spans interface {
	// End closes them with the finished record's numbers; captured is
	// the response body kept for content capture, or nil.
	End(rec *record.Record, captured []byte)
}

// Params are the request's sampling parameters that the inference span
// carries (gen_ai.request.*); nil and 0 are not sent.
type Params struct {
	MaxTokens   int64
	Temperature *float64
	TopP        *float64
	Seed        *int64
}

// Metrics is a metric backend (exporter.Metrics, exporter.OTLP): it
// observes a finished record under its key, whose Model is the bounded
// model label.
type Metrics interface {
	Publish(rec *record.Record, k record.Key)
}

// Tally counts each finished record (slo.Book, slo.Scorecard).
type Tally interface {
	Add(rec *record.Record)
}

// Load measures the load requests run under (slo.LoadMeter).
type Load interface {
	// Begin counts a request in flight from now and returns where it
	// began.
	Begin() LoadMark
	// End ends the request begun at mark and returns the load it ran
	// under and the label of the load's bucket.
	End(mark LoadMark) (load float64, bucket string)
}

// LoadMark is where a request began on a Load: the Load's clock and its
// integral of the in-flight count then, in the Load's own units. A value,
// kept in the Request: no allocation per request (an interface holding
// the span cost one).
type LoadMark struct {
	At, Integral float64
}

// Pipeline runs the stages. Its methods are safe for concurrent use.
type Pipeline struct{ o Options }

// New returns a pipeline of the given stages.
func New(o Options) *Pipeline {
	unset(&o.Live)
	unset(&o.Models)
	unset(&o.Tenants)
	unset(&o.Judge)
	unset(&o.Engine)
	unset(&o.Energy)
	unset(&o.Tracer)
	unset(&o.Prometheus)
	unset(&o.OTLP)
	unset(&o.Book)
	unset(&o.Load)
	unset(&o.Scorecard)
	unset(&o.Capture)
	unset(&o.Causes)
	if o.Live == nil {
		o.Live = record.Nop{}
	}
	return &Pipeline{o: o}
}

// unset makes a stage holding a nil pointer nil: an interface holding
// one is not nil, and its methods would be called.
func unset[T any](stage *T) {
	if v := reflect.ValueOf(stage).Elem(); !v.IsNil() && v.Elem().Kind() == reflect.Pointer && v.Elem().IsNil() {
		var none T
		*stage = none
	}
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
	Params Params
	Body   []byte
	// PromptTokens estimates the prompt's tokens for the energy share;
	// negative: the request is not tracked for energy.
	PromptTokens int64
	// Check, if set, is the canary probe's end-of-request check (stage 2).
	Check func(*record.Record)
	// Prompt is the request body for the workload capture (the peek's
	// prefix when PromptPartial), set only when CapturingWorkload.
	Prompt        []byte
	PromptPartial bool
	// PromptBytes is the prompt's size in request body bytes, for the
	// slow causes' long prompts; 0 (the zero value) or negative: a
	// request the causes do not track (one that occupies no sequence).
	PromptBytes int64
}

// Request is one request in flight: the per-event calls the tap makes,
// and End. Its per-event methods allocate nothing and take no lock
// shared across requests.
type Request struct {
	p      *Pipeline
	live   record.Observation
	model  string     // as requested
	key    record.Key // the metric backends' key: its Model is the label
	energy EnergyShare
	load   LoadMark // where it began on p.o.Load, if set
	spans  Spans
	check  func(*record.Record)
	cap    CaptureEntry
	why    CauseEntry
	ended  bool
}

// Begin starts a request whose record rec has its arrival, identity and
// request fields set. It returns the context the upstream request must
// carry (the inference span's, when traced).
func (p *Pipeline) Begin(ctx context.Context, rec *record.Record, s Start) (context.Context, *Request) {
	k := s.Key
	q := &Request{p: p, live: p.o.Live.Begin(k), model: k.Model, key: k, check: s.Check}
	if p.o.Energy != nil && s.PromptTokens >= 0 {
		q.energy = p.o.Energy.Start(s.PromptTokens)
	}
	if p.o.Load != nil {
		q.load = p.o.Load.Begin()
	}
	if p.o.Causes != nil && s.PromptBytes > 0 {
		q.why = p.o.Causes.Begin(rec, s.PromptBytes)
	}
	if s.HTTP != nil && p.o.Tracer != nil {
		ctx, q.spans = p.o.Tracer.Start(ctx, s.HTTP, rec, s.Upstream, s.Params, s.Body)
	}
	if p.o.Capture != nil && k.Traffic == "live" && k.Probe == "" {
		var h http.Header
		if s.HTTP != nil {
			h = s.HTTP.Header
		}
		q.cap = p.o.Capture.Begin(rec, s.Prompt, s.PromptPartial, h)
	}
	return ctx, q
}

// CapturingWorkload reports whether the workload capture is on: Start's
// Prompt is then wanted.
func (p *Pipeline) CapturingWorkload() bool { return p.o.Capture != nil }

// Inject writes the request's trace context into the upstream headers.
func (p *Pipeline) Inject(ctx context.Context, h http.Header) {
	if p.o.Tracer != nil {
		p.o.Tracer.Inject(ctx, h)
	}
}

// Capturing reports whether content capture is on.
func (p *Pipeline) Capturing() bool { return p.o.Tracer != nil && p.o.Tracer.Capturing() }

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

// InternalError counts a panic the sidecar recovered from while serving
// a request (where: proxy.InternalRequest or proxy.InternalEnd), on the
// live observer when it counts them (exporter.Metrics); there may be no
// Request to count it on (a panic before one began).
func (p *Pipeline) InternalError(where string) {
	if c, ok := p.o.Live.(interface{ InternalError(where string) }); ok {
		c.InternalError(where)
	}
}

// ResponseModel names the model of a request that named none, from its
// response (the proxy's, when the request's body was not read whole):
// its model label, live and at the end, is that name from then on. Once
// per request.
func (q *Request) ResponseModel(name string) {
	if q.model != "" {
		return
	}
	q.model, q.key.Model = name, name
	if m, ok := q.live.(interface{ ResponseModel(string) }); ok {
		m.ResponseModel(name)
	}
}

// Sent stamps when the request was written to the engine whole, for the
// slow causes of the requests around it (the engine had it from then):
// called once per attempt, off the token path (an atomic store).
func (q *Request) Sent(t time.Time) {
	if q.why != nil {
		q.why.Sent(t)
	}
}

// FirstToken stamps the request's first token, at t, for the slow
// causes of the requests around it: called once, at the first token
// event (an atomic store).
func (q *Request) FirstToken(t time.Time) {
	if q.why != nil {
		q.why.First(t)
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
	var st stages
	defer st.raise()
	// 1. The request is over for the live observers; its model label is
	// decided (a name the engine served may take a slot); the load it
	// ran under is known.
	st.run(func() {
		q.live.Done()
		if p.o.Load != nil {
			rec.Load, rec.LoadBucket = p.o.Load.End(q.load)
		}
		if p.o.Models != nil {
			if served(rec) {
				q.key.Model = p.o.Models.Admit(q.model)
			} else {
				q.key.Model = p.o.Models.Label(q.model)
			}
		}
		if p.o.Tenants != nil && rec.Tenant != "" {
			if served(rec) {
				rec.Tenant = p.o.Tenants.Admit(rec.Tenant)
			} else {
				rec.Tenant = p.o.Tenants.Label(rec.Tenant)
			}
		}
	})
	// 2. A canary probe checks its answer and says so in the record.
	if q.check != nil {
		st.run(func() { q.check(rec) })
	}
	// 3. The SLO verdict: classes, stalls, one verdict per SLO in scope.
	if p.o.Judge != nil {
		st.run(func() { p.o.Judge.Apply(rec) })
	}
	// The engine's signals: its preemptions while the request ran, and
	// what coincided with the stalls the verdict counted.
	if p.o.Engine != nil {
		st.run(func() {
			var th time.Duration
			if p.o.Judge != nil {
				th = p.o.Judge.StallThreshold()
			}
			rec.PreemptionsDuring, rec.StallCause = p.o.Engine.Signals(rec, th)
		})
	}
	// Why it was slow: a cause for its slow first token and each stall,
	// from the other requests' prefill windows and the engine's signals.
	if q.why != nil {
		st.run(func() { q.why.End(rec) })
	}
	// The workload capture: the request's trace line (its prompt hashed
	// now, off the token path).
	if q.cap != nil {
		st.run(func() { q.cap.End(rec, q.key.Model) })
		q.cap = nil
	}
	// 4. Energy: held until the interval the request ended in is
	// attributed; the rest continues then, on the sampler's publisher,
	// where a stage's panic is counted (InternalError) but raised to no
	// one.
	if q.energy != nil {
		st.run(func() {
			q.energy.Hold(rec, func() {
				var later stages
				q.publish(rec, captured, &later)
				if later.first != nil {
					p.InternalError("end")
				}
			})
		})
		return
	}
	q.publish(rec, captured, &st)
}

// stages runs the end stages one by one: a stage that panics does not
// keep the record from the later ones, the sinks above all. The first
// panic is kept and raised again, as a StagePanic, once every stage has
// run (raise), for the caller to log and count (the proxy:
// tokentap_internal_errors_total{where="end"}).
type stages struct{ first any }

// StagePanic is the panic End raises when one of its stages panicked,
// after the record went through the others: the stage's panic value and
// the stack it was raised on.
type StagePanic struct {
	Value any
	Stack []byte
}

func (s *stages) run(fn func()) {
	defer func() {
		if v := recover(); v != nil && s.first == nil {
			s.first = StagePanic{Value: v, Stack: debug.Stack()}
		}
	}()
	fn()
}

func (s *stages) raise() {
	if s.first != nil {
		panic(s.first)
	}
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
func (q *Request) publish(rec *record.Record, captured []byte, st *stages) {
	p := q.p
	// 5. The spans end at the record's terminal instant, with its numbers.
	if q.spans != nil {
		st.run(func() { q.spans.End(rec, captured) })
	}
	// 6. The metric backends, through the one mapping.
	st.run(func() {
		if p.o.Prometheus != nil {
			p.o.Prometheus.Publish(rec, q.key)
		}
		if p.o.OTLP != nil {
			p.o.OTLP.Publish(rec, q.key)
		}
		if p.o.Book != nil {
			p.o.Book.Add(rec)
		}
		if p.o.Scorecard != nil {
			p.o.Scorecard.Add(rec)
		}
	})
	// 7. The record sinks, last, each on its own.
	for _, s := range p.o.Sinks {
		st.run(func() { s.Write(rec) })
	}
}
