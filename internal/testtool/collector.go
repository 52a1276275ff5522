package testtool

import "fmt"

// MetricsCollector describes a run of Jaeger's OpenTelemetry collector
// (the jaeger binary, v1.76) as a real OTLP metrics receiver: OTLP/HTTP
// in on OTLPHTTP, and what it received out as a Prometheus exposition on
// Prometheus (/metrics), names and labels translated from OTel's as the
// collector's Prometheus exporter does (units as suffixes, dots as
// underscores).
type MetricsCollector struct {
	OTLPHTTP, Prometheus string
}

// Config returns the YAML configuration to run it with (jaeger --config).
func (c MetricsCollector) Config() string {
	return fmt.Sprintf(`service:
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [prometheus]
  telemetry:
    metrics:
      level: none
receivers:
  otlp:
    protocols:
      http: {endpoint: "%s"}
exporters:
  prometheus: {endpoint: "%s"}
`, c.OTLPHTTP, c.Prometheus)
}
