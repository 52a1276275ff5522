package dashboards

import (
	"fmt"
	"strings"
)

// boards are the dashboards, in the order of the file list.
func boards() []board {
	return []board{sloBoard(), latencyBoard(), energyBoard(), canaryBoard(), engineBoard(), sidecarBoard()}
}

var tags = []string{"tokentap"}

// fleet notes that a panel reads a recording rule, which aggregates every
// sidecar that Prometheus scrapes.
const fleet = " Recording rules sum every scraped sidecar by SLO (docs/slo.md, recording rules), so the job, namespace, pod and instance selectors do not filter this panel."

// costFleet is fleet for the cost, energy and knee rules, which sum the
// scraped sidecars by SLO and currency, or over the whole fleet.
const costFleet = " The cost, energy and knee recording rules sum every scraped sidecar (by SLO, currency or load bucket; docs/cost.md, recording rules), so the job, namespace, pod, instance and model selectors do not filter this panel."

// ---------------------------------------------------------------------------
// SLO & goodput

func burn(window string) target {
	return target{
		expr:   fmt.Sprintf(`slo:tokentap_error_lower95:ratio%s{slo=~"$slo"} / on (slo) (1 - max by (slo) (tokentap_slo_target{`+selSLO+`}))`, window),
		legend: "{{slo}} " + window,
	}
}

