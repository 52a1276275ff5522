// Package exporter turns finished records and per-event observations into
// Prometheus metrics on a private registry. Every instrument is declared in
// this file; docs/metrics.md gives each one's exact definition.
package exporter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tokentap/tokentap/record"
)

// Label names. gen_ai_* labels are the OTel GenAI attribute names as the
// OTel Prometheus exporter would translate them, so the same PromQL works
// on series from either path.
const (
	LabelOperation = "gen_ai_operation_name"
	LabelModel     = "gen_ai_request_model"
	LabelTraffic   = "traffic"
	LabelOutcome   = "outcome"
	LabelErrorType = "error_type"
	LabelReason    = "reason"
	LabelModality  = "gen_ai_token_modality"
	LabelProbe     = "probe"
)

// Bucket boundaries (seconds). Each is a superset of the OTel GenAI
// advisory boundaries for the matching metric, refined to single
// milliseconds at the low end so that SLO thresholds such as 5 ms ITL or
// 200 ms TTFT fall on a bucket edge.
var (
	TTFTBuckets = []float64{
		0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,
		0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.08,
		0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.25, 1.5, 2,
		2.5, 3, 4, 5, 7.5, 10, 15, 20, 30, 45, 60, 120,
	}
	ITLBuckets = []float64{
		0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009,
		0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06,
		0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10,
	}
	E2EBuckets = []float64{
		0.005, 0.01, 0.02, 0.025, 0.04, 0.05, 0.08, 0.1, 0.16, 0.25, 0.32, 0.5,
		0.64, 1, 1.28, 2, 2.56, 5, 5.12, 10, 10.24, 20, 20.48, 30, 40.96, 60,
		81.92, 120, 300, 600,
	}
	ForwardBuckets = []float64{
		1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3,
		0.01, 0.05, 0.1, 1,
	}
)

// Config sets the bounds of the exported label space.
//
// The zero value allows 20 model names and no pre-declared ones.
type Config struct {
	// MaxModels is how many distinct model names get their own label
	// value; later ones are exported as "_other". Zero means 20.
	MaxModels int
	// Models are model names that always get their own label value and
	// do not count against MaxModels.
	Models []string
}

// Metrics is the set of Prometheus instruments. Create it with New.
type Metrics struct {
	Registry *prometheus.Registry
	models   *ModelLabels

	ttft, ttfot, ttfb, tpot, itl *prometheus.HistogramVec
	duration                     *prometheus.HistogramVec
	forward                      prometheus.Histogram
	inTokens, outTokens          *prometheus.CounterVec
	requests                     *prometheus.CounterVec
	inFlight                     *prometheus.GaugeVec
	tapFailures                  *prometheus.CounterVec
	usageInjected                prometheus.Counter
	malformed                    *prometheus.CounterVec
	upstreamUp                   prometheus.Gauge
	stalls, maxGap               *prometheus.HistogramVec
	ttftClass, tpotClass         *prometheus.HistogramVec
}

// Buckets of the smoothness and class histograms.
var (
	StallBuckets     = []float64{0, 1, 2, 3, 5, 10, 20, 50}
	GapBuckets       = []float64{0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30}
	ClassTTFTBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60}
	ClassTPOTBuckets = []float64{0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1}
)

// Class labels.
const (
	LabelPromptClass = "prompt_class"
	LabelOutputClass = "output_class"
)

func histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    name,
		Help:    help,
		Buckets: buckets,
		// Native (sparse) buckets too, for scrapers that negotiate them:
		// factor 1.1 is schema 3, about 4% relative resolution.
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}, labels)
}

