package exporter

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokentap/tokentap/record"
)

// TracingConfig is the tracing section of the configuration. The OTel
// SDK itself is configured through the standard OTEL_* environment
// (endpoint, protocol, headers, service name, resource attributes,
// sampler, exporters), as with any OTel SDK.
type TracingConfig struct {
	// ProviderName is gen_ai.provider.name; empty means
	// "openai_compatible" (docs/tracing.md explains the trade-off).
	ProviderName string `yaml:"provider_name"`
	// Keep is "all" (default: the head sampler of OTEL_TRACES_SAMPLER
	// decides) or "slow_or_failed": every request that missed an SLO or
	// failed is exported, and KeepRatio of the rest, decided when the
	// request ends.
	Keep      string  `yaml:"keep"`
	KeepRatio float64 `yaml:"keep_ratio"`
	// CaptureContent records prompts and completions on the spans
	// (opt-in, pre-production), redacted and truncated.
	CaptureContent  bool     `yaml:"capture_content"`
	MaxContentBytes int      `yaml:"max_content_bytes"`
	Redact          []string `yaml:"redact"` // extra regular expressions
}

// Validate returns one error per problem.
func (c TracingConfig) Validate() []error {
	var errs []error
	switch c.Keep {
	case "", "all", "slow_or_failed":
	default:
		errs = append(errs, fmt.Errorf("tracing.keep: must be all or slow_or_failed, got %q", c.Keep))
	}
	if c.KeepRatio < 0 || c.KeepRatio > 1 {
		errs = append(errs, fmt.Errorf("tracing.keep_ratio: must be in [0,1], got %v", c.KeepRatio))
	}
	for _, r := range c.Redact {
		if _, err := regexp.Compile(r); err != nil {
			errs = append(errs, fmt.Errorf("tracing.redact: %v", err))
		}
	}
	if c.MaxContentBytes < 0 {
		errs = append(errs, fmt.Errorf("tracing.max_content_bytes: must not be negative"))
	}
	return errs
}

// OTel holds the SDK providers; a nil *OTel means OTel export is off.
type OTel struct {
	Traces   *sdktrace.TracerProvider // nil: no traces
	Metrics  *sdkmetric.MeterProvider // nil: no OTLP metrics
	shutdown []func(context.Context) error
}

// Shutdown flushes and stops every provider.
func (o *OTel) Shutdown(ctx context.Context) error {
	if o == nil {
		return nil
	}
	var errs []error
	for _, f := range o.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// wanted reports whether the environment asks for an OTel signal: its
// OTEL_<SIGNAL>_EXPORTER names an exporter other than none, or an OTLP
// endpoint is set. Design note: the SDK's own default exporter is OTLP to
// localhost; a sidecar started without any OTel setting exports nothing
// rather than logging connection errors forever.
func wanted(getenv func(string) string, signal string) bool {
	if e := getenv("OTEL_" + signal + "_EXPORTER"); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// SetupOTel builds the trace and metric providers the environment asks
// for. reg receives the keep-mode counters.
func SetupOTel(ctx context.Context, cfg TracingConfig, getenv func(string) string, reg prometheus.Registerer) (*OTel, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	o := &OTel{}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", serviceName(getenv))))
	if err != nil {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	if wanted(getenv, "TRACES") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("otel traces exporter: %w", err)
		}
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		batch := sdktrace.NewBatchSpanProcessor(exp)
		if cfg.Keep == "slow_or_failed" {
			// The decision is made at the end, so every span must be
			// recorded first: the head sampler is always on.
			opts = append(opts, sdktrace.WithSampler(sdktrace.AlwaysSample()),
				sdktrace.WithSpanProcessor(NewKeepProcessor(batch, cfg.KeepRatio, reg)))
		} else {
			opts = append(opts, sdktrace.WithSpanProcessor(batch))
		}
		o.Traces = sdktrace.NewTracerProvider(opts...)
		o.shutdown = append(o.shutdown, o.Traces.Shutdown)
	}
	if wanted(getenv, "METRICS") {
		rd, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, fmt.Errorf("otel metrics exporter: %w", err)
		}
		o.Metrics = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(rd))
		o.shutdown = append(o.shutdown, o.Metrics.Shutdown)
	}
	return o, nil
}

func serviceName(getenv func(string) string) string {
	if s := getenv("OTEL_SERVICE_NAME"); s != "" {
		return s
	}
	return "tokentap"
}

// KeepProcessor exports a span only if its request failed (status error),
// missed an SLO (tokentap.slo.qualified=false), or its trace falls in the
// kept ratio; the ratio is decided from the trace id, so both spans of a
// request share the decision. Decisions are counted.
type KeepProcessor struct {
	next      sdktrace.SpanProcessor
	threshold uint64
	decisions *prometheus.CounterVec
}

// NewKeepProcessor wraps next.
func NewKeepProcessor(next sdktrace.SpanProcessor, ratio float64, reg prometheus.Registerer) *KeepProcessor {
	k := &KeepProcessor{next: next, threshold: uint64(ratio * (1 << 63) * 2)}
	if ratio >= 1 {
		k.threshold = ^uint64(0)
	}
	k.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_trace_spans_total",
		Help: "Spans decided by the keep-the-slow-ones mode: decision kept or dropped, reason error, slo_miss, sampled or rest."}, []string{"decision", "reason"})
	if reg != nil {
		reg.MustRegister(k.decisions)
	}
	return k
}