func sloBoard() board {
	return board{
		file: "tokentap-slo.json", uid: "tokentap-slo", title: "tokentap / SLO & goodput", tags: tags,
		desc: "SLO attainment with its 95% Wilson bounds, goodput and why requests failed (docs/measurement.md §5, docs/slo.md).",
		vars: []string{"slo", "model", "tenant"},
		rows: []row{
			{title: "Attainment", panels: []panel{
				{kind: kStat, title: "Attainment, last 1h (fleet)", unit: "percentunit", w: 6, h: 6, min: fp(0), max: fp(1),
					desc: "Attainment = qualified / offered over the last hour, per SLO: the recording rule slo:tokentap_attainment:ratio1h. " +
						"A request qualifies when it succeeded and met every applicable threshold; errors, rejections, timeouts and (by default) cancellations stay in the denominator (docs/measurement.md §5)." + fleet,
					targets: []target{{expr: `slo:tokentap_attainment:ratio1h{slo=~"$slo"}`, legend: "{{slo}}"}}},
				{kind: kStat, title: "Attainment lower bound (95%), last 1h (fleet)", unit: "percentunit", w: 6, h: 6, min: fp(0), max: fp(1),
					desc:    "The one-sided 95% Wilson lower bound of the last hour's attainment (slo:tokentap_attainment_lower95:ratio1h): at or above the target, the SLO is proven met; 20 good requests out of 20 prove only 88% (docs/measurement.md §5)." + fleet,
					targets: []target{{expr: `slo:tokentap_attainment_lower95:ratio1h{slo=~"$slo"}`, legend: "{{slo}}"}}},
				{kind: kStat, title: "Target", unit: "percentunit", w: 6, h: 6, min: fp(0), max: fp(1),
					desc:    "The declared attainment target of each SLO (tokentap_slo_target, the largest across the selected sidecars; docs/slo.md, metrics).",
					targets: []target{{expr: `max by (slo) (tokentap_slo_target{` + selSLO + `})`, legend: "{{slo}}"}}},
				{kind: kStat, title: "Offered requests, last 1h (fleet)", unit: "short", w: 6, h: 6,
					desc:    "Offered: every in-scope request that arrived in the last hour, whatever its outcome (slo:tokentap_offered:increase1h, the attainment's denominator; docs/measurement.md §5). Few requests give wide bounds." + fleet,
					targets: []target{{expr: `slo:tokentap_offered:increase1h{slo=~"$slo"}`, legend: "{{slo}}"}}},
				{title: "Attainment with 95% Wilson bounds vs target (1h window, fleet)", unit: "percentunit", w: 24, h: 9, max: fp(1),
					desc: "Per SLO over a sliding 1h window: the point estimate qualified/offered (slo:tokentap_attainment:ratio1h), the Wilson 95% lower bound (…attainment_lower95…), " +
						"the upper bound (1 − slo:tokentap_error_lower95:ratio1h) and the declared target (docs/measurement.md §5). The alerts compare the upper bound with the target: it fires only when the SLO is missed with 95% confidence." + fleet,
					targets: []target{
						{expr: `slo:tokentap_attainment:ratio1h{slo=~"$slo"}`, legend: "{{slo}} attainment"},
						{expr: `slo:tokentap_attainment_lower95:ratio1h{slo=~"$slo"}`, legend: "{{slo}} lower 95%"},
						{expr: `1 - slo:tokentap_error_lower95:ratio1h{slo=~"$slo"}`, legend: "{{slo}} upper 95%"},
						{expr: `max by (slo) (tokentap_slo_target{` + selSLO + `})`, legend: "{{slo}} target"},
					}},
				{title: "Attainment by window (fleet)", unit: "percentunit", w: 12, h: 8, max: fp(1),
					desc: "The attainment point estimate qualified/offered over windows of 5m, 1h and 1d (slo:tokentap_attainment:ratio<W>; docs/measurement.md §5). Short windows react, long windows are what the budget is measured against." + fleet,
					targets: []target{
						{expr: `slo:tokentap_attainment:ratio5m{slo=~"$slo"}`, legend: "{{slo}} 5m"},
						{expr: `slo:tokentap_attainment:ratio1h{slo=~"$slo"}`, legend: "{{slo}} 1h"},
						{expr: `slo:tokentap_attainment:ratio1d{slo=~"$slo"}`, legend: "{{slo}} 1d"},
					}},
				{title: "Error-budget burn rate (95% bound)", unit: "none", w: 12, h: 8, min: fp(0), thresholds: []float64{1, 6, 14.4},
					desc: "Burn rate = the Wilson 95% lower bound of the error ratio over a window (slo:tokentap_error_lower95:ratio<W>) divided by the error budget 1 − target. " +
						"1× spends a 30-day budget in 30 days; the fast-burn alert needs 14.4× over 1h and 5m (or 6× over 6h and 30m), the slow burn 3× over 1d and 2h (or 1× over 3d and 6h) (docs/slo.md, alerts; docs/measurement.md §5)." + fleet,
					targets: []target{burn("5m"), burn("1h"), burn("6h"), burn("3d")}},
			}},
			{title: "Goodput", panels: []panel{
				{title: "Goodput: qualified requests/s", unit: "reqps", w: 8, h: 8, min: fp(0),
					desc:    "Goodput in requests: the rate of requests that qualified for each SLO, from tokentap_slo_qualified_requests_total of the selected sidecars (docs/measurement.md §5, goodput). The recording rule slo:tokentap_goodput_requests:rate5m is the same sum over the whole fleet.",
					targets: []target{{expr: `sum by (slo) (rate(tokentap_slo_qualified_requests_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}}"}}},
				{title: "Goodput: output tokens/s of qualified requests", unit: "short", w: 8, h: 8, min: fp(0),
					desc: "Goodput in tokens: output tokens per second of the requests that qualified for each SLO (tokentap_slo_qualified_output_tokens_total; docs/measurement.md §5; a qualified request whose token count is unknown adds nothing), " +
						"next to all live output tokens/s of the selected models (gen_ai_client_inference_usage_output_tokens_total, docs/metrics.md). The gap between them is throughput that did not meet the SLO.",
					targets: []target{
						{expr: `sum by (slo) (rate(tokentap_slo_qualified_output_tokens_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}} goodput"},
						{expr: `sum(rate(gen_ai_client_inference_usage_output_tokens_total{` + selLive + `}[` + ri + `]))`, legend: "all live output tokens/s"},
					}},
				{title: "Offered vs qualified requests/s", unit: "reqps", w: 8, h: 8, min: fp(0),
					desc: "Offered (every in-scope request that arrived: tokentap_slo_requests_total) and qualified (tokentap_slo_qualified_requests_total) requests per second, per SLO, for the selected sidecars (docs/measurement.md §5).",
					targets: []target{
						{expr: `sum by (slo) (rate(tokentap_slo_requests_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}} offered"},
						{expr: `sum by (slo) (rate(tokentap_slo_qualified_requests_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}} qualified"},
					}},
				{title: "Goodput, 5m (fleet)", unit: "reqps", w: 12, h: 8, min: fp(0), rightAxis: "tokens/s$", rightUnit: "short",
					desc: "The recording rules slo:tokentap_goodput_requests:rate5m (qualified requests/s) and slo:tokentap_goodput_tokens:rate5m (output tokens/s of qualified requests), per SLO (docs/measurement.md §5)." + fleet,
					targets: []target{
						{expr: `slo:tokentap_goodput_requests:rate5m{slo=~"$slo"}`, legend: "{{slo}} requests/s"},
						{expr: `slo:tokentap_goodput_tokens:rate5m{slo=~"$slo"}`, legend: "{{slo}} tokens/s"},
					}},
				{title: "Fluidity score, p10 and p50", unit: "percentunit", w: 12, h: 8, max: fp(1),
					desc:    "The per-request fluidity score (1 − missed deadlines / deadlines under the SLO's schedule D + i·c; docs/measurement.md §6), request-weighted, from the tokentap_fluidity_ratio histogram. Low quantiles matter: p10 is the fluidity that 90% of requests beat. Only SLOs that declare a fluidity threshold have it.",
					targets: append(quantiles("tokentap_fluidity_ratio", selSLO, "slo", "{{slo}} ", "0.1"), quantiles("tokentap_fluidity_ratio", selSLO, "slo", "{{slo}} ", "0.5")...)},
			}},
			{title: "Why requests failed", panels: []panel{
				{kind: kBarGauge, title: "Top failing thresholds (dashboard range)", unit: "short", w: 8, h: 9,
					desc:    "The 10 (SLO, reason) pairs with the most failed requests over the dashboard's time range: increase of tokentap_slo_failures_total. The reason is a threshold (ttft, ttfot, tpot, e2e, max_itl, fluidity, output_tokens) or the outcome (error, rejected, timeout, cancelled, no_answer), or under structure: required a failed structure check (tool_args_schema, ...); a request that fails two counts under both (docs/measurement.md §5, docs/slo.md).",
					targets: []target{{expr: `topk(10, sum by (slo, threshold) (increase(tokentap_slo_failures_total{` + selSLO + `}[$__range])))`, legend: "{{slo}} {{threshold}}", instant: true}}},
				{title: "Failures by reason, requests/s", unit: "reqps", w: 10, h: 9, min: fp(0), stack: true,
					desc:    "Rate of non-qualified requests by SLO and reason (tokentap_slo_failures_total; docs/measurement.md §5). Stacked; a request failing two thresholds appears twice.",
					targets: []target{{expr: `sum by (slo, threshold) (rate(tokentap_slo_failures_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}} {{threshold}}"}}},
				{title: "Excluded from the denominator, requests/s", unit: "reqps", w: 6, h: 9, min: fp(0),
					desc:    "In-scope requests excluded by a declared option (today: client cancellations under count_cancelled: false), by SLO and reason (tokentap_slo_excluded_total; docs/measurement.md §5). Never silently dropped: they are counted here.",
					targets: []target{{expr: `sum by (slo, reason) (rate(tokentap_slo_excluded_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}} {{reason}}"}}},
				{title: "Fast but invalid: share of offered requests", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1),
					desc: "Per SLO, the share of offered requests that failed on structure checks alone: a success within every latency threshold whose answer does not hold (a tool call's arguments that do not parse or break the tool's schema, an undeclared tool, a JSON output that does not parse or validate, JSON cut by the token limit, more than the bound to check). " +
						"tokentap_slo_fast_invalid_total over tokentap_slo_requests_total, 0 where none failed so; only SLOs that declare structure: required count any (docs/slo.md, Structure; docs/metrics.md). The /slo page shows the same over its window (fast_invalid_share).",
					targets: []target{{expr: `(sum by (slo) (rate(tokentap_slo_fast_invalid_total{` + selSLO + `}[` + ri + `])) or 0 * sum by (slo) (rate(tokentap_slo_requests_total{` + selSLO + `}[` + ri + `])))` +
						` / sum by (slo) (rate(tokentap_slo_requests_total{` + selSLO + `}[` + ri + `]))`, legend: "{{slo}}"}}},
				{title: "Structure checks failed, by check, requests/s", unit: "reqps", w: 12, h: 8, min: fp(0), stack: true,
					desc: "Live answers that failed a structure check, by check (tokentap_structure_failures_total; docs/metrics.md, docs/slo.md, Structure): tool_args_invalid_json, tool_args_schema, unknown_tool, output_invalid_json, output_schema, truncated_json, too_large. " +
						"Checked only while an SLO declares structure: required, for requests that declare tools or a JSON output. Stacked; an answer failing two checks appears twice.",
					targets: []target{{expr: `sum by (check) (rate(tokentap_structure_failures_total{` + selLive + `}[` + ri + `]))`, legend: "{{check}}"}}},
			}},
			costRow(),
			tenantRow(),
		},
	}
}

// tenantFleet says that the per-tenant recording rules sum the fleet.
const tenantFleet = " Recording rules sum every scraped sidecar by SLO and tenant (docs/slo.md, per tenant), so the job, namespace, pod and instance selectors do not filter this panel."

// tenantRow is attainment, goodput and cost by tenant (docs/slo.md, per
// tenant): empty unless the sidecars resolve tenants (tenant.from).
func tenantRow() row {
	selTenant := `slo=~"$slo", tenant=~"$tenant"`
	return row{title: "By tenant", panels: []panel{
		{title: "Attainment by tenant, 1h (fleet)", unit: "percentunit", w: 12, h: 8, max: fp(1),
			desc: "Per SLO and tenant: qualified / offered over the last hour (slo_tenant:tokentap_attainment:ratio1h) and its one-sided 95% Wilson lower bound (slo_tenant:tokentap_attainment_lower95:ratio1h; docs/measurement.md §5). " +
				"tenant is the bounded label of docs/metrics.md (a declared name, t- and 12 hex characters of a keyed hash, _other, _none); tenants off, no data." + tenantFleet,
			targets: []target{
				{expr: `slo_tenant:tokentap_attainment:ratio1h{` + selTenant + `}`, legend: "{{slo}} {{tenant}}"},
				{expr: `slo_tenant:tokentap_attainment_lower95:ratio1h{` + selTenant + `}`, legend: "{{slo}} {{tenant}} lower 95%"},
			}},
		{title: "Goodput by tenant: output tokens/s of qualified requests", unit: "short", w: 12, h: 8, min: fp(0),
			desc:    "Each tenant's token goodput: output tokens per second of its requests that qualified for each SLO, from tokentap_slo_qualified_output_tokens_by_tenant_total of the selected sidecars (docs/metrics.md, per tenant; docs/measurement.md §5).",
			targets: []target{{expr: `sum by (slo, tenant) (rate(tokentap_slo_qualified_output_tokens_by_tenant_total{` + selSLO + `, tenant=~"$tenant"}[` + ri + `]))`, legend: "{{slo}} {{tenant}}"}}},
		{title: "Cost per 1M goodput tokens by tenant, 1h (fleet)", unit: "short", w: 12, h: 8, min: fp(0),
			desc: "A tenant's share of the priced replicas' cost (each replica's cost shared by live output tokens, tokentap_tenant_output_tokens_total) over the last hour, ÷ its goodput tokens on them × 10⁶, per SLO, tenant and currency " +
				"(slo_tenant:tokentap_cost_per_million_goodput_tokens:ratio1h; docs/slo.md, per tenant; docs/cost.md). No declared price, no value." + tenantFleet,
			targets: []target{{expr: `slo_tenant:tokentap_cost_per_million_goodput_tokens:ratio1h{` + selTenant + `}`, legend: "{{slo}} {{tenant}} {{currency}}"}}},
		{title: "Output tokens/s by tenant (live)", unit: "short", w: 12, h: 8, min: fp(0), stack: true,
			desc:    "Live output tokens per second by tenant, whether or not they met an SLO (tokentap_tenant_output_tokens_total; docs/metrics.md, per tenant): each tenant's share of the load, by which the cost rules share the cost.",
			targets: []target{{expr: `sum by (tenant) (rate(tokentap_tenant_output_tokens_total{` + sel + `, traffic="live", tenant=~"$tenant"}[` + ri + `]))`, legend: "{{tenant}}"}}},
	}}
}

// costRow is the scorecard of docs/cost.md: what a token that keeps the
// promise costs, the energy it takes, the latency and attainment behind
// it, and how far the replicas can be loaded before the SLO breaks (the
// knee). The figures are the shipped cost, energy and knee recording
// rules, so they need a declared price (cost:) and, for energy, GPU
// energy on.
func costRow() row {
	sloTarget := `max by (slo) (tokentap_slo_target{` + selSLO + `})`
	return row{title: "Cost and capacity", panels: []panel{
		{kind: kStat, title: "Cost per 1M goodput tokens, 1h (fleet)", unit: "short", w: 6, h: 6, min: fp(0),
			desc: "The declared price of the replicas that served each SLO, accrued over the last hour while their sidecars ran, ÷ the output tokens of the requests that met the SLO × 10⁶, per SLO and currency (slo:tokentap_cost_per_million_goodput_tokens:ratio1h; docs/cost.md, cost per million goodput tokens; goodput as in docs/measurement.md §5). " +
				"The figure to plan with: read at the knee, it is the price of a token that keeps the promise. No declared price (cost: in the config), no value." + costFleet,
			targets: []target{{expr: `slo:tokentap_cost_per_million_goodput_tokens:ratio1h{slo=~"$slo"}`, legend: "{{slo}} {{currency}}"}}},
		{kind: kStat, title: "Cost per 1M output tokens, 1h (fleet)", unit: "short", w: 6, h: 6, min: fp(0),
			desc: "The same cost ÷ every live output token of the priced replicas (good or not, any SLO; canary tokens left out) × 10⁶, per currency (cost:tokentap_cost_per_million_output_tokens:ratio1h; docs/cost.md, cost per million output tokens; tokens as in docs/measurement.md §2). " +
				"It flatters an overloaded replica: past the knee it falls while the cost per goodput token rises." + costFleet,
			targets: []target{{expr: `cost:tokentap_cost_per_million_output_tokens:ratio1h`, legend: "{{currency}}"}}},
		{kind: kStat, title: "Energy share per 1M goodput tokens, 1h (fleet)", unit: "short", w: 6, h: 6, min: fp(0),
			desc: "The measured GPU energy at the declared kWh price (joules ÷ 3.6·10⁶ × cost.energy_per_kwh) ÷ each SLO's goodput tokens × 10⁶, per SLO and currency, over the replicas with both an energy price and measured energy (slo:tokentap_energy_cost_per_million_goodput_tokens:ratio1h; docs/cost.md, energy share; energy as in docs/measurement.md §8). " +
				"The part of the cost that is energy: whether it adds to the hourly price depends on what that price includes." + costFleet,
			targets: []target{{expr: `slo:tokentap_energy_cost_per_million_goodput_tokens:ratio1h{slo=~"$slo"}`, legend: "{{slo}} {{currency}}"}}},
		{kind: kStat, title: "Knee and its evidence, 1d (fleet)", unit: "short", w: 6, h: 6, min: fp(0), noValue: "not enough evidence",
			desc: "The knee: the upper bound of the highest load bucket whose attainment lower bound (one-sided 95% Wilson, docs/measurement.md §5) meets the target with at least 20 requests, pooled over the fleet's last day (slo:tokentap_knee_load:max1d), and its evidence, the requests offered in that bucket (slo:tokentap_knee_evidence:increase1d) (docs/cost.md, the knee). " +
				"A request's load is the time-weighted mean number of requests in flight through its sidecar during its life, itself included. No value: not enough evidence." + costFleet,
			targets: []target{
				{expr: `slo:tokentap_knee_load:max1d{slo=~"$slo"}`, legend: "{{slo}} knee (load ≤)"},
				{expr: `slo:tokentap_knee_evidence:increase1d{slo=~"$slo"}`, legend: "{{slo}} evidence (requests)"},
			}},
		{title: "Goodput vs output tokens, 5m (fleet)", unit: "short", w: 12, h: 8, min: fp(0),
			desc: "Output tokens/s of the requests that met each SLO (slo:tokentap_goodput_tokens:rate5m; docs/measurement.md §5) against the live output tokens/s of the priced replicas, canary left out (cost:tokentap_output_tokens:rate5m, per currency). " +
				"Past the knee output keeps rising while goodput falls: the gap is throughput that broke the SLO, which is why cost is planned per goodput token (docs/cost.md, why the goodput figure is the one to plan with)." + costFleet,
			targets: []target{
				{expr: `slo:tokentap_goodput_tokens:rate5m{slo=~"$slo"}`, legend: "{{slo}} goodput tokens/s"},
				{expr: `cost:tokentap_output_tokens:rate5m`, legend: "output tokens/s ({{currency}} priced)"},
			}},
		{title: "J per output token: total and dynamic, 5m (fleet)", unit: "joule", w: 12, h: 8, min: fp(0),
			desc: "All measured GPU energy of the metered replicas, idle and unattributed included, ÷ their live output tokens (energy:tokentap_joules_per_output_token:ratio5m), and the same with the idle baseline (tokentap_gpu_idle_power_watts) taken out first (energy:tokentap_dynamic_joules_per_output_token:ratio5m) (docs/cost.md, joules per output token; docs/measurement.md §8). " +
				"The replicas' real bill, so at least /slo's figure, which counts the energy attributed to requests. Empty when no sidecar measures energy." + costFleet,
			targets: []target{
				{expr: `energy:tokentap_joules_per_output_token:ratio5m`, legend: "total J/token"},
				{expr: `energy:tokentap_dynamic_joules_per_output_token:ratio5m`, legend: "dynamic J/token"},
			}},
		{title: "TTFT p99 and ITL p99 (live)", unit: "s", w: 12, h: 8, min: fp(0),
			desc: "The 99th percentiles of live traffic's TTFT, one value per streamed request that produced a token (request-weighted), and ITL, one value per gap between token events (gap-weighted), for the selected sidecars and models (gen_ai_server_time_to_first_token_seconds, tokentap_inter_token_latency_seconds; docs/measurement.md §3-§4; docs/cost.md, TTFT p99 and ITL p99). " +
				"Native histograms where Prometheus has them, classic buckets otherwise.",
			targets: []target{
				{expr: hq("0.99", "gen_ai_server_time_to_first_token_seconds", selLive, ""), legend: "TTFT p99"},
				{expr: hq("0.99", "tokentap_inter_token_latency_seconds", selLive, ""), legend: "ITL p99"},
			}},
		{kind: kStat, title: "Attainment and its lower bound, 1h (fleet)", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1),
			desc: "Per SLO over the last hour: attainment = qualified ÷ offered (slo:tokentap_attainment:ratio1h), its one-sided 95% Wilson lower bound (slo:tokentap_attainment_lower95:ratio1h) and the declared target (tokentap_slo_target); met when the lower bound reaches the target (docs/measurement.md §5; docs/cost.md, attainment and its bound)." + fleet,
			targets: []target{
				{expr: `slo:tokentap_attainment:ratio1h{slo=~"$slo"}`, legend: "{{slo}} attainment"},
				{expr: `slo:tokentap_attainment_lower95:ratio1h{slo=~"$slo"}`, legend: "{{slo}} lower 95%"},
				{expr: sloTarget, legend: "{{slo}} target"},
			}},
		{kind: kBarGauge, title: "Attainment vs load, 1d (fleet)", unit: "short", w: 12, h: 10, min: fp(0), percent: "(lower 95%|attainment|target)$",
			desc: "The fleet's curve over the last day, per SLO and load bucket (label load: the bucket's upper bound, for loads in (previous bound, bound]): the one-sided 95% Wilson lower bound of the attainment (slo_load:tokentap_attainment_lower95:ratio1d), the attainment (slo_load:tokentap_attainment:ratio1d), the goodput in output tokens/s (slo_load:tokentap_goodput_tokens:rate1d, bars scaled to the highest) and the target. " +
				"A bucket meets the target with at least 20 requests and its lower bound at or above the target; the knee is the highest bucket that meets it (docs/cost.md, the knee; docs/measurement.md §5). Bars come in the load label's text order; /slo plots one sidecar's curve." + costFleet,
			targets: []target{
				{expr: `slo_load:tokentap_attainment_lower95:ratio1d{slo=~"$slo"}`, legend: "{{slo}} load ≤ {{load}}: lower 95%"},
				{expr: `slo_load:tokentap_attainment:ratio1d{slo=~"$slo"}`, legend: "{{slo}} load ≤ {{load}}: attainment"},
				{expr: `slo_load:tokentap_goodput_tokens:rate1d{slo=~"$slo"}`, legend: "{{slo}} load ≤ {{load}}: goodput tokens/s"},
				{expr: sloTarget, legend: "{{slo}} target"},
			}},
		{title: "Load now vs the knee", unit: "short", w: 12, h: 10, min: fp(0),
			desc: "Per sidecar: the requests in flight through it (tokentap_requests_in_flight, live and canary: both load the engine) against its own knee per SLO over the SLO's window (tokentap_slo_knee_load; absent without enough evidence) (docs/cost.md, load and the knee; docs/measurement.md §5). " +
				"The gap is the headroom. A request's load is the time-weighted mean of this count over its life, itself included, so a count that stays above the knee breaks the SLO.",
			targets: []target{
				{expr: `sum by (instance) (tokentap_requests_in_flight{` + sel + `})`, legend: "{{instance}} in flight"},
				{expr: `max by (instance, slo) (tokentap_slo_knee_load{` + selSLO + `})`, legend: "{{instance}} {{slo}} knee"},
			}},
		{kind: kStat, title: "Breach forecast: the earliest sidecar (fleet)", unit: "s", w: 8, h: 8, min: fp(0), noValue: "no breach forecast",
			desc: "Per SLO, the earliest of the sidecars' breach forecasts (slo:tokentap_breach_forecast_seconds:min): the time until a sidecar's load, the SLO's target-quantile of the loads its requests ran under fitted by least squares over capacity.forecast_window, reaches the first load bucket its curve proves missed; 0: it is there now (docs/measurement.md, the breach forecast; docs/cost.md, the breach forecast). " +
				"No value: no sidecar has the evidence (a bucket proven missed, a fit, a rise proven at 95%) or a breach within its horizon; never a guess. TokentapSLOBreachForecast fires under 30 minutes (docs/alerts.md)." + costFleet,
			targets: []target{{expr: `slo:tokentap_breach_forecast_seconds:min{slo=~"$slo"}`, legend: "{{slo}}"}}},
		{title: "Breach forecast per sidecar", unit: "s", w: 16, h: 8, min: fp(0),
			desc: "Each sidecar's forecast per SLO (tokentap_slo_breach_forecast_seconds; docs/metrics.md): the seconds until its load's trend reaches its own breach bucket, counting down as a ramp nears it; gaps are times without the evidence for one (docs/measurement.md, the breach forecast). " +
				"/slo on the sidecar shows the evidence: the breach bucket and the knee, the fitted load and slope with their errors, the samples.",
			targets: []target{{expr: `max by (instance, slo) (tokentap_slo_breach_forecast_seconds{` + selSLO + `})`, legend: "{{instance}} {{slo}}"}}},
	}}
}

// ---------------------------------------------------------------------------
// Latency as users feel it

func latencyPanel(title, metric, def string, w uint32) panel {
	return panel{title: title, unit: "s", w: w, h: 8, min: fp(0), desc: def,
		targets: quantiles(metric, selT, "", "", "0.5", "0.9", "0.95", "0.99")}
}

func latencyBoard() board {
	return board{
		file: "tokentap-latency.json", uid: "tokentap-latency", title: "tokentap / Latency as users feel it", tags: tags,
		desc: "TTFT, TTFOT, ITL (token-weighted), TPOT (request-weighted), E2E and outcomes, measured at the sidecar on the bytes the client receives (docs/measurement.md §1-§4, docs/metrics.md). Percentiles are computed across the fleet from native histograms where Prometheus has them, classic buckets otherwise.",
		vars: []string{"model", "traffic"},
		rows: []row{
			{title: "First token", panels: []panel{
				latencyPanel("TTFT p50/p90/p95/p99 (request-weighted)", "gen_ai_server_time_to_first_token_seconds",
					"Time to first token = t_first_token − t_arrive, one observation per streamed request that produced a token; the first token is the first event carrying generated output (content, reasoning or tool calls), never a role-only chunk (docs/measurement.md §3, docs/metrics.md: gen_ai_server_time_to_first_token_seconds). Quantiles over the selected sidecars, models and traffic.", 12),
				latencyPanel("TTFOT p50/p90/p95/p99 (request-weighted)", "tokentap_time_to_first_output_token_seconds",
					"Time to first output token = t_first_output_token − t_arrive: the first user-visible content or tool call, reasoning excluded (docs/measurement.md §3, docs/metrics.md: tokentap_time_to_first_output_token_seconds). Equal to TTFT for models that do not reason.", 12),
				{title: "TTFT p95 by model", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "The 95th percentile of TTFT (docs/measurement.md §3) per gen_ai_request_model, request-weighted (docs/measurement.md §4).",
					targets: []target{{expr: hq("0.95", "gen_ai_server_time_to_first_token_seconds", selT, "gen_ai_request_model"), legend: "{{gen_ai_request_model}}"}}},
				{title: "TTFT p90 by prompt class (prefill cost)", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "The 90th percentile of TTFT per prompt class (request classes by usage.prompt_tokens, declared in slo.prompt_classes): the prefill cost per class (docs/slo.md, metrics: tokentap_time_to_first_token_by_class_seconds; docs/measurement.md §3).",
					targets: []target{{expr: hq("0.9", "tokentap_time_to_first_token_by_class_seconds", selT, "prompt_class"), legend: "{{prompt_class}}"}}},
				{kind: kHeatmap, title: "TTFT distribution (heatmap)", unit: "s", w: 12, h: 8,
					desc:    "The distribution of TTFT (docs/measurement.md §3) per time slice: requests per bucket of gen_ai_server_time_to_first_token_seconds, native histogram where available, classic buckets otherwise.",
					targets: []target{{expr: hmap("gen_ai_server_time_to_first_token_seconds", selT), legend: "{{le}}"}}},
				latencyPanel("TTFB p50/p90/p95/p99 (request-weighted)", "tokentap_time_to_first_byte_seconds",
					"Time to first byte = t_first_byte − t_arrive: the first response body byte read from the engine, for every request that got a body, streamed or not (docs/measurement.md §3, docs/metrics.md: tokentap_time_to_first_byte_seconds).", 12),
			}},
			{title: "Between tokens", panels: []panel{
				latencyPanel("ITL p50/p90/p95/p99 (token-weighted)", "tokentap_inter_token_latency_seconds",
					"Inter-token latency, token-weighted: one observation per gap between consecutive token-bearing events, so long answers weigh more; an event carrying k tokens is one gap, never divided by k (docs/measurement.md §2-§4, docs/metrics.md: tokentap_inter_token_latency_seconds). Answers 'how smooth was a typical gap'.", 12),
				latencyPanel("TPOT p50/p90/p95/p99 (request-weighted)", "gen_ai_server_time_per_output_token_seconds",
					"Time per output token = (t_last_token − t_first_token) / (n − 1), one value per streamed request with n ≥ 2 tokens (undefined, not zero, below that), request-weighted (docs/measurement.md §3-§4, docs/metrics.md: gen_ai_server_time_per_output_token_seconds). Answers 'how fast was a typical request'.", 12),
				{kind: kHeatmap, title: "ITL distribution (heatmap, token-weighted)", unit: "s", w: 12, h: 8,
					desc:    "The distribution of inter-token gaps (docs/measurement.md §2-§4) per time slice: gaps per bucket of tokentap_inter_token_latency_seconds, token-weighted; native histogram where available, classic buckets otherwise.",
					targets: []target{{expr: hmap("tokentap_inter_token_latency_seconds", selT), legend: "{{le}}"}}},
				{title: "TPOT p90 by output class", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "The 90th percentile of TPOT (docs/measurement.md §3) per output class (request classes by output tokens, slo.output_classes; docs/slo.md, metrics: tokentap_time_per_output_token_by_class_seconds).",
					targets: []target{{expr: hq("0.9", "tokentap_time_per_output_token_by_class_seconds", selT, "output_class"), legend: "{{output_class}}"}}},
				{title: "Largest gap per request, p50/p99", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "max_itl: each streamed request's largest gap between token-bearing events, request-weighted (docs/measurement.md §6, tokentap_max_inter_token_gap_seconds). A mean hides a pause; this does not.",
					targets: quantiles("tokentap_max_inter_token_gap_seconds", selT, "", "", "0.5", "0.99")},
				{title: "Stalls/s and mean stalls per request", unit: "short", w: 12, h: 8, min: fp(0), rightAxis: "per request$", rightUnit: "short",
					desc: "Stalls are gaps between token events longer than slo.stall_threshold (default 1 s; docs/measurement.md §6). Left: stalls per second (rate of the sum of tokentap_stalls_per_request); right: mean stalls per streamed request (sum / count).",
					targets: []target{
						{expr: hsum("tokentap_stalls_per_request", selT, ""), legend: "stalls/s"},
						{expr: "(" + hsum("tokentap_stalls_per_request", selT, "") + ") / (" + hcount("tokentap_stalls_per_request", selT, "") + ")", legend: "stalls per request"},
					}},
			}},
			whyRow(),
			{title: "End to end and outcomes", panels: []panel{
				latencyPanel("E2E p50/p90/p95/p99 (request-weighted)", "gen_ai_server_request_duration_seconds",
					"End-to-end latency = t_terminal − t_arrive for every request, any outcome; t_terminal is the end marker, a clean EOF, an error event, a cancel or a timeout, so this is not the last token's latency (docs/measurement.md §3, docs/metrics.md: gen_ai_server_request_duration_seconds).", 12),
				{title: "Outcomes, requests/s", unit: "reqps", w: 12, h: 8, min: fp(0), stack: true,
					desc:    "Requests per second by outcome: success, error, rejected (429/503 admission refusals), cancelled (the client left), timeout, no_answer (a status that carries no answer: a redirect, a 204, an empty 200); every request gets exactly one (docs/measurement.md §3, docs/metrics.md: tokentap_requests_total, outcomes).",
					targets: []target{{expr: `sum by (outcome) (rate(tokentap_requests_total{` + selT + `}[` + ri + `]))`, legend: "{{outcome}}"}}},
				{title: "Failed requests by error type, requests/s", unit: "reqps", w: 12, h: 8, min: fp(0), stack: true,
					desc:    "Requests per second that did not succeed, by the bounded error_type (http_4xx, http_5xx, rejected, stream_error, malformed_stream, upstream_reset, upstream_unreachable, upstream_tls, incomplete_stream, shutdown, internal, timeout, cancelled, and the no_answer types http_3xx, http_no_answer, empty_body, html_body, empty_answer), from the observation count of gen_ai_server_request_duration_seconds (docs/measurement.md §3, error types).",
					targets: []target{{expr: hcount("gen_ai_server_request_duration_seconds", selT+`, error_type!=""`, "error_type"), legend: "{{error_type}}"}}},
				{title: "Throughput: requests/s and output tokens/s", unit: "reqps", w: 12, h: 8, min: fp(0), rightAxis: "tokens/s$", rightUnit: "short",
					desc: "Requests that reached their outcome per second (tokentap_requests_total) and output tokens per second from the best token source (gen_ai_client_inference_usage_output_tokens_total; docs/measurement.md §2, docs/metrics.md). Throughput alone hides the tail: read it with the percentiles above.",
					targets: []target{
						{expr: `sum(rate(tokentap_requests_total{` + selT + `}[` + ri + `]))`, legend: "requests/s"},
						{expr: `sum(rate(gen_ai_client_inference_usage_output_tokens_total{` + selT + `}[` + ri + `]))`, legend: "output tokens/s"},
					}},
			}},
		},
	}
}

// whyRow is why first tokens were slow and streams stalled (docs/
// measurement.md §6b): the share of each cause over time, per model, and
// over every selected sidecar.
func whyRow() row {
	share := func(what, by string) string {
		s := selT + `, what="` + what + `"`
		den := "sum"
		if rest := strings.TrimSuffix(by, ", cause"); rest != by {
			den = "sum by (" + rest + ")"
		}
		return `sum by (` + by + `) (rate(tokentap_slow_total{` + s + `}[` + ri + `])) / ignoring (cause) group_left ` + den +
			` (rate(tokentap_slow_total{` + s + `}[` + ri + `]))`
	}
	const def = " Causes (docs/measurement.md §6b, why slow): connection (the upstream's set-up phases), queue (the engine's waiting requests, or the requests in flight at engine.max_running), long_prefill_ahead (an earlier long prompt still in prefill), preemption (the engine's preemption counter advanced across the stall), prefill_interference (a long prompt's prefill overlapped the stall), unexplained (none of these). Each slow event counts once, under the cause that explains most of it (tokentap_slow_total; docs/metrics.md)."
	return row{title: "Why slow", panels: []panel{
		{title: "Slow first tokens by cause (share)", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1), stack: true,
			desc:    "Of the first tokens over their SLO's ttft threshold (or slo.slow_ttft), the share put down to each cause, over the selected sidecars, models and traffic." + def,
			targets: []target{{expr: share("ttft", "cause"), legend: "{{cause}}"}}},
		{title: "Stalls by cause (share)", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1), stack: true,
			desc:    "Of the gaps between token events over slo.stall_threshold, the share put down to each cause, over the selected sidecars, models and traffic." + def,
			targets: []target{{expr: share("stall", "cause"), legend: "{{cause}}"}}},
		{title: "Slow first tokens by cause, per model (share)", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1),
			desc:    "The share of each cause among each model's slow first tokens (gen_ai_request_model)." + def,
			targets: []target{{expr: share("ttft", "gen_ai_request_model, cause"), legend: "{{gen_ai_request_model}} {{cause}}"}}},
		{title: "Stalls by cause, per model (share)", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1),
			desc:    "The share of each cause among each model's stalls (gen_ai_request_model)." + def,
			targets: []target{{expr: share("stall", "gen_ai_request_model, cause"), legend: "{{gen_ai_request_model}} {{cause}}"}}},
		{title: "Slow events/s by cause", unit: "short", w: 24, h: 8, min: fp(0), stack: true,
			desc:    "Slow first tokens and stalls per second by cause: the counts behind the shares, so that a share of few events reads as such." + def,
			targets: []target{{expr: `sum by (what, cause) (rate(tokentap_slow_total{` + selT + `}[` + ri + `]))`, legend: "{{what}} {{cause}}"}}},
	}}
}

