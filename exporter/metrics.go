// Package exporter turns requests into metrics. Map (mapping.go) is the
// one mapping of a finished record to its observations; this file is its
// Prometheus backend on a private registry, with the live per-event
// instruments; otlp.go is its OTLP backend. docs/metrics.md gives each
// instrument's exact definition.
package exporter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tokentap/tokentap/cause"
	"github.com/tokentap/tokentap/record"
)

// Config sets the bounds of the exported label space and the series to
// pre-create.
//
// The zero value allows 20 model names, declares none, pre-creates no
// SLO series (by load or by tenant neither) and names the provider
// DefaultProviderName.
type Config struct {
	// MaxModels is how many distinct model names get their own label
	// value; later ones are exported as "_other". Zero means 20.
	MaxModels int
	// Models are model names that always get their own label value and
	// do not count against MaxModels.
	Models []string
	// SLOs are the declared SLO names: their counters exist from the
	// start, so rules see 0 rather than no data.
	SLOs []string
	// Tenants are the declared tenants (tenants on): their per-tenant
	// SLO counters exist from the start too.
	Tenants []string
	// LoadBuckets are the load buckets' label values (slo.LoadBuckets,
	// "+Inf" included): each SLO's by-load counters exist from the start
	// for each, so that a bucket's first request is a rise from 0 that
	// rate() sees rather than a new series whose first sample it cannot.
	// Nil pre-creates none.
	LoadBuckets []string
	// ProviderName is gen_ai.provider.name on the GenAI client metrics
	// (client.go), as on the spans (config.Tracing.ProviderName); empty
	// means DefaultProviderName.
	ProviderName string
}

// Metrics is the Prometheus backend. Create it with New.
type Metrics struct {
	Registry *prometheus.Registry
	models   *ModelLabels
	provider string // gen_ai.provider.name

	vecs [numInstruments]prometheus.Collector // *HistogramVec or *CounterVec, per spec

	// live instruments, observed while a request runs
	itl           *prometheus.HistogramVec
	forward       prometheus.Histogram
	inFlight      *prometheus.GaugeVec
	tapFailures   *prometheus.CounterVec
	internal      *prometheus.CounterVec
	usageInjected prometheus.Counter
	malformed     *prometheus.CounterVec
	upstreamUp    prometheus.Gauge

	// slowSeen holds the model and traffic labels whose slow-cause
	// series exist (slowSeries): as bounded as those labels.
	slowSeen sync.Map
}

// slowSeries creates every (what, cause) series of tokentap_slow_total
// for a model and traffic label the first time they publish, so that a
// model's first slow event of a cause is a rise from 0 that rate()
// sees.
func (m *Metrics) slowSeries(model, traffic string) {
	key := [2]string{model, traffic}
	if _, ok := m.slowSeen.Load(key); ok {
		return
	}
	if _, loaded := m.slowSeen.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	vec := m.vecs[Slow].(*prometheus.CounterVec)
	for _, p := range cause.Pairs {
		vec.WithLabelValues(model, traffic, p.What, p.Cause)
	}
}

func histogramOpts(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name:    name,
		Help:    help,
		Buckets: buckets,
		// Native (sparse) buckets too, for scrapers that negotiate them:
		// factor 1.1 is schema 3, about 4% relative resolution.
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

func promLabels(ls []Label) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = promLabel[l]
	}
	return out
}

