package slo

import (
	"fmt"
	"time"
)

// The sidecar's own alerts (docs/alerts.md has a runbook section per
// alert): what it lost or could not do, each already counted in a series
// of its own (docs/metrics.md), which nobody is told about unless an
// alert reads it. Thresholds are constants here; windows and "for"
// durations are scaled like the other rules'.
const (
	// TapFailureRatio is the share of requests the tap gave up on
	// (fallen back to plain forwarding: their records lack what the tap
	// measures) above which, held 10 minutes, the tap alert fires.
	TapFailureRatio = 0.01
)

// sidecarAlerts returns the alerts on the sidecar's own health; rng
// renders a (scaled) window.
func sidecarAlerts(rng func(time.Duration) string) []rule {
	m5, m10 := rng(5*time.Minute), rng(10*time.Minute)
	return []rule{
		{
			Alert:  "TokentapInternalErrors",
			Expr:   fmt.Sprintf("sum by (job, instance, where) (increase(tokentap_internal_errors_total[%s])) > 0", m10),
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} recovered from panics of its own",
				"description": "The sidecar recovered from about {{ $value | printf \"%.0f\" }} panics in the last 10 minutes (where={{ $labels.where }}): a bug in the sidecar, each logged at error with its stack. where=request: those clients got a 502, or their connection was cut, and their records say error_type internal. where=end: the answers were whole, and a stage after them (metrics, spans, sinks) was skipped or cut short.",
				"runbook":     runbook("TokentapInternalErrors"),
			},
		},
		{
			Alert: "TokentapMeasurementsDropped",
			Expr: fmt.Sprintf("label_replace(sum by (job, instance) (increase(tokentap_records_dropped_total[%s])) > 0, \"lost\", \"records\", \"\", \"\")\n"+
				"or label_replace(sum by (job, instance) (increase(tokentap_capture_dropped_total[%s])) > 0, \"lost\", \"capture lines\", \"\", \"\")", m10, m10),
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} dropped {{ $labels.lost }}",
				"description": "The sidecar could not write about {{ $value | printf \"%.0f\" }} {{ $labels.lost }} in the last 10 minutes (tokentap_records_dropped_total, tokentap_capture_dropped_total): a full queue behind a slow disk or reader, a failed write, a deleted file. The traffic was not affected; the records file or the capture is missing those requests.",
				"runbook":     runbook("TokentapMeasurementsDropped"),
			},
		},
		{
			Alert: "TokentapTapFailing",
			Expr: fmt.Sprintf("sum by (job, instance) (rate(tokentap_tap_failures_total{reason!~\"strip_overflow|event_too_large\"}[%s]))\n"+
				"/ sum by (job, instance) (rate(tokentap_requests_total[%s])) > %g", m10, m10, TapFailureRatio),
			For:    m10,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} cannot read a share of its responses",
				"description": fmt.Sprintf("The tap gave up on {{ $value | humanizePercentage }} of the requests over the last 10 minutes (threshold %g, held 10 minutes) and fell back to plain forwarding (fail open): the clients got their answers, but those records have no token timings. tokentap_tap_failures_total's reason label says why.", TapFailureRatio),
				"runbook":     runbook("TokentapTapFailing"),
			},
		},
		{
			Alert:  "TokentapConnectionsRejected",
			Expr:   fmt.Sprintf("sum by (job, instance) (increase(tokentap_connections_rejected_total[%s])) > 0", m5),
			For:    m5,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} refuses client connections at its limit",
				"description": "The sidecar refused about {{ $value | printf \"%.0f\" }} client connections with a 503 in the last 5 minutes, and has gone on refusing for 5 minutes: its connection limit (max_connections) is reached. Those clients never reached the engine.",
				"runbook":     runbook("TokentapConnectionsRejected"),
			},
		},
		{
			Alert:  "TokentapOTelExportFailing",
			Expr:   fmt.Sprintf("sum by (job, instance) (increase(tokentap_otel_errors_total[%s])) > 0", m10),
			For:    m10,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} cannot export its spans or OTLP metrics",
				"description": "OpenTelemetry's SDK reported about {{ $value | printf \"%.0f\" }} errors in the last 10 minutes, and has gone on for 10 minutes (tokentap_otel_errors_total): exports of spans or OTLP metrics fail or are refused, and the collector is missing them. Prometheus's /metrics is not affected.",
				"runbook":     runbook("TokentapOTelExportFailing"),
			},
		},
	}
}