// New registers every instrument on a fresh registry, together with the
// Go runtime and process collectors.
func New(cfg Config) *Metrics {
	base := []string{LabelOperation, LabelModel, LabelTraffic, LabelProbe}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		models:   NewModelLabels(cfg.MaxModels, cfg.Models),
		ttft: histogram("gen_ai_server_time_to_first_token_seconds",
			"Time from request arrival at the sidecar to the first event carrying generated output (content, reasoning or tool-call arguments). One observation per streamed request that produced a token.",
			TTFTBuckets, base...),
		ttfot: histogram("tokentap_time_to_first_output_token_seconds",
			"Time from request arrival to the first event carrying user-visible content or tool-call arguments (reasoning excluded).",
			TTFTBuckets, base...),
		ttfb: histogram("tokentap_time_to_first_byte_seconds",
			"Time from request arrival to the first response body byte read from the upstream.",
			TTFTBuckets, base...),
		tpot: histogram("gen_ai_server_time_per_output_token_seconds",
			"Request-weighted time per output token: (last token event - first token event) / (output tokens - 1), one observation per request with at least 2 output tokens.",
			ITLBuckets, base...),
		itl: histogram("tokentap_inter_token_latency_seconds",
			"Token-weighted inter-token gap: one observation per gap between consecutive token-bearing events (an event carrying k tokens is still one gap).",
			ITLBuckets, base...),
		duration: histogram("gen_ai_server_request_duration_seconds",
			"End-to-end latency: request arrival to the terminal outcome (end marker, EOF, error, cancel or timeout), for every request.",
			E2EBuckets, append(base, LabelErrorType)...),
		forward: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:                            "tokentap_forward_delay_seconds",
			Help:                            "The sidecar's own overhead: time from reading a chunk of response bytes from the upstream to having written and flushed it to the client. One observation per chunk that completed at least one event.",
			Buckets:                         ForwardBuckets,
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		}),
		inTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gen_ai_client_inference_usage_input_tokens_total",
			Help: "Input (prompt) tokens reported by the engine's usage numbers, summed over finished requests.",
		}, append(base, LabelModality)),
		outTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gen_ai_client_inference_usage_output_tokens_total",
			Help: "Output tokens of finished requests, from the best source available (see tokentap_output_token_source in docs).",
		}, append(base, LabelModality)),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokentap_requests_total",
			Help: "Finished requests by outcome (success, error, rejected, cancelled, timeout). gen_ai_operation_name=\"other\" counts routes passed through untouched.",
		}, append(base, LabelOutcome)),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tokentap_requests_in_flight",
			Help: "Requests that arrived and have not reached their terminal outcome.",
		}, []string{LabelOperation, LabelTraffic, LabelProbe}),
		tapFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokentap_tap_failures_total",
			Help: "Times the stream tap gave up measuring a response and fell back to plain forwarding (fail open), by reason.",
		}, []string{LabelReason}),
		usageInjected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tokentap_usage_injected_total",
			Help: "Streaming requests for which the sidecar asked the engine for usage (stream_options.include_usage) and removed the extra usage event from the client's stream.",
		}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tokentap_malformed_events_total",
			Help: "Protocol events that could not be parsed; they were forwarded unchanged.",
		}, []string{LabelOperation}),
		stalls: histogram("tokentap_stalls_per_request",
			"Per-request count of gaps between token events above the stall threshold; streamed requests with tokens.",
			StallBuckets, base...),
		maxGap: histogram("tokentap_max_inter_token_gap_seconds",
			"Per-request largest gap between consecutive token events (request-weighted); streamed requests with at least 2 token events.",
			GapBuckets, base...),
		ttftClass: histogram("tokentap_time_to_first_token_by_class_seconds",
			"TTFT by request class (prompt and output length classes, see docs/slo.md): prefill cost per class.",
			ClassTTFTBuckets, LabelModel, LabelTraffic, LabelProbe, LabelPromptClass, LabelOutputClass),
		tpotClass: histogram("tokentap_time_per_output_token_by_class_seconds",
			"TPOT by request class.",
			ClassTPOTBuckets, LabelModel, LabelTraffic, LabelProbe, LabelPromptClass, LabelOutputClass),
		upstreamUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tokentap_upstream_up",
			Help: "1 if the last readiness check of the upstream succeeded, else 0.",
		}),
	}
	m.Registry.MustRegister(m.ttft, m.ttfot, m.ttfb, m.tpot, m.itl, m.duration, m.forward,
		m.inTokens, m.outTokens, m.requests, m.inFlight, m.tapFailures, m.usageInjected,
		m.malformed, m.upstreamUp, m.stalls, m.maxGap, m.ttftClass, m.tpotClass,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"panic", "event_too_large"} {
		m.tapFailures.WithLabelValues(r)
	}
	return m
}

// ModelLabel returns the bounded label value of a model name.
func (m *Metrics) ModelLabel(model string) string { return m.models.Label(model) }

// SetUpstreamUp records the result of a readiness check.
func (m *Metrics) SetUpstreamUp(up bool) {
	if up {
		m.upstreamUp.Set(1)
	} else {
		m.upstreamUp.Set(0)
	}
}

