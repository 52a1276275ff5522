package slo

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Rule generation: the recording and alerting rules shipped in deploy/
// are generated from here (go run ./deploy/rulegen), as a plain rules file
// and as a PrometheusRule manifest, so the two cannot drift. Tests
// generate the same rules with every window divided by a scale factor.
//
// Design note: which bound do the alerts use? The recording rules export
// both the attainment's one-sided 95% Wilson LOWER bound (the figure that
// "proves" an SLO is met: 20/20 good requests prove only 88%) and the
// error ratio's one-sided 95% Wilson lower bound, which is 1 − the
// attainment's upper bound. Alerts fire on the latter: "we are 95% sure
// the error ratio is at least this", so a handful of requests never pages
// anyone, while a real outage does (docs/measurement.md §5: alerting compares a
// bound, not the point estimate, with the target).

// windows are the nominal windows of the recording rules; the SRE
// workbook's multi-window, multi-burn-rate pairs use them.
var windows = []time.Duration{5 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 24 * time.Hour, 72 * time.Hour}

// burnPairs are (long window, short window, burn rate) per alert, from
// the SRE workbook for a 30-day budget period.
var (
	fastBurn = [][3]string{{"1h", "5m", "14.4"}, {"6h", "30m", "6"}}
	slowBurn = [][3]string{{"1d", "2h", "3"}, {"3d", "6h", "1"}}
)

// RuleParams shape the generated rules.
type RuleParams struct {
	// Scale divides every range window and every "for" duration; 1 (or
	// 0) for production. The rule names keep their nominal windows.
	Scale int
}

type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

func name(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	default:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
}

// promDuration renders d for PromQL, in milliseconds when it is not a
// whole number of seconds.
func promDuration(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%dms", d/time.Millisecond)
	}
	if d%time.Minute != 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return name(d)
}

// wilsonExpr is the one-sided 95% Wilson lower bound of K/N in PromQL,
// K and N being series with the same labels.
func wilsonExpr(k, n string) string {
	z := Z95
	z2 := z * z
	p := fmt.Sprintf("(%s / %s)", k, n)
	return fmt.Sprintf("clamp_min(\n  (\n    %s + %.6f / %s\n    - %.6f * sqrt(%s * (1 - %s) / %s + %.6f / (%s ^ 2))\n  )\n  / (1 + %.6f / %s),\n  0\n)",
		p, z2/2, n, z, p, p, n, z2/4, n, z2, n)
}

