package exporter

import (
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/structure"
)

// Map is the one telemetry mapping: both backends (metrics.go, otlp.go)
// consume it and only translate names (docs/design.md, "One telemetry
// mapping"). Definitions: docs/measurement.md; the exported names:
// docs/metrics.md.

// Label is one attribute of the per-request instruments.
type Label uint8

// Labels of the per-request instruments. Every value is bounded: fixed
// enums, configured names (probes, SLOs, classes), or the bounded model
// and tenant labels.
const (
	LOperation   Label = iota // gen_ai.operation.name: chat, text_completion, other
	LModel                    // bounded gen_ai.request.model
	LTraffic                  // live, canary
	LProbe                    // probe name, "" for live
	LErrorType                // record error types, "" on success
	LOutcome                  // record outcomes
	LModality                 // "text"
	LPromptClass              // configured classes
	LOutputClass              // configured classes
	LSLO                      // configured SLO names
	LThreshold                // slo failure reasons
	LReason                   // excluded reason
	LLoad                     // load bucket labels (configured bounds, +Inf)
	LTarget                   // egress: the intercept allow-list entry (configured)
	LProvider                 // gen_ai.provider.name: the configured one (client.go)
	LTokenType                // gen_ai.token.type: input, output
	LPhase                    // a connection phase: record.UpstreamPhases' names
	LConnReused               // true, false
	LResult                   // a structure check's result: pass, fail, unchecked
	LCheck                    // a structure check that failed (structure.Checks)
	LTenant                   // the bounded tenant label (package tenant)
	LWhat                     // a slow event: ttft, stall (package cause)
	LCause                    // its cause (cause.Pairs)
	numLabels
)

// Labels are the values of every label for one observation.
type Labels [numLabels]string

// promLabel and otelAttr name each label in each backend. gen_ai_* labels
// are the OTel GenAI attribute names as the OTel Prometheus exporter
// would translate them, so the same PromQL works on series from either
// path.
var (
	promLabel = [numLabels]string{"gen_ai_operation_name", "gen_ai_request_model", "traffic", "probe", "error_type", "outcome",
		"gen_ai_token_modality", "prompt_class", "output_class", "slo", "threshold", "reason", "load", "target",
		"gen_ai_provider_name", "gen_ai_token_type", "phase", "conn_reused", "result", "check", "tenant", "what", "cause"}
	otelAttr = [numLabels]string{"gen_ai.operation.name", "gen_ai.request.model", "tokentap.traffic", "tokentap.probe", "error.type",
		"tokentap.outcome", "gen_ai.token.modality", "tokentap.prompt_class", "tokentap.output_class", "tokentap.slo",
		"tokentap.slo.threshold", "tokentap.reason", "tokentap.load", "tokentap.target", "gen_ai.provider.name", "gen_ai.token.type",
		"tokentap.upstream.phase", "tokentap.upstream.conn_reused", "tokentap.structure.result", "tokentap.structure.check",
		"tokentap.tenant", "tokentap.slow.what", "tokentap.slow.cause"}
)

// Instrument is one per-request metric.
type Instrument uint8

// The per-request instruments, in the order Map emits them.
const (
	Requests Instrument = iota
	Duration
	TTFB
	TTFT
	TTFOT
	TPOT
	ITL
	Stalls
	MaxGap
	TTFTByClass
	TPOTByClass
	InputTokens
	OutputTokens
	SLOOffered
	SLOQualified
	SLOQualifiedTokens
	SLOFailures
	SLOExcluded
	Fluidity
	EnergyPerToken
	DecodeSOL
	SLOOfferedByLoad
	SLOQualifiedByLoad
	SLOQualifiedTokensByLoad
	TargetRequests
	TargetDuration
	TargetTTFT
	TargetTPOT
	ClientDuration // the GenAI client metrics of egress requests (client.go)
	ClientTTFC
	ClientTPOC
	ClientTokenUsage
	UpstreamPhase // the connection phases (docs/measurement.md §1)
	StructureChecked
	StructureFailures
	StructureUnchecked
	SLOFastInvalid
	SLOOfferedByTenant // the SLO counters again by tenant, when tenants are on
	SLOQualifiedByTenant
	SLOQualifiedTokensByTenant
	TenantOutputTokens
	Slow // the slow events by cause (package cause)
	numInstruments
)

