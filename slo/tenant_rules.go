package slo

import (
	"fmt"
	"time"
)

// The per-tenant recording rules (docs/slo.md, per tenant), generated
// with the SLO rules (rules.go) into the same shipped files. They read
// the per-tenant counters, which exist only when tenants are on: with
// tenants off they record nothing.
//
// A tenant's cost is its share of each priced replica's cost, shared by
// live output tokens: Σ over replicas of the replica's cost rate × the
// tenant's live output tokens there / all live output tokens there.
// Divided by the tenant's goodput on the priced replicas, per SLO, it is
// the tenant's cost per million goodput tokens.

// tenantWindows are the windows of the per-tenant rules.
var tenantWindows = []time.Duration{5 * time.Minute, time.Hour, 24 * time.Hour}

// tenantRules returns the per-tenant recording rules; rng renders a
// (scaled) window.
func tenantRules(rng func(time.Duration) string) []rule {
	var rules []rule
	for _, w := range tenantWindows {
		n, r := name(w), rng(w)
		offered := "slo_tenant:tokentap_offered:increase" + n
		qualified := "slo_tenant:tokentap_qualified:increase" + n
		priced := fmt.Sprintf("group by (job, instance, currency) (rate(tokentap_replica_cost_total[%s]))", r)
		tenantTokens := fmt.Sprintf("sum by (job, instance, tenant) (rate(tokentap_tenant_output_tokens_total{traffic=\"live\"}[%s]))", r)
		replicaTokens := fmt.Sprintf("sum by (job, instance) (rate(tokentap_tenant_output_tokens_total{traffic=\"live\"}[%s]))", r)
		cost := fmt.Sprintf("sum by (job, instance, currency) (rate(tokentap_replica_cost_total[%s]))", r)
		good := fmt.Sprintf("sum by (job, instance, slo, tenant) (rate(tokentap_slo_qualified_output_tokens_by_tenant_total[%s]))", r)
		rules = append(rules,
			rule{Record: offered, Expr: fmt.Sprintf("sum by (slo, tenant) (increase(tokentap_slo_requests_by_tenant_total[%s]))", r)},
			rule{Record: qualified, Expr: fmt.Sprintf("sum by (slo, tenant) (increase(tokentap_slo_qualified_requests_by_tenant_total[%s]))", r)},
			rule{Record: "slo_tenant:tokentap_attainment:ratio" + n, Expr: fmt.Sprintf("%s / %s", qualified, offered)},
			rule{Record: "slo_tenant:tokentap_attainment_lower95:ratio" + n, Expr: wilsonExpr(qualified, offered)},
			rule{Record: "slo_tenant:tokentap_goodput_tokens:rate" + n,
				Expr: fmt.Sprintf("sum by (slo, tenant) (rate(tokentap_slo_qualified_output_tokens_by_tenant_total[%s]))", r)},
			// The tenant's share of the priced replicas' cost, by live output tokens.
			rule{Record: "tenant:tokentap_cost:rate" + n,
				Expr: fmt.Sprintf("sum by (tenant, currency) (\n(\n%s\n/ on (job, instance) group_left ()\n(%s > 0)\n)\n* on (job, instance) group_left (currency)\n%s\n)", tenantTokens, replicaTokens, cost)},
			rule{Record: "slo_tenant:tokentap_goodput_tokens_priced:rate" + n,
				Expr: fmt.Sprintf("sum by (slo, tenant, currency) (\n%s\n* on (job, instance) group_left (currency)\n%s\n)", good, priced)},
			rule{Record: "slo_tenant:tokentap_cost_per_million_goodput_tokens:ratio" + n,
				Expr: fmt.Sprintf("1e6 * tenant:tokentap_cost:rate%s\n/ on (tenant, currency) group_right ()\n(slo_tenant:tokentap_goodput_tokens_priced:rate%s > 0)", n, n)},
		)
	}
	return rules
}