// New registers every instrument on a fresh registry, together with the
// Go runtime and process collectors.
func New(cfg Config) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), models: NewModelLabels(cfg.MaxModels, cfg.Models), provider: providerName(cfg.ProviderName)}
	for i, s := range specs {
		if s.Counter {
			m.vecs[i] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: s.Prom, Help: s.Help}, promLabels(s.Labels))
		} else {
			m.vecs[i] = prometheus.NewHistogramVec(histogramOpts(s.Prom, s.Help, s.Buckets), promLabels(s.Labels))
		}
		m.Registry.MustRegister(m.vecs[i])
	}
	m.itl = m.vecs[ITL].(*prometheus.HistogramVec)
	m.forward = prometheus.NewHistogram(histogramOpts("tokentap_forward_delay_seconds",
		"The sidecar's own overhead: time from reading a chunk of response bytes from the upstream to having written and flushed it to the client. One observation per chunk that completed at least one event.",
		forwardBuckets))
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tokentap_requests_in_flight",
		Help: "Requests that arrived and have not reached their terminal outcome.",
	}, []string{promLabel[LOperation], promLabel[LTraffic], promLabel[LProbe]})
	m.tapFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokentap_tap_failures_total",
		Help: "Times the stream tap gave up measuring a response and fell back to plain forwarding (fail open), by reason; event_too_large counts each event over the tap's bound, forwarded unread, the rest of the response measured; strip_overflow each event strip mode forwarded unstripped for its size, stripping going on.",
	}, []string{"reason"})
	m.internal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokentap_internal_errors_total",
		Help: "Panics the sidecar recovered from while serving a request, by where: request (preparing, forwarding or answering it: the client got a 502, or its connection was cut when a status was already written, and its record says error_type internal) or end (settling its record or running its end stages).",
	}, []string{"where"})
	m.usageInjected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tokentap_usage_injected_total",
		Help: "Streaming requests for which the sidecar asked the engine for usage (stream_options.include_usage) and removed the extra usage event from the client's stream.",
	})
	m.malformed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tokentap_malformed_events_total",
		Help: "Protocol events that could not be parsed; they were forwarded unchanged.",
	}, []string{promLabel[LOperation]})
	m.upstreamUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tokentap_upstream_up",
		Help: "1 if the last readiness check of the upstream succeeded, else 0.",
	})
	m.Registry.MustRegister(m.forward, m.inFlight, m.tapFailures, m.internal, m.usageInjected, m.malformed, m.upstreamUp,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"panic", "event_too_large", "content_encoding", "strip_overflow", "single_lf_framing"} {
		m.tapFailures.WithLabelValues(r)
	}
	for _, w := range []string{"request", "end"} { // proxy.InternalRequest, proxy.InternalEnd
		m.internal.WithLabelValues(w)
	}
	for _, s := range cfg.SLOs {
		for _, i := range []Instrument{SLOOffered, SLOQualified, SLOQualifiedTokens} {
			m.vecs[i].(*prometheus.CounterVec).WithLabelValues(s)
		}
		for _, t := range cfg.Tenants {
			for _, i := range []Instrument{SLOOfferedByTenant, SLOQualifiedByTenant, SLOQualifiedTokensByTenant} {
				m.vecs[i].(*prometheus.CounterVec).WithLabelValues(s, t)
			}
		}
		for _, b := range cfg.LoadBuckets {
			for _, i := range []Instrument{SLOOfferedByLoad, SLOQualifiedByLoad, SLOQualifiedTokensByLoad} {
				m.vecs[i].(*prometheus.CounterVec).WithLabelValues(s, b)
			}
		}
	}
	for _, model := range cfg.Models {
		m.slowSeries(m.models.Label(model), "live")
	}
	return m
}

// InternalError counts a panic recovered while serving a request
// (pipeline.Pipeline.InternalError).
func (m *Metrics) InternalError(where string) { m.internal.WithLabelValues(where).Inc() }

// SetUpstreamUp records the result of a readiness check.
func (m *Metrics) SetUpstreamUp(up bool) {
	if up {
		m.upstreamUp.Set(1)
	} else {
		m.upstreamUp.Set(0)
	}
}

// Request holds the live instruments of one request, resolved once at
// its start so that per-event observations take no lock shared across
// requests and allocate nothing.
//
// Its ITL and forward-delay observations are held in the request's own
// arrays and added to the shared histograms flushEvery at a time, and
// the rest at Done: the histograms are shared by every stream (the
// forward delay's by all of them), and an observation per event moved
// their cache lines between the cores serving the streams on every event
// (docs/performance.md, "Issue 36"). Nothing is lost: Done, called once
// at every request's end, adds what is held. A scrape sees at most
// flushEvery-1 observations of each request in flight late.
type Request struct {
	m        *Metrics
	op       string
	model    string // as the request named it
	inFlight prometheus.Gauge
	itl      prometheus.Observer
	labels   Labels
	gaps     held // ITL observations not yet in itl
	fwds     held // forward delays not yet in m.forward
}

// flushEvery is how many observations of one live histogram a request
// holds before it adds them to the shared one.
const flushEvery = 16

