package tracing

import (
	"context"
	"encoding/binary"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// KeepProcessor exports a span only if its request failed (status error),
// missed an SLO (tokentap.slo.qualified=false), or its trace falls in the
// kept ratio; the ratio is decided from the trace id, so both spans of a
// request share the decision. Decisions are counted.
type KeepProcessor struct {
	next      sdktrace.SpanProcessor
	threshold uint64
	decisions *prometheus.CounterVec
}

// NewKeepProcessor wraps next. reg nil registers nothing.
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

// Shutdown passes on.
func (k *KeepProcessor) Shutdown(ctx context.Context) error { return k.next.Shutdown(ctx) }

// ForceFlush passes on.
func (k *KeepProcessor) ForceFlush(ctx context.Context) error { return k.next.ForceFlush(ctx) }
