package slo

import (
	"fmt"
	"time"
)

// The engine and availability alerts (docs/alerts.md has a runbook
// section per alert): they ship in the same generated files as the SLO
// rules. Thresholds are constants here, documented in docs/alerts.md; the
// windows and "for" durations are divided by RuleParams.Scale like the
// SLO rules'.
const (
	// PreemptionRate is the sustained preemption rate, per second, that
	// pages: 3 a minute, each a stall a user feels.
	PreemptionRate = 0.05
	// PreemptionBurst is the number of preemptions in 5 minutes that
	// warns.
	PreemptionBurst = 5
	// KVFullRatio is the KV cache usage above which, held 10 minutes,
	// the cache is full.
	KVFullRatio = 0.95
	// RejectionRatio is the share of live requests the engine refuses
	// (HTTP 429/503) above which the rejection alert fires, given at
	// least RejectionMinRate requests per second.
	RejectionRatio   = 0.05
	RejectionMinRate = 0.1
	// CanaryMinSuccess is the share of canary probes that must succeed
	// over 10 minutes.
	CanaryMinSuccess = 0.5
)

func runbook(alert string) string { return "docs/alerts.md#" + lower(alert) }

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// engineAlerts returns the alerts on the engine's signals, the sidecar's
// upstream and the canary; rng renders a (scaled) window.
func engineAlerts(rng func(time.Duration) string) []rule {
	m5, m10, h1 := rng(5*time.Minute), rng(10*time.Minute), rng(time.Hour)
	return []rule{
		{
			Alert:  "TokentapEnginePreemptionsSustained",
			Expr:   fmt.Sprintf("sum by (job, instance, engine) (rate(tokentap_engine_preemptions_total[%s])) > %g", m10, PreemptionRate),
			For:    m10,
			Labels: map[string]string{"severity": "page"},
			Annotations: map[string]string{
				"summary":     "{{ $labels.engine }} on {{ $labels.instance }} keeps preempting sequences",
				"description": fmt.Sprintf("The engine preempted {{ $value | printf \"%%.3f\" }} sequences per second over the last 10 minutes (threshold %g/s, held 10 minutes). Each preemption stalls a stream while its KV cache is recomputed: the KV cache is too small for the load.", PreemptionRate),
				"runbook":     runbook("TokentapEnginePreemptionsSustained"),
			},
		},
		{
			Alert:  "TokentapEnginePreemptionBurst",
			Expr:   fmt.Sprintf("sum by (job, instance, engine) (increase(tokentap_engine_preemptions_total[%s])) >= %d", m5, PreemptionBurst),
			Labels: map[string]string{"severity": "warning"},
			Annotations: map[string]string{
				"summary":     "{{ $labels.engine }} on {{ $labels.instance }} preempted a burst of sequences",
				"description": fmt.Sprintf("The engine preempted {{ $value | printf \"%%.0f\" }} sequences in the last 5 minutes (threshold %d). Streams running then stalled; records carry preemptions_during and stall_cause.", PreemptionBurst),
				"runbook":     runbook("TokentapEnginePreemptionBurst"),
			},
		},
		{
			Alert:  "TokentapEngineKVCacheFull",
			Expr:   fmt.Sprintf("max by (job, instance, engine) (tokentap_engine_kv_cache_usage_ratio) > %g", KVFullRatio),
			For:    m10,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "{{ $labels.engine }} on {{ $labels.instance }}: KV cache above 95% for 10 minutes",
				"description": fmt.Sprintf("The engine's KV cache is {{ $value | humanizePercentage }} used (threshold %g, held 10 minutes). New sequences wait for room, and growing ones get preempted.", KVFullRatio),
				"runbook":     runbook("TokentapEngineKVCacheFull"),
			},
		},
		{
			Alert: "TokentapEngineQueueGrowing",
			Expr: fmt.Sprintf("deriv(tokentap_engine_requests_waiting[%s]) * 60 > 0\n"+
				"and on (job, instance, engine) tokentap_engine_requests_waiting > 0\n"+
				"and on (job, instance, engine) min_over_time(tokentap_engine_requests_running[%s]) >= max_over_time(tokentap_engine_requests_running[%s])\n"+
				"and on (job, instance, engine) min_over_time(tokentap_engine_requests_running[%s]) > 0", m10, m10, h1, m10),
			For:    m5,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "{{ $labels.engine }} on {{ $labels.instance }}: waiting queue growing with the batch full",
				"description": "The engine's waiting queue grows by {{ $value | printf \"%.1f\" }} requests a minute (trend over 10 minutes) while its running requests have stayed at their highest of the hour: the batch is full and arrivals outpace it. TTFT grows with the queue.",
				"runbook":     runbook("TokentapEngineQueueGrowing"),
			},
		},
		{
			Alert: "TokentapEngineRejections",
			Expr: fmt.Sprintf("sum by (job, instance) (rate(tokentap_requests_total{traffic=\"live\",outcome=\"rejected\"}[%s]))\n"+
				"/ sum by (job, instance) (rate(tokentap_requests_total{traffic=\"live\"}[%s])) > %g\n"+
				"and on (job, instance) sum by (job, instance) (rate(tokentap_requests_total{traffic=\"live\"}[%s])) > %g", m5, m5, RejectionRatio, m5, RejectionMinRate),
			For:    m5,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The engine behind {{ $labels.instance }} refuses requests (429/503)",
				"description": fmt.Sprintf("{{ $value | humanizePercentage }} of live requests over the last 5 minutes were rejected by the engine with HTTP 429 or 503 (threshold %g, at least %g requests/s, held 5 minutes).", RejectionRatio, RejectionMinRate),
				"runbook":     runbook("TokentapEngineRejections"),
			},
		},
		{
			Alert:  "TokentapCanaryFailing",
			Expr:   fmt.Sprintf("avg_over_time(probe_success[%s]) < %g", m10, CanaryMinSuccess),
			For:    m5,
			Labels: map[string]string{"severity": "page"},
			Annotations: map[string]string{
				"summary":     "Canary probe {{ $labels.probe }} on {{ $labels.instance }} is failing",
				"description": fmt.Sprintf("Only {{ $value | humanizePercentage }} of the samples of probe_success for probe {{ $labels.probe }} over the last 10 minutes were successes (threshold %g, held 5 minutes): a known-good request through the sidecar does not get a correct answer.", CanaryMinSuccess),
				"runbook":     runbook("TokentapCanaryFailing"),
			},
		},
		{
			Alert:  "TokentapEngineScrapeFailing",
			Expr:   "max by (job, instance) (tokentap_engine_up{reason!~\"no_metrics|not_started\"}) == 0",
			For:    m10,
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "The sidecar on {{ $labels.instance }} cannot scrape the engine's metrics",
				"description": "tokentap_engine_up has been 0 for 10 minutes (its reason label says why: timeout, connect, http_4xx, http_5xx, parse, too_large). The engine signals (queue, KV cache, preemptions) and the alerts on them are blind meanwhile.",
				"runbook":     runbook("TokentapEngineScrapeFailing"),
			},
		},
		{
			Alert:  "TokentapUpstreamDown",
			Expr:   "tokentap_upstream_up == 0",
			For:    rng(2 * time.Minute),
			Labels: map[string]string{"severity": "page"},
			Annotations: map[string]string{
				"summary":     "The engine behind {{ $labels.instance }} is down",
				"description": "The sidecar's health check of its upstream engine has failed for 2 minutes (tokentap_upstream_up = {{ $value }}): clients get 502s or nothing.",
				"runbook":     runbook("TokentapUpstreamDown"),
			},
		},
	}
}