// OnStart passes the span on.
func (k *KeepProcessor) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {
	k.next.OnStart(ctx, s)
}

// OnEnd decides.
func (k *KeepProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	reason := ""
	switch {
	case s.Status().Code == codes.Error:
		reason = "error"
	case missed(s.Attributes()):
		reason = "slo_miss"
	case k.sampled(s.SpanContext().TraceID()):
		reason = "sampled"
	}
	if reason == "" {
		k.decisions.WithLabelValues("dropped", "rest").Inc()
		return
	}
	k.decisions.WithLabelValues("kept", reason).Inc()
	k.next.OnEnd(s)
}

func (k *KeepProcessor) sampled(id trace.TraceID) bool {
	return k.threshold > 0 && binary.BigEndian.Uint64(id[8:]) < k.threshold
}

func missed(attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if a.Key == "tokentap.slo.qualified" && !a.Value.AsBool() {
			return true
		}
	}
	return false
}

// Shutdown and ForceFlush pass on.
func (k *KeepProcessor) Shutdown(ctx context.Context) error   { return k.next.Shutdown(ctx) }
func (k *KeepProcessor) ForceFlush(ctx context.Context) error { return k.next.ForceFlush(ctx) }

// OTelMetrics records the same request metrics as /metrics on an OTel
// meter, under the GenAI semantic-convention names and units with
// explicit bucket boundaries, for OTLP export. It observes at the end of
// each request (gaps included), so the hot path is untouched.
type OTelMetrics struct {
	ttft, tpot, duration, itl metric.Float64Histogram
	inTok, outTok, requests   metric.Int64Counter
}

// NewOTelMetrics creates the instruments on mp.
func NewOTelMetrics(mp metric.MeterProvider) (*OTelMetrics, error) {
	m := mp.Meter("github.com/tokentap/tokentap/exporter")
	var errs [7]error
	o := &OTelMetrics{}
	o.ttft, errs[0] = m.Float64Histogram("gen_ai.server.time_to_first_token", metric.WithUnit("s"),
		metric.WithDescription("Time to first token, from arrival at the sidecar."), metric.WithExplicitBucketBoundaries(TTFTBuckets...))
	o.tpot, errs[1] = m.Float64Histogram("gen_ai.server.time_per_output_token", metric.WithUnit("s"),
		metric.WithDescription("Request-weighted time per output token."), metric.WithExplicitBucketBoundaries(ITLBuckets...))
	o.duration, errs[2] = m.Float64Histogram("gen_ai.server.request.duration", metric.WithUnit("s"),
		metric.WithDescription("End-to-end latency to the terminal outcome."), metric.WithExplicitBucketBoundaries(E2EBuckets...))
	o.itl, errs[3] = m.Float64Histogram("tokentap.inter_token_latency", metric.WithUnit("s"),
		metric.WithDescription("Token-weighted gaps between token-bearing events."), metric.WithExplicitBucketBoundaries(ITLBuckets...))
	o.inTok, errs[4] = m.Int64Counter("gen_ai.client.inference.usage.input_tokens", metric.WithUnit("{token}"))
	o.outTok, errs[5] = m.Int64Counter("gen_ai.client.inference.usage.output_tokens", metric.WithUnit("{token}"))
	o.requests, errs[6] = m.Int64Counter("tokentap.requests", metric.WithUnit("{request}"), metric.WithDescription("Finished requests by outcome."))
	return o, errors.Join(errs[:]...)
}

// Begin implements record.Observer.
func (o *OTelMetrics) Begin(k record.Key) record.Observation { return &otelObs{o: o, k: k} }

type otelObs struct {
	o *OTelMetrics
	k record.Key
}

func (q *otelObs) Gap(time.Duration)          {}
func (q *otelObs) ForwardDelay(time.Duration) {}
func (q *otelObs) Malformed()                 {}
func (q *otelObs) UsageInjected()             {}
func (q *otelObs) TapFailed(string)           {}

func (q *otelObs) End(r *record.Record) {
	ctx := context.Background()
	base := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", q.k.API.Operation()),
		attribute.String("gen_ai.request.model", q.k.Model),
		attribute.String("tokentap.traffic", q.k.Traffic),
	}
	if q.k.Probe != "" {
		base = append(base, attribute.String("tokentap.probe", q.k.Probe))
	}
	set := metric.WithAttributes(base...)
	o := q.o
	if d, ok := r.E2E(); ok {
		attrs := base
		if r.ErrorType != "" {
			attrs = append(append([]attribute.KeyValue{}, base...), attribute.String("error.type", r.ErrorType))
		}
		o.duration.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
	}
	if r.Stream {
		if d, ok := r.TTFT(); ok {
			o.ttft.Record(ctx, d.Seconds(), set)
		}
		if d, ok := r.TPOT(); ok {
			o.tpot.Record(ctx, d.Seconds(), set)
		}
		r.Gaps(func(g time.Duration) { o.itl.Record(ctx, g.Seconds(), set) })
	}
	tok := metric.WithAttributes(append(append([]attribute.KeyValue{}, base...), attribute.String("gen_ai.token.modality", "text"))...)
	if r.InputTokens > 0 {
		o.inTok.Add(ctx, r.InputTokens, tok)
	}
	if r.OutputTokens > 0 {
		o.outTok.Add(ctx, r.OutputTokens, tok)
	}
	o.requests.Add(ctx, 1, metric.WithAttributes(append(append([]attribute.KeyValue{}, base...), attribute.String("tokentap.outcome", string(r.Outcome)))...))
}