// TapFailed counts a fail-open fallback.
func (m *Metrics) TapFailed(reason string) { m.tapFailures.WithLabelValues(reason).Inc() }

// Request holds the observers of one request, resolved once at its start
// so that per-event observations take no lock and allocate nothing.
type Request struct {
	m                         *Metrics
	op, model, traffic, probe string
	itl                       prometheus.Observer
}

// Begin starts observing a request; call End exactly once. It implements
// record.Observer.
func (m *Metrics) Begin(k record.Key) record.Observation {
	op := k.API.Operation()
	q := &Request{m: m, op: op, model: m.models.Label(k.Model), traffic: k.Traffic, probe: k.Probe}
	m.inFlight.WithLabelValues(op, k.Traffic, k.Probe).Inc()
	return q
}

// Gap observes one inter-token gap. The series is resolved at the first
// gap, so non-streaming requests create no empty ITL series.
func (q *Request) Gap(d time.Duration) {
	if q.itl == nil {
		q.itl = q.m.itl.WithLabelValues(q.op, q.model, q.traffic, q.probe)
	}
	q.itl.Observe(d.Seconds())
}

// ForwardDelay observes the sidecar's forwarding delay of one chunk.
func (q *Request) ForwardDelay(d time.Duration) { q.m.forward.Observe(d.Seconds()) }

// Malformed counts an unparseable event.
func (q *Request) Malformed() { q.m.malformed.WithLabelValues(q.op).Inc() }

// UsageInjected counts a request whose usage the sidecar asked for.
func (q *Request) UsageInjected() { q.m.usageInjected.Inc() }

// TapFailed counts a fail-open fallback.
func (q *Request) TapFailed(reason string) { q.m.TapFailed(reason) }

// End observes the finished record.
func (q *Request) End(r *record.Record) {
	m := q.m
	m.inFlight.WithLabelValues(q.op, q.traffic, q.probe).Dec()
	l := []string{q.op, q.model, q.traffic, q.probe}
	m.requests.WithLabelValues(q.op, q.model, q.traffic, q.probe, string(r.Outcome)).Inc()
	observe := func(o prometheus.Observer, v float64) {
		if r.TraceID == "" {
			o.Observe(v)
			return
		}
		// The trace behind this observation, for a jump from a bucket to a
		// trace (exposed in OpenMetrics when the scraper negotiates it).
		o.(prometheus.ExemplarObserver).ObserveWithExemplar(v, prometheus.Labels{"trace_id": r.TraceID, "span_id": r.SpanID})
	}
	if d, ok := r.E2E(); ok {
		observe(m.duration.WithLabelValues(q.op, q.model, q.traffic, q.probe, r.ErrorType), d.Seconds())
	}
	if d, ok := r.TTFB(); ok {
		m.ttfb.WithLabelValues(l...).Observe(d.Seconds())
	}
	if r.Stream {
		if d, ok := r.TTFT(); ok {
			observe(m.ttft.WithLabelValues(l...), d.Seconds())
		}
		if d, ok := r.TTFOT(); ok {
			observe(m.ttfot.WithLabelValues(l...), d.Seconds())
		}
		if d, ok := r.TPOT(); ok {
			observe(m.tpot.WithLabelValues(l...), d.Seconds())
		}
		// Smoothness and classes are set by the SLO judge, when one runs.
		if r.PromptClass != "" && r.TokenEvents() > 0 {
			m.stalls.WithLabelValues(l...).Observe(float64(r.Stalls))
			if r.TokenEvents() >= 2 {
				m.maxGap.WithLabelValues(l...).Observe(r.MaxGap.Seconds())
			}
			if d, ok := r.TTFT(); ok {
				m.ttftClass.WithLabelValues(q.model, q.traffic, q.probe, r.PromptClass, r.OutputClass).Observe(d.Seconds())
			}
			if d, ok := r.TPOT(); ok {
				m.tpotClass.WithLabelValues(q.model, q.traffic, q.probe, r.PromptClass, r.OutputClass).Observe(d.Seconds())
			}
		}
	}
	if r.InputTokens > 0 {
		m.inTokens.WithLabelValues(q.op, q.model, q.traffic, q.probe, "text").Add(float64(r.InputTokens))
	}
	if r.OutputTokens > 0 {
		m.outTokens.WithLabelValues(q.op, q.model, q.traffic, q.probe, "text").Add(float64(r.OutputTokens))
	}
}
