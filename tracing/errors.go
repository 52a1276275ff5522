package tracing

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"

	"github.com/tokentap/tokentap/internal/safe"
)

// errorEvery is the least time between two log lines of one kind of
// OpenTelemetry error; the ones in between are counted and the next
// line says how many were held back.
const errorEvery = 30 * time.Second

// maxErrorKinds bounds the kinds errorLog tells apart; any further kind
// shares one rate limit.
const maxErrorKinds = 64

// errorLog is the OpenTelemetry error handler (otel.SetErrorHandler):
// every error the SDK could not return to a caller (a batch export that
// failed, a span refused) is counted, and written to the structured
// logger at error level, at most once per errorEvery per kind. The kind
// of an error is its text without its digits, so "42 spans" and "7
// spans", or two ports, are one kind.
type errorLog struct {
	log   *slog.Logger
	count prometheus.Counter
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*errorKind
}

type errorKind struct {
	last time.Time // when a line of this kind was written
	held int       // errors of this kind since, not written
}

// Handle implements otel.ErrorHandler.
func (e *errorLog) Handle(err error) {
	if err == nil {
		return
	}
	e.count.Inc()
	text := err.Error()
	key := safe.String(strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, text), 0)
	now := e.now()
	e.mu.Lock()
	k := e.kinds[key]
	if k == nil {
		if len(e.kinds) >= maxErrorKinds {
			key = ""
		}
		if k = e.kinds[key]; k == nil {
			k = &errorKind{}
			e.kinds[key] = k
		}
	}
	if !k.last.IsZero() && now.Sub(k.last) < errorEvery {
		k.held++
		e.mu.Unlock()
		return
	}
	held := k.held
	k.last, k.held = now, 0
	e.mu.Unlock()
	e.log.Error("OpenTelemetry error", "err", safe.String(text, safe.MaxLogBytes), "held_back", held)
}

// routeErrors sends OpenTelemetry's own errors and log lines, which the
// SDK otherwise prints to stderr as plain lines, to log: errors through
// errorLog (rate-limited, counted as tokentap_otel_errors_total on reg),
// the SDK's internal logger as structured lines (its warnings at debug
// level). Both are process-wide: the last sidecar set up in a process
// gets them.
func routeErrors(log *slog.Logger, reg prometheus.Registerer) {
	count := prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_otel_errors_total",
		Help: "Errors OpenTelemetry's SDK reported (a failed export, a refused span), logged at most once per 30 s per kind."})
	if reg != nil {
		reg.MustRegister(count)
	}
	otel.SetErrorHandler(&errorLog{log: log, count: count, now: time.Now, kinds: map[string]*errorKind{}})
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
}