// ---------------------------------------------------------------------------
// Energy

const (
	energyRate = `sum(rate(tokentap_gpu_energy_joules_total{` + sel + `}[` + ri + `]))`
	liveTokens = `sum(rate(gen_ai_client_inference_usage_output_tokens_total{` + sel + `, traffic="live"}[` + ri + `]))`
)

func energyBoard() board {
	return board{
		file: "tokentap-energy.json", uid: "tokentap-energy", title: "tokentap / Energy", tags: tags,
		desc: "GPU energy from NVML, joules per output token (total and above the idle baseline), power per GPU and the decode speed of light (docs/measurement.md §8, docs/energy.md). Empty when energy is off: see the state panel.",
		vars: []string{"model"},
		rows: []row{
			{title: "Joules per token", panels: []panel{
				{kind: kStat, title: "Energy measurement on", unit: "bool_on_off", w: 6, h: 6, min: fp(0), max: fp(1),
					desc:    "tokentap_energy_enabled per sidecar: 1 when NVML energy is measured, 0 when it is off; tokentap_energy_info{state,reason} says why (nvml_unavailable, no_cgo, no_devices, disabled) (docs/energy.md).",
					targets: []target{{expr: `tokentap_energy_enabled{` + sel + `}`, legend: "{{instance}}"}}},
				{title: "J per output token: total and dynamic", unit: "joule", w: 18, h: 8, min: fp(0),
					desc: "Per window (docs/measurement.md §8): total J/token = rate of tokentap_gpu_energy_joules_total / rate of live output tokens; dynamic J/token takes the idle baseline (tokentap_gpu_idle_power_watts) out of the power first. " +
						"Energy is per GPU, not per model, so the model selector does not apply. With a trickle of tokens the total is mostly idle power: read the dynamic figure and the idle share with it (docs/energy.md).",
					targets: []target{
						{expr: energyRate + ` / ` + liveTokens, legend: "total J/token"},
						{expr: `(` + energyRate + ` - sum(tokentap_gpu_idle_power_watts{` + sel + `})) / ` + liveTokens, legend: "dynamic J/token"},
					}},
				{title: "Per-request J/token, p50 and p90 by model", unit: "joule", w: 12, h: 8, min: fp(0),
					desc: "The distribution of each request's attributed energy divided by its output tokens (tokentap_request_energy_per_token_joules, request-weighted): each interval's energy is shared among the requests in flight by their tokens, prefill weighted 0.1 per prompt token (docs/measurement.md §8, attribution). " +
						"A request's joules (energy_j) are in its record, not a metric.",
					targets: append(quantiles("tokentap_request_energy_per_token_joules", selM, "gen_ai_request_model", "{{gen_ai_request_model}} ", "0.5"),
						quantiles("tokentap_request_energy_per_token_joules", selM, "gen_ai_request_model", "{{gen_ai_request_model}} ", "0.9")...)},
				{kind: kHeatmap, title: "Per-request J/token distribution (heatmap)", unit: "joule", w: 12, h: 8,
					desc:    "Requests per bucket of per-request J/token (tokentap_request_energy_per_token_joules; docs/measurement.md §8), native histogram where available, classic buckets otherwise.",
					targets: []target{{expr: hmap("tokentap_request_energy_per_token_joules", selM), legend: "{{le}}"}}},
			}},
			{title: "Power", panels: []panel{
				{title: "Power per GPU", unit: "watt", w: 12, h: 8, min: fp(0),
					desc: "Per GPU: NVML's power reading (tokentap_gpu_power_watts: the instant reading where the driver has it, else NVML's average) and the mean power from the energy counter (rate of tokentap_gpu_energy_joules_total) (docs/energy.md, what is measured; docs/measurement.md §8).",
					targets: []target{
						{expr: `tokentap_gpu_power_watts{` + sel + `}`, legend: "{{instance}} GPU {{gpu}} reading"},
						{expr: `sum by (instance, gpu) (rate(tokentap_gpu_energy_joules_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} GPU {{gpu}} from energy"},
					}},
				{title: "Idle baseline and power in use", unit: "watt", w: 12, h: 8, min: fp(0),
					desc: "The idle baseline of each sidecar's selected GPUs (tokentap_gpu_idle_power_watts: configured, or learned from intervals with no request in flight), against their total mean power (docs/measurement.md §8, idle baseline).",
					targets: []target{
						{expr: `sum by (instance) (tokentap_gpu_idle_power_watts{` + sel + `})`, legend: "{{instance}} idle baseline"},
						{expr: `sum by (instance) (rate(tokentap_gpu_energy_joules_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} total"},
					}},
				{title: "Where the joules went", unit: "watt", w: 12, h: 8, min: fp(0), stack: true,
					desc: "Every joule is counted once as idle (no request in flight), attributed (shared among requests by tokens) or unattributed (requests in flight but no token: a long prefill, a stall) (docs/measurement.md §8; tokentap_energy_*_joules_total). Stacked, as watts.",
					targets: []target{
						{expr: `sum(rate(tokentap_energy_attributed_joules_total{` + sel + `}[` + ri + `]))`, legend: "attributed"},
						{expr: `sum(rate(tokentap_energy_unattributed_joules_total{` + sel + `}[` + ri + `]))`, legend: "unattributed"},
						{expr: `sum(rate(tokentap_energy_idle_joules_total{` + sel + `}[` + ri + `]))`, legend: "idle"},
					}},
				{title: "Idle share of the energy", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1),
					desc:    "Idle joules / all joules (tokentap_energy_idle_joules_total / tokentap_gpu_energy_joules_total). A high share means J/token mostly measures idling (docs/energy.md, PromQL for J/token panels).",
					targets: []target{{expr: `sum(rate(tokentap_energy_idle_joules_total{` + sel + `}[` + ri + `])) / ` + energyRate, legend: "idle share"}}},
				{title: "GPU utilisation and temperature", unit: "percentunit", w: 12, h: 8, min: fp(0), rightAxis: "°C$", rightUnit: "celsius",
					desc: "NVML's GPU utilisation (tokentap_gpu_utilization_ratio) and temperature (tokentap_gpu_temperature_celsius), per GPU (docs/energy.md, metrics).",
					targets: []target{
						{expr: `tokentap_gpu_utilization_ratio{` + sel + `}`, legend: "{{instance}} GPU {{gpu}} utilisation"},
						{expr: `tokentap_gpu_temperature_celsius{` + sel + `}`, legend: "{{instance}} GPU {{gpu}} °C"},
					}},
				{title: "Sampling health", unit: "short", w: 12, h: 8, min: fp(0),
					desc: "How late the last NVML sample was (tokentap_energy_sampling_lag_seconds), and per-second rates of failed GPU reads (tokentap_gpu_read_errors_total) and counter wraps or resets (tokentap_gpu_energy_counter_resets_total) (docs/energy.md, what is measured).",
					targets: []target{
						{expr: `max by (instance) (tokentap_energy_sampling_lag_seconds{` + sel + `})`, legend: "{{instance}} sampling lag (s)"},
						{expr: `sum by (instance) (rate(tokentap_gpu_read_errors_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} read errors/s"},
						{expr: `sum by (instance) (rate(tokentap_gpu_energy_counter_resets_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} counter resets/s"},
					}},
			}},
			{title: "Decode speed of light", panels: []panel{
				{title: "Decode speed-of-light ratio, p50 and p90 by model", unit: "percentunit", w: 12, h: 8, min: fp(0),
					desc: "Per request: the measured decode rate 1/TPOT divided by the memory-bandwidth ceiling at its mean decode context, bandwidth / (weights + context × KV bytes per token) (docs/measurement.md §8, decode speed of light; tokentap_decode_speed_of_light_ratio). Needs energy on and the model's sizes in config; batching lowers it while raising throughput, so read it at low load.",
					targets: append(quantiles("tokentap_decode_speed_of_light_ratio", selM, "gen_ai_request_model", "{{gen_ai_request_model}} ", "0.5"),
						quantiles("tokentap_decode_speed_of_light_ratio", selM, "gen_ai_request_model", "{{gen_ai_request_model}} ", "0.9")...)},
				{title: "Decode ceiling at zero context", unit: "short", w: 12, h: 8, min: fp(0),
					desc:    "The single-request decode ceiling in tokens/s at zero context, per model: peak memory bandwidth of the selected GPUs / weight bytes (tokentap_decode_ceiling_tokens_per_second; docs/measurement.md §8). The sidecars' peak bandwidth (tokentap_gpu_peak_memory_bandwidth_bytes_per_second) is not plotted.",
					targets: []target{{expr: `max by (gen_ai_request_model) (tokentap_decode_ceiling_tokens_per_second{` + selM + `})`, legend: "{{gen_ai_request_model}} tokens/s"}}},
			}},
		},
	}
}

// ---------------------------------------------------------------------------
// Canary

func canaryBoard() board {
	return board{
		file: "tokentap-canary.json", uid: "tokentap-canary", title: "tokentap / Canary", tags: tags,
		desc: "The open-loop canary probes: a fixed request at a fixed schedule, measured by the same code as live traffic (docs/measurement.md §7, docs/probe.md).",
		vars: []string{"probe"},
		rows: []row{
			{title: "Success", panels: []panel{
				{kind: kStat, title: "Last probe succeeded", unit: "bool_yes_no", w: 6, h: 6, min: fp(0), max: fp(1),
					desc:    "probe_success: 1 if the last probe succeeded (outcome success and every quality check passed), else 0, per probe and sidecar (docs/probe.md, metrics; docs/measurement.md §7).",
					targets: []target{{expr: `probe_success{` + selProbe + `}`, legend: "{{probe}} {{instance}}"}}},
				{kind: kStat, title: "Consecutive failures", unit: "none", w: 6, h: 6, min: fp(0), thresholds: []float64{1, 3},
					desc:    "Failed or not-sent probes in a row (tokentap_probe_consecutive_failures). With probes.ready_after_failures K, /readyz turns unready at K (docs/probe.md, readiness).",
					targets: []target{{expr: `max by (probe) (tokentap_probe_consecutive_failures{` + selProbe + `})`, legend: "{{probe}}"}}},
				{title: "Success ratio", unit: "percentunit", w: 12, h: 6, min: fp(0), max: fp(1),
					desc:    "Successful probes / all probe results (success, failed, not_sent) per probe, from tokentap_probe_results_total (docs/measurement.md §7). A fast wrong answer is a failure.",
					targets: []target{{expr: `sum by (probe) (rate(tokentap_probe_results_total{` + selProbe + `, result="success"}[` + ri + `])) / sum by (probe) (rate(tokentap_probe_results_total{` + selProbe + `}[` + ri + `]))`, legend: "{{probe}}"}}},
				{title: "Results per second", unit: "short", w: 12, h: 8, min: fp(0), stack: true,
					desc:    "Probe results by probe and result: success, failed, not_sent (tokentap_probe_results_total). Scheduled = success + failed + not_sent + in flight (docs/probe.md; docs/measurement.md §7).",
					targets: []target{{expr: `sum by (probe, result) (rate(tokentap_probe_results_total{` + selProbe + `}[` + ri + `]))`, legend: "{{probe}} {{result}}"}}},
				{title: "Quality failures per second, by check", unit: "short", w: 12, h: 8, min: fp(0), stack: true,
					desc:    "Probes whose answer failed a quality check, by check: contains, regex, exact, json_schema, finish_reason, output_tokens (tokentap_probe_quality_failures_total; docs/measurement.md §7, docs/probe.md).",
					targets: []target{{expr: `sum by (probe, check) (rate(tokentap_probe_quality_failures_total{` + selProbe + `}[` + ri + `]))`, legend: "{{probe}} {{check}}"}}},
			}},
			{title: "Latency and schedule", panels: []panel{
				{title: "Canary TTFT and E2E, p50/p95", unit: "s", w: 12, h: 8, min: fp(0),
					desc: "TTFT and E2E (docs/measurement.md §3) of the canary's requests (traffic=\"canary\"), per probe: the calibration line against which live latency is read (docs/probe.md, same measurement as live traffic).",
					targets: append(quantiles("gen_ai_server_time_to_first_token_seconds", selCanary, "probe", "{{probe}} TTFT ", "0.5", "0.95"),
						quantiles("gen_ai_server_request_duration_seconds", selCanary, "probe", "{{probe}} E2E ", "0.5", "0.95")...)},
				{title: "Last probe's duration", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "probe_duration_seconds: E2E of the last probe sent, per probe and sidecar (docs/probe.md, metrics).",
					targets: []target{{expr: `probe_duration_seconds{` + selProbe + `}`, legend: "{{probe}} {{instance}}"}}},
				{title: "Schedule lag p50/p99", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "sent − scheduled of each probe (tokentap_probe_schedule_lag_seconds): the probe is open-loop, so a delayed scheduler sends late rather than skipping, and the lateness shows here (docs/measurement.md §7).",
					targets: quantiles("tokentap_probe_schedule_lag_seconds", selProbe, "probe", "{{probe}} ", "0.5", "0.99")},
				{title: "Not sent, per second", unit: "short", w: 12, h: 8, min: fp(0),
					desc:    "Scheduled instants that found max_concurrent probes still in flight (concurrency_cap) or came at shutdown: recorded as not_sent, never dropped (tokentap_probe_not_sent_total; docs/measurement.md §7).",
					targets: []target{{expr: `sum by (probe, reason) (rate(tokentap_probe_not_sent_total{` + selProbe + `}[` + ri + `]))`, legend: "{{probe}} {{reason}}"}}},
			}},
		},
	}
}

// ---------------------------------------------------------------------------
// Engine

func engineBoard() board {
	return board{
		file: "tokentap-engine.json", uid: "tokentap-engine", title: "tokentap / Engine", tags: tags,
		desc: "The engine's own signals as the sidecar scrapes them from the engine's metrics endpoint (running and waiting requests, KV cache, preemptions), beside what the sidecar measures (in-flight requests, stalls, TTFT) (docs/engine-signals.md).",
		vars: []string{"model"},
		rows: []row{
			{title: "Scheduler", panels: []panel{
				{kind: kStat, title: "Engine metrics scraped", unit: "bool_yes_no", w: 6, h: 6, min: fp(0), max: fp(1),
					desc:    "tokentap_engine_up per sidecar and engine: 1 if the sidecar's last scrape of the engine's metrics endpoint succeeded (docs/engine-signals.md). The panels below are empty while it is 0.",
					targets: []target{{expr: `tokentap_engine_up{` + sel + `}`, legend: "{{instance}} {{engine}}"}}},
				{title: "TTFT p95: the engine's own histogram vs what clients felt", unit: "s", w: 18, h: 6, min: fp(0),
					desc: "The engine's TTFT histogram as it reports it (tokentap_engine_time_to_first_token_seconds, re-exported with the engine's buckets; docs/engine-signals.md) against the sidecar's TTFT of live traffic (t_first_token − t_arrive at the sidecar; docs/measurement.md §3). The gap is what the engine's own number leaves out (its definition of the first token, the HTTP path).",
					targets: []target{
						{expr: hq("0.95", "tokentap_engine_time_to_first_token_seconds", sel, "engine"), legend: "{{engine}} engine-reported p95"},
						{expr: hq("0.95", "gen_ai_server_time_to_first_token_seconds", selLive, ""), legend: "sidecar-measured p95 (live)"},
					}},
				{title: "Running and waiting requests (engine) vs in flight (sidecar)", unit: "short", w: 12, h: 8, min: fp(0),
					desc: "The engine's running and waiting (queued) requests (tokentap_engine_requests_running, tokentap_engine_requests_waiting, summed over data-parallel engines; docs/engine-signals.md), and the requests in flight through the sidecar (tokentap_requests_in_flight: arrived, no outcome yet). Waiting requests are queueing time that TTFT pays (docs/measurement.md §3).",
					targets: []target{
						{expr: `sum by (instance) (tokentap_engine_requests_running{` + sel + `})`, legend: "{{instance}} running (engine)"},
						{expr: `sum by (instance) (tokentap_engine_requests_waiting{` + sel + `})`, legend: "{{instance}} waiting (engine)"},
						{expr: `sum by (instance) (tokentap_requests_in_flight{` + sel + `})`, legend: "{{instance}} in flight (sidecar)"},
					}},
				{title: "KV cache usage", unit: "percentunit", w: 12, h: 8, min: fp(0), max: fp(1), thresholds: []float64{0.9, 0.98},
					desc:    "The engine's KV cache usage, 0 to 1 (tokentap_engine_kv_cache_usage_ratio, the highest of its data-parallel engines; docs/engine-signals.md). Near 1 the engine preempts sequences, which the client feels as stalls.",
					targets: []target{{expr: `max by (instance) (tokentap_engine_kv_cache_usage_ratio{` + sel + `})`, legend: "{{instance}}"}}},
				{title: "Preemptions with stalls overlaid", unit: "short", w: 24, h: 9, min: fp(0), rightAxis: "stalls/s$", rightUnit: "short",
					desc: "Left: engine preemptions per second (rate of tokentap_engine_preemptions_total, by engine; docs/engine-signals.md). Right, as bars: stalls per second seen by the clients (gaps between token events above slo.stall_threshold, from tokentap_stalls_per_request; docs/measurement.md §6). Preemption bursts followed by stalls are the engine evicting sequences.",
					targets: []target{
						{expr: `sum by (engine) (rate(tokentap_engine_preemptions_total{` + sel + `}[` + ri + `]))`, legend: "{{engine}} preemptions/s"},
						{expr: hsum("tokentap_stalls_per_request", selM, ""), legend: "stalls/s"},
					}},
			}},
			{title: "Prefix cache", panels: []panel{
				{title: "Prefix reuse: what the workload allows vs what the engine's cache serves", unit: "percentunit", w: 16, h: 9, min: fp(0), max: fp(1),
					desc: "The workload's reuse: the share of the live prompts' blocks whose whole prefix the sidecar saw within reuse.window before (tokentap_prefix_blocks_total, outcome reused over all), the most any prefix cache could serve; " +
						"an ideal LRU cache's share by size in blocks (tokentap_prefix_ideal_cache_blocks_total, hit over all), the most a cache of that size could; " +
						"and the engine's own prefix-cache hit ratio (tokentap_engine_prefix_cache_hit_ratio: vLLM's hits over queries, SGLang's cache_hit_rate, TensorRT-LLM's kv_cache_hit_rate; docs/engine-signals.md). " +
						"The engine well below the ideal cache of its size: a cache too small, or evictions; near it: the workload allows no more (docs/capture.md, live reuse; docs/measurement.md §8b).",
					targets: []target{
						{expr: `sum by (instance) (rate(tokentap_prefix_blocks_total{outcome="reused", ` + sel + `}[` + ri + `])) / sum by (instance) (rate(tokentap_prefix_blocks_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} workload reuse (window)"},
						{expr: `sum by (instance, cache_blocks) (rate(tokentap_prefix_ideal_cache_blocks_total{outcome="hit", ` + sel + `}[` + ri + `])) / sum by (instance, cache_blocks) (rate(tokentap_prefix_ideal_cache_blocks_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} ideal LRU cache of {{cache_blocks}} blocks"},
						{expr: `max by (instance, engine) (tokentap_engine_prefix_cache_hit_ratio{` + sel + `})`, legend: "{{instance}} {{engine}} prefix-cache hit ratio (engine)"},
					}},
				{title: "Reuse window: ids held and forgotten", unit: "short", w: 8, h: 9, min: fp(0), rightAxis: "forgotten/s$", rightUnit: "short",
					desc: "The block ids the reuse window remembers (tokentap_prefix_window_ids, bounded by reuse.max_ids) and, right, those it forgot per second for that bound before their window ended (tokentap_prefix_ids_forgotten_total): " +
						"reuse they would have shown counts as new, so a steady rate means the reuse above is understated (docs/metrics.md, prefix reuse; docs/capture.md, live reuse).",
					targets: []target{
						{expr: `sum by (instance) (tokentap_prefix_window_ids{` + sel + `})`, legend: "{{instance}} ids held"},
						{expr: `sum by (instance) (rate(tokentap_prefix_ids_forgotten_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} forgotten/s"},
					}},
			}},
		},
	}
}

// ---------------------------------------------------------------------------
// Sidecar health

// own keeps only process_* series of scrape targets that are tokentap
// sidecars (a pod's engine exports process_* too).
const own = ` and on (job, instance) tokentap_connections_max{` + sel + `}`

func sidecarBoard() board {
	return board{
		file: "tokentap-sidecar.json", uid: "tokentap-sidecar", title: "tokentap / Sidecar health", tags: tags,
		desc: "The sidecar's own cost and failures: forwarding delay, tap failures, records file, connections, CPU and memory (docs/metrics.md, docs/design.md).",
		rows: []row{
			{title: "Data path", panels: []panel{
				{title: "Forwarding delay p50/p99/p99.9", unit: "s", w: 12, h: 8, min: fp(0),
					desc:    "The sidecar's own overhead: from reading a chunk from the engine to having written and flushed it to the client, one observation per read that completed an event (tokentap_forward_delay_seconds; docs/measurement.md §1, docs/metrics.md).",
					targets: quantiles("tokentap_forward_delay_seconds", sel, "", "", "0.5", "0.99", "0.999")},
				{title: "Tap failures per second, by reason", unit: "short", w: 12, h: 8, min: fp(0),
					desc:    "Responses on which the tap gave up measuring and fell back to plain forwarding (fail open: panic, content_encoding, single_lf_framing), and single events: over the tap's bound, forwarded unread while the rest of their response was measured (event_too_large), or too long for strip mode to decide, forwarded unstripped while stripping went on (strip_overflow) (tokentap_tap_failures_total; docs/metrics.md, docs/design.md fail open). Every byte still reached the client.",
					targets: []target{{expr: `sum by (reason) (rate(tokentap_tap_failures_total{` + sel + `}[` + ri + `]))`, legend: "{{reason}}"}}},
				{title: "Requests in flight", unit: "short", w: 12, h: 8, min: fp(0),
					desc:    "Requests that arrived and have not reached their outcome, by sidecar and traffic (tokentap_requests_in_flight; docs/metrics.md).",
					targets: []target{{expr: `sum by (instance, traffic) (tokentap_requests_in_flight{` + sel + `})`, legend: "{{instance}} {{traffic}}"}}},
				{title: "Upstream ready", unit: "bool_yes_no", w: 12, h: 8, min: fp(0), max: fp(1),
					desc:    "tokentap_upstream_up: 1 if the sidecar's last readiness check of the engine (upstream_health_path) succeeded (docs/metrics.md).",
					targets: []target{{expr: `tokentap_upstream_up{` + sel + `}`, legend: "{{instance}}"}}},
			}},
			{title: "Records file", panels: []panel{
				{title: "Records written, write errors and dropped, per second", unit: "short", w: 24, h: 8, min: fp(0), rightAxis: "(errors|dropped)/s$", rightUnit: "short",
					desc: "The --records JSONL file: records written whole (tokentap_records_written_total), failed writes such as a full disk (tokentap_records_write_errors_total) and records that could not be written (tokentap_records_dropped_total: failed write, full queue, after shutdown) (docs/metrics.md, docs/records-file.md). Only sidecars with a records file export these.",
					targets: []target{
						{expr: `sum by (instance) (rate(tokentap_records_written_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} written/s"},
						{expr: `sum by (instance) (rate(tokentap_records_write_errors_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} write errors/s"},
						{expr: `sum by (instance) (rate(tokentap_records_dropped_total{` + sel + `}[` + ri + `]))`, legend: "{{instance}} dropped/s"},
					}},
			}},
			{title: "Connections and process", panels: []panel{
				{title: "Client connections: open vs limit", unit: "short", w: 12, h: 8, min: fp(0), rightAxis: "rejected/s$", rightUnit: "short",
					desc: "Open client connections (tokentap_connections_open) against the --max-connections limit (tokentap_connections_max), and connections refused with a 503 at the limit (rate of tokentap_connections_rejected_total) (docs/metrics.md).",
					targets: []target{
						{expr: `tokentap_connections_open{` + sel + `}`, legend: "{{instance}} open"},
						{expr: `tokentap_connections_max{` + sel + `}`, legend: "{{instance}} limit"},
						{expr: `rate(tokentap_connections_rejected_total{` + sel + `}[` + ri + `])`, legend: "{{instance}} rejected/s"},
					}},
				{title: "CPU (cores)", unit: "short", w: 12, h: 8, min: fp(0),
					desc:    "CPU seconds per second of each sidecar process (process_cpu_seconds_total from the Go client's process collector; docs/metrics.md), limited to scrape targets that are tokentap sidecars.",
					targets: []target{{expr: `rate(process_cpu_seconds_total{` + sel + `}[` + ri + `])` + own, legend: "{{instance}}"}}},
				{title: "Resident memory", unit: "bytes", w: 12, h: 8, min: fp(0),
					desc:    "Resident set size of each sidecar process (process_resident_memory_bytes; docs/metrics.md), limited to tokentap scrape targets.",
					targets: []target{{expr: `process_resident_memory_bytes{` + sel + `}` + own, legend: "{{instance}}"}}},
				{title: "Open file descriptors vs limit", unit: "short", w: 12, h: 8, min: fp(0),
					desc: "Open descriptors (process_open_fds) and the limit (process_max_fds) of each sidecar; --max-connections defaults to (limit − 128) / 2 (docs/config.md, docs/metrics.md).",
					targets: []target{
						{expr: `process_open_fds{` + sel + `}` + own, legend: "{{instance}} open"},
						{expr: `process_max_fds{` + sel + `}` + own, legend: "{{instance}} limit"},
					}},
			}},
		},
	}
}
