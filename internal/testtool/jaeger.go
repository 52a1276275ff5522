package testtool

import (
	"fmt"
	"time"
)

// Jaeger describes a Jaeger v2 (v1.76) run with memory storage: its OTLP
// receiver (HTTP and gRPC) and its query API (HTTP and gRPC) listen on
// the given addresses. The zero MaxTraces keeps 10,000 traces; the zero
// Batch batches spans for 100 ms before they are stored.
type Jaeger struct {
	OTLPHTTP, OTLPGRPC, QueryHTTP, QueryGRPC string
	MaxTraces                                int
	Batch                                    time.Duration
}

// Config returns the YAML configuration to run it with (jaeger --config).
func (j Jaeger) Config() string {
	if j.MaxTraces == 0 {
		j.MaxTraces = 10000
	}
	if j.Batch == 0 {
		j.Batch = 100 * time.Millisecond
	}
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage: {traces: mem}
    http: {endpoint: "%s"}
    grpc: {endpoint: "%s"}
  jaeger_storage:
    backends:
      mem: {memory: {max_traces: %d}}
receivers:
  otlp:
    protocols:
      http: {endpoint: "%s"}
      grpc: {endpoint: "%s"}
processors:
  batch: {timeout: %s}
exporters:
  jaeger_storage_exporter: {trace_storage: mem}
`, j.QueryHTTP, j.QueryGRPC, j.MaxTraces, j.OTLPHTTP, j.OTLPGRPC, j.Batch)
}