// Spec describes an instrument in both backends.
type Spec struct {
	Prom, OTel string // names
	Unit       string // OTel unit
	Help       string
	Counter    bool      // else a histogram
	Buckets    []float64 // histograms: the same boundaries in both backends
	Labels     []Label
	Exemplar   bool // Prometheus attaches the request's trace id
}

// Bucket boundaries (seconds). Each is a superset of the OTel GenAI
// advisory boundaries for the matching metric, refined to single
// milliseconds at the low end so that SLO thresholds such as 5 ms ITL or
// 200 ms TTFT fall on a bucket edge.
var (
	ttftBuckets = []float64{
		0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,
		0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.08,
		0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.25, 1.5, 2,
		2.5, 3, 4, 5, 7.5, 10, 15, 20, 30, 45, 60, 120,
	}
	itlBuckets = []float64{
		0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009,
		0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06,
		0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10,
	}
	e2eBuckets = []float64{
		0.005, 0.01, 0.02, 0.025, 0.04, 0.05, 0.08, 0.1, 0.16, 0.25, 0.32, 0.5,
		0.64, 1, 1.28, 2, 2.56, 5, 5.12, 10, 10.24, 20, 20.48, 30, 40.96, 60,
		81.92, 120, 300, 600,
	}
	forwardBuckets = []float64{
		1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3,
		0.01, 0.05, 0.1, 1,
	}
	stallBuckets     = []float64{0, 1, 2, 3, 5, 10, 20, 50}
	gapBuckets       = []float64{0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30}
	classTTFTBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60}
	classTPOTBuckets = []float64{0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1}
	fluidityBuckets  = []float64{0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 0.995, 1}
	energyBuckets    = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100}
	solBuckets       = []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.2}
	// phaseBuckets are ttftBuckets below a millisecond too: a loopback
	// connect or a kept-alive connection's wait is tens of microseconds.
	phaseBuckets = append([]float64{0.0001, 0.00025, 0.0005}, ttftBuckets...)
)

var (
	base      = []Label{LOperation, LModel, LTraffic, LProbe}
	classes   = []Label{LModel, LTraffic, LProbe, LPromptClass, LOutputClass}
	withExtra = func(extra ...Label) []Label { return append(append([]Label{}, base...), extra...) }
)

