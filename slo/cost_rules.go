package slo

import (
	"fmt"
	"time"
)

// The cost, energy and knee recording rules (docs/cost.md), generated
// with the SLO rules (rules.go) into the same shipped files.
//
// Cost is the replica's: its declared price accrued while its sidecar
// ran (tokentap_replica_cost_total, so that replicas that came and went
// within the window count for the time they ran). It is divided by
// tokens of the same replicas only: the rules join on (job, instance),
// so that a sidecar with no declared price adds neither cost nor tokens.
// Per SLO, the cost is that of the replicas that served the SLO in the
// window (those exporting its counters), divided by their goodput.

// costWindows are the windows of the cost rules; kneeWindows those of
// the knee rules (a knee needs evidence: hours, not minutes).
var (
	costWindows = []time.Duration{5 * time.Minute, time.Hour, 24 * time.Hour}
	kneeWindows = []time.Duration{time.Hour, 24 * time.Hour}
)

// costRules returns the cost and energy recording rules; rng renders a
// (scaled) window.
func costRules(rng func(time.Duration) string) []rule {
	var rules []rule
	for _, w := range costWindows {
		n, r := name(w), rng(w)
		// The priced replicas, each once, currency kept: 1 per (job, instance, currency).
		priced := fmt.Sprintf("group by (job, instance, currency) (rate(tokentap_replica_cost_total[%s]))", r)
		costByInstance := fmt.Sprintf("sum by (job, instance, currency) (rate(tokentap_replica_cost_total[%s]))", r)
		energyPriced := fmt.Sprintf("group by (job, instance, currency) (max_over_time(tokentap_energy_price_per_kwh[%s]))", r)
		energyPrice := fmt.Sprintf("max by (job, instance, currency) (max_over_time(tokentap_energy_price_per_kwh[%s]))", r)
		liveTokens := fmt.Sprintf("sum by (job, instance) (rate(gen_ai_client_inference_usage_output_tokens_total{traffic=\"live\"}[%s]))", r)
		goodTokens := fmt.Sprintf("sum by (job, instance, slo) (rate(tokentap_slo_qualified_output_tokens_total[%s]))", r)
		serving := fmt.Sprintf("group by (job, instance, slo) (rate(tokentap_slo_requests_total[%s]))", r)
		energy := fmt.Sprintf("sum by (job, instance) (rate(tokentap_gpu_energy_joules_total[%s]))", r)
		idle := fmt.Sprintf("sum by (job, instance) (avg_over_time(tokentap_gpu_idle_power_watts[%s]))", r)
		metered := fmt.Sprintf("rate(tokentap_gpu_energy_joules_total[%s])", r)
		join := func(a, b string) string {
			return fmt.Sprintf("%s\n* on (job, instance) group_left (currency)\n%s", a, b)
		}
		rules = append(rules,
			// The replicas' cost, per second.
			rule{Record: "cost:tokentap_replica_cost:rate" + n, Expr: fmt.Sprintf("sum by (currency) (rate(tokentap_replica_cost_total[%s]))", r)},
			// Live output tokens of the priced replicas, per second.
			rule{Record: "cost:tokentap_output_tokens:rate" + n, Expr: fmt.Sprintf("sum by (currency) (\n%s\n)", join(liveTokens, priced))},
			rule{Record: "cost:tokentap_cost_per_million_output_tokens:ratio" + n,
				Expr: fmt.Sprintf("1e6 * cost:tokentap_replica_cost:rate%s / (cost:tokentap_output_tokens:rate%s > 0)", n, n)},
			// Per SLO: the cost of the replicas that served it, and their goodput.
			rule{Record: "slo:tokentap_replica_cost:rate" + n, Expr: fmt.Sprintf("sum by (slo, currency) (\n%s\n)", join(serving, costByInstance))},
			rule{Record: "slo:tokentap_goodput_tokens_priced:rate" + n, Expr: fmt.Sprintf("sum by (slo, currency) (\n%s\n)", join(goodTokens, priced))},
			rule{Record: "slo:tokentap_cost_per_million_goodput_tokens:ratio" + n,
				Expr: fmt.Sprintf("1e6 * slo:tokentap_replica_cost:rate%s / (slo:tokentap_goodput_tokens_priced:rate%s > 0)", n, n)},
			// The energy share: measured GPU energy at the declared kWh price.
			rule{Record: "cost:tokentap_energy_cost:rate" + n, Expr: fmt.Sprintf("sum by (currency) (\n%s\n) / 3.6e6", join(energy, energyPrice))},
			rule{Record: "cost:tokentap_energy_output_tokens:rate" + n,
				Expr: fmt.Sprintf("sum by (currency) (\n(\n%s\n)\nand on (job, instance) %s\n)", join(liveTokens, energyPriced), metered)},
			rule{Record: "cost:tokentap_energy_cost_per_million_output_tokens:ratio" + n,
				Expr: fmt.Sprintf("1e6 * cost:tokentap_energy_cost:rate%s / (cost:tokentap_energy_output_tokens:rate%s > 0)", n, n)},
			rule{Record: "slo:tokentap_energy_cost:rate" + n,
				Expr: fmt.Sprintf("sum by (slo, currency) (\n%s\n* on (job, instance) group_left (currency)\n(%s)\n) / 3.6e6", serving, join(energy, energyPrice))},
			rule{Record: "slo:tokentap_goodput_tokens_energy_priced:rate" + n,
				Expr: fmt.Sprintf("sum by (slo, currency) (\n(\n%s\n)\nand on (job, instance) %s\n)", join(goodTokens, energyPriced), metered)},
			rule{Record: "slo:tokentap_energy_cost_per_million_goodput_tokens:ratio" + n,
				Expr: fmt.Sprintf("1e6 * slo:tokentap_energy_cost:rate%s / (slo:tokentap_goodput_tokens_energy_priced:rate%s > 0)", n, n)},
			// J per live output token of the metered replicas, total and above idle.
			rule{Record: "energy:tokentap_joules_per_output_token:ratio" + n,
				Expr: fmt.Sprintf("sum(%s)\n/ (sum(%s and on (job, instance) %s) > 0)", energy, liveTokens, metered)},
		)
		// Dynamic J per output token over 5m only: the idle baseline is a
		// power, and over a long window a replica that ran for part of it
		// would have its energy rate diluted but its baseline not.
		if w == 5*time.Minute {
			rules = append(rules, rule{Record: "energy:tokentap_dynamic_joules_per_output_token:ratio" + n,
				Expr: fmt.Sprintf("clamp_min(sum(%s) - sum(%s and on (job, instance) %s), 0)\n/ (sum(%s and on (job, instance) %s) > 0)", energy, idle, metered, liveTokens, metered)})
		}
	}
	return rules
}

