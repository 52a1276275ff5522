package slo

import (
	"fmt"
	"time"
)

// The breach forecast's fleet rules (forecast.go; docs/alerts.md has the
// runbook), generated with the SLO rules (rules.go) into the same shipped
// files.
//
// Each sidecar forecasts its own replica: the time until the load it
// sees reaches the first load bucket its own curve proves missed. The
// fleet's figure is the earliest of them: the first replica to breach
// starts to fail its users, whatever the others do (a balancer spreads
// load evenly only on average). The alert fires when that earliest
// breach is nearer than ForecastAlertSeconds, sustained.

// ForecastAlertSeconds is the lead under which TokentapSLOBreachForecast
// fires: time enough to scale out (a replica's start, model load and
// warm-up take minutes). Within the sidecar's default horizon (1 h).
const ForecastAlertSeconds = 1800

// forecastRules returns the fleet recording rules of the breach
// forecast.
func forecastRules() []rule {
	return []rule{
		{Record: "slo:tokentap_breach_forecast_seconds:min", Expr: "min by (slo) (tokentap_slo_breach_forecast_seconds)"},
		{Record: "slo:tokentap_breach_forecast_sidecars:count", Expr: "count by (slo) (tokentap_slo_breach_forecast_seconds)"},
	}
}

// forecastAlert returns TokentapSLOBreachForecast; rng renders a
// (scaled) duration.
func forecastAlert(rng func(time.Duration) string) rule {
	return rule{
		Alert:  "TokentapSLOBreachForecast",
		Expr:   fmt.Sprintf("slo:tokentap_breach_forecast_seconds:min < %d", ForecastAlertSeconds),
		For:    rng(5 * time.Minute),
		Labels: map[string]string{"severity": "ticket"},
		Annotations: map[string]string{
			"summary": "SLO {{ $labels.slo }} is forecast to breach in {{ $value | humanizeDuration }}",
			"description": "At the load's trend, the earliest sidecar's load reaches the first load bucket where SLO {{ $labels.slo }} is proven missed (its knee's curve) in {{ $value | humanizeDuration }} (0: it is there now). " +
				"The sidecar's forecast is a least-squares line through the SLO's target-quantile of its requests' loads over capacity.forecast_window (tokentap_slo_breach_forecast_seconds; /slo shows its evidence). Scale out or shed load before it comes.",
			"runbook": runbook("TokentapSLOBreachForecast"),
		},
	}
}