var specs = [numInstruments]Spec{
	Requests: {Prom: "tokentap_requests_total", OTel: "tokentap.requests", Unit: "{request}", Counter: true, Labels: withExtra(LOutcome),
		Help: "Finished requests by outcome (success, error, rejected, cancelled, timeout, no_answer: a status that carries no answer, such as a redirect). gen_ai_operation_name=\"other\" counts routes passed through untouched."},
	Duration: {Prom: "gen_ai_server_request_duration_seconds", OTel: "gen_ai.server.request.duration", Unit: "s", Buckets: e2eBuckets, Labels: withExtra(LErrorType), Exemplar: true,
		Help: "End-to-end latency: request arrival to the terminal outcome (end marker, EOF, error, cancel or timeout), for every request."},
	TTFB: {Prom: "tokentap_time_to_first_byte_seconds", OTel: "tokentap.time_to_first_byte", Unit: "s", Buckets: ttftBuckets, Labels: base,
		Help: "Time from request arrival to the first response body byte read from the upstream."},
	TTFT: {Prom: "gen_ai_server_time_to_first_token_seconds", OTel: "gen_ai.server.time_to_first_token", Unit: "s", Buckets: ttftBuckets, Labels: base, Exemplar: true,
		Help: "Time from request arrival at the sidecar to the first event carrying generated output (content, reasoning or tool-call arguments). One observation per streamed request that produced a token."},
	TTFOT: {Prom: "tokentap_time_to_first_output_token_seconds", OTel: "tokentap.time_to_first_output_token", Unit: "s", Buckets: ttftBuckets, Labels: base, Exemplar: true,
		Help: "Time from request arrival to the first event carrying user-visible content or tool-call arguments (reasoning excluded)."},
	TPOT: {Prom: "gen_ai_server_time_per_output_token_seconds", OTel: "gen_ai.server.time_per_output_token", Unit: "s", Buckets: itlBuckets, Labels: base, Exemplar: true,
		Help: "Request-weighted time per output token: (last token event - first token event) / (output tokens - 1), one observation per request with at least 2 output tokens."},
	ITL: {Prom: "tokentap_inter_token_latency_seconds", OTel: "tokentap.inter_token_latency", Unit: "s", Buckets: itlBuckets, Labels: base,
		Help: "Token-weighted inter-token gap: one observation per gap between consecutive token-bearing events (an event carrying k tokens is still one gap)."},
	Stalls: {Prom: "tokentap_stalls_per_request", OTel: "tokentap.stalls_per_request", Unit: "{stall}", Buckets: stallBuckets, Labels: base,
		Help: "Per-request count of gaps between token events above the stall threshold; streamed requests with tokens."},
	MaxGap: {Prom: "tokentap_max_inter_token_gap_seconds", OTel: "tokentap.max_inter_token_gap", Unit: "s", Buckets: gapBuckets, Labels: base,
		Help: "Per-request largest gap between consecutive token events (request-weighted); streamed requests with at least 2 token events."},
	TTFTByClass: {Prom: "tokentap_time_to_first_token_by_class_seconds", OTel: "tokentap.time_to_first_token_by_class", Unit: "s", Buckets: classTTFTBuckets, Labels: classes,
		Help: "TTFT by request class (prompt and output length classes, see docs/slo.md): prefill cost per class."},
	TPOTByClass: {Prom: "tokentap_time_per_output_token_by_class_seconds", OTel: "tokentap.time_per_output_token_by_class", Unit: "s", Buckets: classTPOTBuckets, Labels: classes,
		Help: "TPOT by request class."},
	InputTokens: {Prom: "gen_ai_client_inference_usage_input_tokens_total", OTel: "gen_ai.client.inference.usage.input_tokens", Unit: "{token}", Counter: true, Labels: withExtra(LModality),
		Help: "Input (prompt) tokens reported by the engine's usage numbers, summed over finished requests."},
	OutputTokens: {Prom: "gen_ai_client_inference_usage_output_tokens_total", OTel: "gen_ai.client.inference.usage.output_tokens", Unit: "{token}", Counter: true, Labels: withExtra(LModality),
		Help: "Output tokens of finished requests, from the best source available (the record's token_source says which; docs/measurement.md §2)."},
	SLOOffered: {Prom: "tokentap_slo_requests_total", OTel: "tokentap.slo.requests", Unit: "{request}", Counter: true, Labels: []Label{LSLO},
		Help: "Requests offered to each SLO: every request in its scope that arrived, errors, rejections, timeouts and (unless the SLO excludes them) cancellations included. The attainment denominator."},
	SLOQualified: {Prom: "tokentap_slo_qualified_requests_total", OTel: "tokentap.slo.qualified_requests", Unit: "{request}", Counter: true, Labels: []Label{LSLO},
		Help: "Requests that qualified: outcome success and every applicable threshold met. The attainment numerator."},
	SLOQualifiedTokens: {Prom: "tokentap_slo_qualified_output_tokens_total", OTel: "tokentap.slo.qualified_output_tokens", Unit: "{token}", Counter: true, Labels: []Label{LSLO},
		Help: "Output tokens of qualified requests: rate() of it is token goodput."},
	SLOFailures: {Prom: "tokentap_slo_failures_total", OTel: "tokentap.slo.failures", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LThreshold},
		Help: "Offered requests that did not qualify, by reason: each failed threshold (ttft, ttfot, tpot, e2e, max_itl, fluidity, output_tokens), the outcome (error, rejected, timeout, cancelled, no_answer), or under structure: required each failed structure check (tool_args_invalid_json, tool_args_schema, unknown_tool, output_invalid_json, output_schema, truncated_json, too_large). A request failing two counts under both."},
	SLOExcluded: {Prom: "tokentap_slo_excluded_total", OTel: "tokentap.slo.excluded", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LReason},
		Help: "Requests in scope left out of the denominator by the SLO's declared options (reason=cancelled when count_cancelled is false)."},
	Fluidity: {Prom: "tokentap_fluidity_ratio", OTel: "tokentap.fluidity", Unit: "1", Buckets: fluidityBuckets, Labels: []Label{LSLO},
		Help: "Per-request deadline-based fluidity score (docs/measurement.md §6) under each SLO's schedule; streamed requests with tokens, in scope."},
	EnergyPerToken: {Prom: "tokentap_request_energy_per_token_joules", OTel: "tokentap.request.energy_per_token", Unit: "J", Buckets: energyBuckets, Labels: []Label{LModel, LPromptClass, LOutputClass},
		Help: "Per-request total energy attributed to the request divided by its output tokens."},
	DecodeSOL: {Prom: "tokentap_decode_speed_of_light_ratio", OTel: "tokentap.decode_speed_of_light", Unit: "1", Buckets: solBuckets, Labels: []Label{LModel},
		Help: "Per-request measured decode rate as a fraction of the memory-bandwidth ceiling for its model and context."},
	// The live knee (docs/cost.md): the SLO counters again, by the load
	// bucket the request ran under.
	SLOOfferedByLoad: {Prom: "tokentap_slo_requests_by_load_total", OTel: "tokentap.slo.requests_by_load", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LLoad},
		Help: "Requests offered to each SLO by the load they ran under: load is the time-weighted mean number of requests in flight through the sidecar during the request's life, itself included; the label is the upper bound of its bucket (loads in (previous bound, bound])."},
	SLOQualifiedByLoad: {Prom: "tokentap_slo_qualified_requests_by_load_total", OTel: "tokentap.slo.qualified_requests_by_load", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LLoad},
		Help: "Requests that qualified for each SLO by the load they ran under (see tokentap_slo_requests_by_load_total)."},
	SLOQualifiedTokensByLoad: {Prom: "tokentap_slo_qualified_output_tokens_by_load_total", OTel: "tokentap.slo.qualified_output_tokens_by_load", Unit: "{token}", Counter: true, Labels: []Label{LSLO, LLoad},
		Help: "Output tokens of qualified requests by the load they ran under: rate() of it is token goodput per load bucket."},
	// Egress (docs/egress.md): a hosted API's requests again, by the
	// intercept allow-list entry they matched, so that one sidecar's
	// targets can be told apart. Bounded by the allow-list.
	TargetRequests: {Prom: "tokentap_target_requests_total", OTel: "tokentap.target.requests", Unit: "{request}", Counter: true,
		Labels: []Label{LTarget, LOperation, LModel, LTraffic, LOutcome, LErrorType},
		Help:   "Egress requests to a hosted API by target (the intercept allow-list entry the host matched) and outcome."},
	TargetDuration: {Prom: "tokentap_target_request_duration_seconds", OTel: "tokentap.target.request.duration", Unit: "s", Buckets: e2eBuckets,
		Labels: []Label{LTarget, LOperation, LModel, LTraffic}, Exemplar: true,
		Help: "Egress requests' end-to-end latency (arrival to terminal outcome) by target."},
	TargetTTFT: {Prom: "tokentap_target_time_to_first_token_seconds", OTel: "tokentap.target.time_to_first_token", Unit: "s", Buckets: ttftBuckets,
		Labels: []Label{LTarget, LOperation, LModel, LTraffic}, Exemplar: true,
		Help: "Egress streaming requests' time to the first token-bearing event, by target."},
	TargetTPOT: {Prom: "tokentap_target_time_per_output_token_seconds", OTel: "tokentap.target.time_per_output_token", Unit: "s", Buckets: itlBuckets,
		Labels: []Label{LTarget, LOperation, LModel, LTraffic}, Exemplar: true,
		Help: "Egress streaming requests' time per output token after the first, by target."},
	// The OTel GenAI client metrics (semantic conventions v1.41.0) of
	// egress requests, where the sidecar is the client of a hosted API:
	// client.go says what each observes.
	ClientDuration: {Prom: "gen_ai_client_operation_duration_seconds", OTel: "gen_ai.client.operation.duration", Unit: "s", Buckets: clientSecondsBuckets,
		Labels: withClient(LErrorType), Exemplar: true,
		Help: "GenAI operation duration (semconv v1.41.0), egress requests: arrival to the terminal outcome, by target."},
	ClientTTFC: {Prom: "gen_ai_client_operation_time_to_first_chunk_seconds", OTel: "gen_ai.client.operation.time_to_first_chunk", Unit: "s", Buckets: clientSecondsBuckets,
		Labels: withClient(), Exemplar: true,
		Help: "Time to receive the first chunk (semconv v1.41.0), egress streaming requests: arrival to the first output chunk, by target."},
	ClientTPOC: {Prom: "gen_ai_client_operation_time_per_output_chunk_seconds", OTel: "gen_ai.client.operation.time_per_output_chunk", Unit: "s", Buckets: clientSecondsBuckets,
		Labels: withClient(),
		Help:   "Time per output chunk (semconv v1.41.0), egress streaming requests: one observation per output chunk after the first, from the end of the previous chunk to the end of this one, by target."},
	ClientTokenUsage: {Prom: "gen_ai_client_token_usage", OTel: "gen_ai.client.token.usage", Unit: "{token}", Buckets: clientTokenBuckets,
		Labels: withClient(LTokenType),
		Help:   "Number of input and output tokens used (semconv v1.41.0), egress requests whose counts are known: one observation per request and token type, by target."},
	// Where the wait for an answer went before the upstream began it
	// (docs/measurement.md §1, "Connection phases").
	UpstreamPhase: {Prom: "tokentap_upstream_phase_seconds", OTel: "tokentap.upstream.phase", Unit: "s", Buckets: phaseBuckets,
		Labels: []Label{LPhase, LConnReused, LTraffic, LProbe, LTarget},
		Help:   "Connection phases of requests forwarded upstream, one observation per phase that happened: phase conn_wait (asking the transport for a connection to having one; a new connection's dns, connect and tls included), dns, connect, tls (a new connection's set-up), server (the request written to the response's first byte); conn_reused says whether the connection had carried a request before; target is egress's (empty behind the reverse proxy)."},
	// The structure checks (docs/slo.md, "Structure"): names only.
	StructureChecked: {Prom: "tokentap_structure_checks_total", OTel: "tokentap.structure.checks", Unit: "{request}", Counter: true, Labels: withExtra(LResult),
		Help: "Answers whose structure was checked (the request declared tools or a JSON output, and an SLO requires structure), by result: pass, fail, unchecked (the request body was not read whole, several choices, or a schema that does not compile)."},
	StructureUnchecked: {Prom: "tokentap_structure_unchecked_total", OTel: "tokentap.structure.unchecked", Unit: "{request}", Counter: true, Labels: withExtra(LReason),
		Help: "Answers whose structure was not checked, by reason: request_partial, choices, schema_unusable, a declared schema over a bound (schema_too_large, schema_too_deep, schema_too_many_keywords, schema_too_slow), json_too_deep, validation_too_costly, check_panicked (structure.Whys; docs/slo.md, \"What a schema may cost\")."},
	StructureFailures: {Prom: "tokentap_structure_failures_total", OTel: "tokentap.structure.failures", Unit: "{request}", Counter: true, Labels: withExtra(LCheck),
		Help: "Answers that failed a structure check, by check: tool_args_invalid_json, tool_args_schema, unknown_tool, output_invalid_json, output_schema, truncated_json, too_large. An answer failing two checks counts under both."},
	SLOFastInvalid: {Prom: "tokentap_slo_fast_invalid_total", OTel: "tokentap.slo.fast_invalid", Unit: "{request}", Counter: true, Labels: []Label{LSLO},
		Help: "Offered requests that failed the SLO on structure checks alone: a success within every latency threshold whose answer does not hold as structure. Over tokentap_slo_requests_total: the share of fast but invalid answers."},
	// Per tenant (docs/slo.md, per tenant), only when tenants are on:
	// the SLO counters again, by the bounded tenant label, and every
	// live request's output tokens by tenant (the cost rules share the
	// replica's cost by them).
	SLOOfferedByTenant: {Prom: "tokentap_slo_requests_by_tenant_total", OTel: "tokentap.slo.requests_by_tenant", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LTenant},
		Help: "Requests offered to each SLO by tenant (tenant: a declared name, t- and 12 hex characters of a keyed hash, _other past max_tenants, _none without an identity): the per-tenant attainment denominator."},
	SLOQualifiedByTenant: {Prom: "tokentap_slo_qualified_requests_by_tenant_total", OTel: "tokentap.slo.qualified_requests_by_tenant", Unit: "{request}", Counter: true, Labels: []Label{LSLO, LTenant},
		Help: "Requests that qualified for each SLO by tenant: the per-tenant attainment numerator."},
	SLOQualifiedTokensByTenant: {Prom: "tokentap_slo_qualified_output_tokens_by_tenant_total", OTel: "tokentap.slo.qualified_output_tokens_by_tenant", Unit: "{token}", Counter: true, Labels: []Label{LSLO, LTenant},
		Help: "Output tokens of qualified requests by tenant: rate() of it is each tenant's token goodput."},
	TenantOutputTokens: {Prom: "tokentap_tenant_output_tokens_total", OTel: "tokentap.tenant.output_tokens", Unit: "{token}", Counter: true, Labels: []Label{LTraffic, LTenant},
		Help: "Output tokens of finished requests by tenant, whether or not they met an SLO (as gen_ai_client_inference_usage_output_tokens_total): each tenant's share of the tokens, by which the cost rules share the replica's cost."},
	// Why slow (docs/measurement.md §6b): every slow event once, by the
	// cause that explains it.
	Slow: {Prom: "tokentap_slow_total", OTel: "tokentap.slow", Unit: "{event}", Counter: true, Labels: []Label{LModel, LTraffic, LWhat, LCause},
		Help: "Slow events of streamed requests by cause: what=ttft a first token over its SLO's ttft threshold (or slo.slow_ttft), what=stall a gap over the stall threshold; cause connection, queue, long_prefill_ahead (ttft), preemption, prefill_interference (stall) or unexplained (docs/measurement.md, \"Why slow\"). Each event counted once, by the cause that explains most of it."},
}

