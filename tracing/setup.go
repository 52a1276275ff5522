// Package tracing is everything OpenTelemetry tracing in one place: the
// SDK setup from the OTEL_* environment (traces and OTLP metrics
// providers), the keep-the-slow-ones span processor, and the mapping of a
// request and its finished record to the two spans the sidecar emits
// (docs/tracing.md).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tokentap/tokentap/config"
)

// Providers holds the SDK providers the environment asked for. A nil
// field means that signal is off; a nil *Providers means both are.
type Providers struct {
	Traces   *sdktrace.TracerProvider // nil: no traces
	Metrics  *sdkmetric.MeterProvider // nil: no OTLP metrics
	shutdown []func(context.Context) error
}

// Shutdown flushes and stops every provider.
func (o *Providers) Shutdown(ctx context.Context) error {
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

// Setup builds the trace and metric providers the environment asks for.
// reg receives the keep-mode counters and tokentap_otel_errors_total.
// getenv nil means os.Getenv. log receives OpenTelemetry's own errors
// and log lines (routeErrors; process-wide); nil leaves them to the SDK,
// which prints them to stderr.
func Setup(ctx context.Context, cfg config.Tracing, getenv func(string) string, reg prometheus.Registerer, log *slog.Logger) (*Providers, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if log != nil {
		routeErrors(log, reg)
	}
	o := &Providers{}
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