// kneeRules returns the attainment-vs-load and knee recording rules;
// rng renders a (scaled) window.
func kneeRules(rng func(time.Duration) string) []rule {
	var rules []rule
	for _, w := range kneeWindows {
		n, r := name(w), rng(w)
		offered := "slo_load:tokentap_offered:increase" + n
		qualified := "slo_load:tokentap_qualified:increase" + n
		lower := "slo_load:tokentap_attainment_lower95:ratio" + n
		bound := "max by (load) (tokentap_slo_load_bucket_bound)"
		// The buckets with evidence whose lower bound meets the target,
		// valued at their upper bound: the knee is the highest.
		meets := fmt.Sprintf("(\n  (%s >= on (slo) group_left max by (slo) (tokentap_slo_target))\n  and (%s >= %d)\n)\n* 0 + on (load) group_left %s", lower, offered, KneeMinRequests, bound)
		rules = append(rules,
			rule{Record: offered, Expr: fmt.Sprintf("sum by (slo, load) (increase(tokentap_slo_requests_by_load_total[%s]))", r)},
			rule{Record: qualified, Expr: fmt.Sprintf("sum by (slo, load) (increase(tokentap_slo_qualified_requests_by_load_total[%s]))", r)},
			rule{Record: "slo_load:tokentap_attainment:ratio" + n, Expr: fmt.Sprintf("%s / %s", qualified, offered)},
			rule{Record: lower, Expr: wilsonExpr(qualified, offered)},
			rule{Record: "slo_load:tokentap_goodput_tokens:rate" + n, Expr: fmt.Sprintf("sum by (slo, load) (rate(tokentap_slo_qualified_output_tokens_by_load_total[%s]))", r)},
			rule{Record: "slo:tokentap_knee_load:max" + n, Expr: fmt.Sprintf("max by (slo) (\n%s\n)", meets)},
			rule{Record: "slo:tokentap_knee_evidence:increase" + n,
				Expr: fmt.Sprintf("max by (slo) (\n  %s\n  and on (slo, load)\n  (%s * 0 + on (load) group_left %s == on (slo) group_left slo:tokentap_knee_load:max%s)\n)", offered, offered, bound, n)},
		)
	}
	return rules
}