// BaseLabels are the labels fixed at a request's start: its key. The
// model label is set by the caller, bounded (ModelLabels).
func BaseLabels(k record.Key) Labels {
	var l Labels
	l[LOperation], l[LModel], l[LTraffic], l[LProbe] = k.API.Operation(), k.Model, k.Traffic, k.Probe
	return l
}

// Emit receives one observation: instrument i takes value v under the
// label values l (each backend reads the labels i's Spec names).
type Emit func(i Instrument, v float64, l *Labels)

// Map maps a finished record to its observations. l holds the request's
// base labels (BaseLabels) and the provider name (LProvider, set by the
// backend). gaps says whether to emit the ITL gaps: a
// backend that observed them live, per event, asks for none.
func Map(r *record.Record, l Labels, gaps bool, emit Emit) {
	l[LOutcome], l[LErrorType], l[LModality] = string(r.Outcome), r.ErrorType, "text"
	l[LPromptClass], l[LOutputClass] = r.PromptClass, r.OutputClass
	secs := func(i Instrument, d time.Duration, ok bool) {
		if ok {
			emit(i, d.Seconds(), &l)
		}
	}
	emit(Requests, 1, &l)
	d, ok := r.E2E()
	secs(Duration, d, ok)
	d, ok = r.TTFB()
	secs(TTFB, d, ok)
	if r.Stream {
		d, ok = r.TTFT()
		secs(TTFT, d, ok)
		d, ok = r.TTFOT()
		secs(TTFOT, d, ok)
		d, ok = r.TPOT()
		secs(TPOT, d, ok)
		if gaps {
			r.Gaps(func(g time.Duration) { emit(ITL, g.Seconds(), &l) })
		}
		// Smoothness and classes are set by the SLO stage.
		if r.PromptClass != "" && r.TokenEvents() > 0 {
			emit(Stalls, float64(r.Stalls), &l)
			d, ok = r.MaxITL() // the worst choice's for n > 1, as TPOT
			secs(MaxGap, d, ok)
			d, ok = r.TTFT()
			secs(TTFTByClass, d, ok)
			d, ok = r.TPOT()
			secs(TPOTByClass, d, ok)
		}
	}
	if r.InputTokens > 0 {
		emit(InputTokens, float64(r.InputTokens), &l)
	}
	if r.OutputTokens > 0 {
		emit(OutputTokens, float64(r.OutputTokens), &l)
	}
	l[LTenant] = r.Tenant
	if r.Tenant != "" && r.OutputTokens > 0 {
		emit(TenantOutputTokens, float64(r.OutputTokens), &l)
	}
	for i := range r.SLO {
		v := &r.SLO[i]
		l[LSLO] = v.Name
		if v.Excluded {
			l[LReason] = string(record.Cancelled)
			emit(SLOExcluded, 1, &l)
			continue
		}
		emit(SLOOffered, 1, &l)
		if v.Qualified {
			emit(SLOQualified, 1, &l)
			if r.OutputTokens > 0 {
				emit(SLOQualifiedTokens, float64(r.OutputTokens), &l)
			}
		}
		if r.LoadBucket != "" {
			l[LLoad] = r.LoadBucket
			emit(SLOOfferedByLoad, 1, &l)
			if v.Qualified {
				emit(SLOQualifiedByLoad, 1, &l)
				if r.OutputTokens > 0 {
					emit(SLOQualifiedTokensByLoad, float64(r.OutputTokens), &l)
				}
			}
		}
		if r.Tenant != "" {
			emit(SLOOfferedByTenant, 1, &l)
			if v.Qualified {
				emit(SLOQualifiedByTenant, 1, &l)
				if r.OutputTokens > 0 {
					emit(SLOQualifiedTokensByTenant, float64(r.OutputTokens), &l)
				}
			}
		}
		for _, f := range v.Failed {
			l[LThreshold] = f
			emit(SLOFailures, 1, &l)
		}
		if structure.FastInvalid(v.Failed) {
			emit(SLOFastInvalid, 1, &l)
		}
		if v.Fluidity != nil {
			emit(Fluidity, *v.Fluidity, &l)
		}
	}
	if r.Structure != "" {
		l[LResult] = r.Structure
		emit(StructureChecked, 1, &l)
		for _, c := range r.StructureFailed {
			l[LCheck] = c
			emit(StructureFailures, 1, &l)
		}
		if r.StructureUnchecked != "" {
			l[LReason] = r.StructureUnchecked
			emit(StructureUnchecked, 1, &l)
		}
	}
	for i := range r.Causes {
		l[LWhat], l[LCause] = r.Causes[i].What, r.Causes[i].Cause
		emit(Slow, 1, &l)
	}
	if r.EnergySource != "" && r.EnergySource != "none" && r.OutputTokens > 0 {
		emit(EnergyPerToken, r.EnergyJ/float64(r.OutputTokens), &l)
	}
	if r.DecodeSOL > 0 {
		emit(DecodeSOL, r.DecodeSOL, &l)
	}
	if r.TargetRule != "" {
		l[LTarget] = r.TargetRule
		emit(TargetRequests, 1, &l)
		d, ok = r.E2E()
		secs(TargetDuration, d, ok)
		if r.Stream {
			d, ok = r.TTFT()
			secs(TargetTTFT, d, ok)
			d, ok = r.TPOT()
			secs(TargetTPOT, d, ok)
		}
		mapClient(r, &l, emit)
	}
	if u := &r.Upstream; u.Asked {
		l[LTarget], l[LConnReused] = r.TargetRule, "false"
		if u.Known&record.UpConnWait != 0 && u.Reused {
			l[LConnReused] = "true"
		}
		for _, p := range record.UpstreamPhases {
			if d, ok := u.Phase(p.Bit); ok {
				l[LPhase] = p.Name
				emit(UpstreamPhase, d.Seconds(), &l)
			}
		}
	}
}