// held is a request's observations of one histogram, in seconds, not yet
// added to it.
type held struct {
	v [flushEvery]float64
	n int
}

// add holds v and reports whether the array is full (flush it).
func (h *held) add(v float64) bool {
	h.v[h.n] = v
	h.n++
	return h.n == flushEvery
}

// flush adds what is held to o.
func (h *held) flush(o prometheus.Observer) {
	for _, v := range h.v[:h.n] {
		o.Observe(v)
	}
	h.n = 0
}

// Begin starts observing a request live; it implements record.Observer.
func (m *Metrics) Begin(k record.Key) record.Observation {
	q := &Request{m: m, op: k.API.Operation(), model: k.Model, labels: BaseLabels(k)}
	q.inFlight = m.inFlight.WithLabelValues(q.op, k.Traffic, k.Probe)
	q.inFlight.Inc()
	return q
}

// Gap observes one inter-token gap (held: see Request).
func (q *Request) Gap(d time.Duration) {
	if q.gaps.add(d.Seconds()) {
		q.flushGaps()
	}
}

// flushGaps adds the held gaps to the ITL series. The series is resolved
// at the first flush, so non-streaming requests create no empty ITL
// series; by then the engine has served the model, so its name may take
// a label slot.
func (q *Request) flushGaps() {
	if q.gaps.n == 0 {
		return
	}
	if q.itl == nil {
		q.itl = q.m.itl.WithLabelValues(q.labels[LOperation], q.m.models.Admit(q.model), q.labels[LTraffic], q.labels[LProbe])
	}
	q.gaps.flush(q.itl)
}

// ResponseModel names the model of a request that named none, before
// its first flush of gaps resolves the ITL series
// (pipeline.Request.ResponseModel).
func (q *Request) ResponseModel(name string) {
	if q.model == "" {
		q.model = name
	}
}

// ForwardDelay observes the sidecar's forwarding delay of one chunk
// (held: see Request).
func (q *Request) ForwardDelay(d time.Duration) {
	if q.fwds.add(d.Seconds()) {
		q.fwds.flush(q.m.forward)
	}
}

// Malformed counts an unparseable event.
func (q *Request) Malformed() { q.m.malformed.WithLabelValues(q.op).Inc() }

// UsageInjected counts a request whose usage the sidecar asked for.
func (q *Request) UsageInjected() { q.m.usageInjected.Inc() }

// TapFailed counts a fail-open fallback.
func (q *Request) TapFailed(reason string) { q.m.tapFailures.WithLabelValues(reason).Inc() }

// Done adds the observations still held to the shared histograms and
// ends the request's in-flight count.
func (q *Request) Done() {
	q.flushGaps()
	q.fwds.flush(q.m.forward)
	q.inFlight.Dec()
}

// Publish observes a finished record through the one mapping, under its
// key k (k.Model: the bounded model label); the ITL gaps were observed
// live.
func (m *Metrics) Publish(r *record.Record, k record.Key) {
	var (
		buf      [numLabels]string // label values, on the stack
		exemplar prometheus.Labels // one map for every exemplar of the request (each observation copies it)
	)
	l := BaseLabels(k)
	l[LProvider] = m.provider
	if r.Stream {
		m.slowSeries(l[LModel], l[LTraffic])
	}
	Map(r, l, false, func(i Instrument, v float64, l *Labels) {
		s := &specs[i]
		values := buf[:len(s.Labels)]
		for k, lab := range s.Labels {
			values[k] = l[lab]
		}
		switch vec := m.vecs[i].(type) {
		case *prometheus.CounterVec:
			vec.WithLabelValues(values...).Add(v)
		case *prometheus.HistogramVec:
			o := vec.WithLabelValues(values...)
			if s.Exemplar && r.TraceID != "" {
				// The trace behind this observation, for a jump from a
				// bucket to a trace (exposed in OpenMetrics when the
				// scraper negotiates it).
				if exemplar == nil {
					exemplar = prometheus.Labels{"trace_id": r.TraceID, "span_id": r.SpanID}
				}
				o.(prometheus.ExemplarObserver).ObserveWithExemplar(v, exemplar)
				return
			}
			o.Observe(v)
		}
	})
}