// Rules returns the rule groups.
func Rules(p RuleParams) ruleFile {
	scale := time.Duration(max(p.Scale, 1))
	rng := func(d time.Duration) string { return promDuration(d / scale) }
	var rec []rule
	for _, w := range windows {
		n, r := name(w), rng(w)
		offered := "slo:tokentap_offered:increase" + n
		qualified := "slo:tokentap_qualified:increase" + n
		rec = append(rec,
			rule{Record: offered, Expr: fmt.Sprintf("sum by (slo) (increase(tokentap_slo_requests_total[%s]))", r)},
			rule{Record: qualified, Expr: fmt.Sprintf("sum by (slo) (increase(tokentap_slo_qualified_requests_total[%s]))", r)},
			rule{Record: "slo:tokentap_attainment:ratio" + n, Expr: fmt.Sprintf("%s / %s", qualified, offered)},
			rule{Record: "slo:tokentap_attainment_lower95:ratio" + n, Expr: wilsonExpr(qualified, offered)},
			rule{Record: "slo:tokentap_error_lower95:ratio" + n, Expr: wilsonExpr("("+offered+" - "+qualified+")", offered)},
			rule{Record: "slo:tokentap_goodput_requests:rate" + n, Expr: fmt.Sprintf("sum by (slo) (rate(tokentap_slo_qualified_requests_total[%s]))", r)},
			rule{Record: "slo:tokentap_goodput_tokens:rate" + n, Expr: fmt.Sprintf("sum by (slo) (rate(tokentap_slo_qualified_output_tokens_total[%s]))", r)},
		)
	}
	budget := "(1 - max by (slo) (tokentap_slo_target))"
	burn := func(pairs [][3]string) string {
		var parts []string
		for _, pr := range pairs {
			parts = append(parts, fmt.Sprintf("(\n  slo:tokentap_error_lower95:ratio%s > on (slo) (%s * %s)\n  and\n  slo:tokentap_error_lower95:ratio%s > on (slo) (%s * %s)\n)",
				pr[0], pr[2], budget, pr[1], pr[2], budget))
		}
		return strings.Join(parts, "\nor\n")
	}
	forDur := func(d time.Duration) string { return rng(d) }
	alerts := []rule{
		{
			Alert:  "TokentapSLOFastBurn",
			Expr:   burn(fastBurn),
			For:    forDur(2 * time.Minute),
			Labels: map[string]string{"severity": "page"},
			Annotations: map[string]string{
				"summary":     "SLO {{ $labels.slo }} is burning its error budget fast",
				"description": "With 95% confidence the error ratio of SLO {{ $labels.slo }} is above its burn-rate threshold over both the long and the short window of a fast-burn pair (14.4x over 1h and 5m, or 6x over 6h and 30m). At this rate a 30-day budget lasts about two days.",
				"runbook":     "docs/slo.md#alerts",
			},
		},
		{
			Alert:  "TokentapSLOSlowBurn",
			Expr:   burn(slowBurn),
			For:    forDur(15 * time.Minute),
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "SLO {{ $labels.slo }} is burning its error budget",
				"description": "With 95% confidence the error ratio of SLO {{ $labels.slo }} is above its burn-rate threshold over both windows of a slow-burn pair (3x over 1d and 2h, or 1x over 3d and 6h).",
				"runbook":     "docs/slo.md#alerts",
			},
		},
		{
			Alert:  "TokentapSLOAttainmentBelowTarget",
			Expr:   "slo:tokentap_error_lower95:ratio1h > on (slo) " + budget,
			For:    forDur(5 * time.Minute),
			Labels: map[string]string{"severity": "ticket"},
			Annotations: map[string]string{
				"summary":     "SLO {{ $labels.slo }} attainment over the last hour is below target",
				"description": "With 95% confidence the attainment of SLO {{ $labels.slo }} over the last hour is below its target (the value is the lower bound of the error ratio). Few requests never fire this: the bound needs evidence.",
				"runbook":     "docs/slo.md#alerts",
			},
		},
		forecastAlert(rng), // forecast_rules.go
	}
	return ruleFile{Groups: []ruleGroup{
		{Name: "tokentap-slo-recording", Rules: rec},
		{Name: "tokentap-cost-recording", Rules: costRules(rng)},      // cost_rules.go
		{Name: "tokentap-knee-recording", Rules: kneeRules(rng)},      // cost_rules.go
		{Name: "tokentap-tenant-recording", Rules: tenantRules(rng)},  // tenant_rules.go
		{Name: "tokentap-forecast-recording", Rules: forecastRules()}, // forecast_rules.go
		{Name: "tokentap-slo-alerts", Rules: alerts},
		{Name: "tokentap-engine-alerts", Rules: engineAlerts(rng)},   // engine_rules.go
		{Name: "tokentap-sidecar-alerts", Rules: sidecarAlerts(rng)}, // sidecar_rules.go
	}}
}

const generatedHeader = "# Generated by `go run ./deploy/rulegen` from slo/rules.go. DO NOT EDIT.\n"

// PlainRules renders the rules as a Prometheus rules file.
func PlainRules(p RuleParams) ([]byte, error) {
	b, err := yaml.Marshal(Rules(p))
	return append([]byte(generatedHeader), b...), err
}

// PrometheusRuleManifest renders the rules as a prometheus-operator
// PrometheusRule.
func PrometheusRuleManifest(p RuleParams) ([]byte, error) {
	m := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":   "tokentap-slo",
			"labels": map[string]string{"app.kubernetes.io/name": "tokentap", "app.kubernetes.io/component": "slo-rules"},
		},
		"spec": Rules(p),
	}
	b, err := yaml.Marshal(m)
	return append([]byte(generatedHeader), b...), err
}
