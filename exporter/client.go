package exporter

import (
	"time"

	"github.com/tokentap/tokentap/record"
)

// The OpenTelemetry GenAI client metrics of egress requests.
//
// Behind the egress proxy (docs/egress.md) the sidecar is the client of
// a hosted API, the view the conventions' client metrics describe. Their
// names, units and advisory bucket boundaries are those of the semantic
// conventions v1.41.0 (docs/gen-ai/gen-ai-metrics.md of
// open-telemetry/semantic-conventions at that tag, where
// time_to_first_chunk and time_per_output_chunk first appear); the
// GenAI conventions have since moved to their own repository
// (open-telemetry/semantic-conventions-genai), whose v0.1.0 renamed
// them gen_ai.client.inference.*. docs/metrics.md gives each name's
// version.
//
// What a chunk is the conventions do not say (their section on
// streaming chunks is a TODO). Here an output chunk is a token-bearing
// event, the events TTFT, TPOT and ITL are measured on
// (docs/measurement.md §2): a role-only or metadata event carries no
// output and is not one. So time_to_first_chunk is the request's TTFT,
// and time_per_output_chunk its inter-token gaps, one per chunk after the
// first, each measured at the event's completion, which is the
// conventions' "end of the previous chunk to the end of the current
// chunk".

var (
	// clientSecondsBuckets are the boundaries that v1.41.0 advises for
	// gen_ai.client.operation.duration, .time_to_first_chunk and
	// .time_per_output_chunk (seconds).
	clientSecondsBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	// clientTokenBuckets are those it advises for
	// gen_ai.client.token.usage (tokens).
	clientTokenBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// DefaultProviderName is gen_ai.provider.name when Config.ProviderName is
// empty: the value the spans take by default too (config.Tracing).
const DefaultProviderName = "openai_compatible"

// withClient are the labels of the client metrics: the target (the
// intercept allow-list entry, bounded), the conventions' required
// gen_ai.operation.name and gen_ai.provider.name, the bounded model,
// the traffic class, and extra.
func withClient(extra ...Label) []Label {
	return append([]Label{LTarget, LOperation, LProvider, LModel, LTraffic}, extra...)
}

// mapClient emits the client metrics of an egress record; l holds its
// labels, the target's among them. Its duration is E2E (arrival to the
// terminal outcome, any outcome, error.type on failure); a streamed
// request adds its time to first chunk (TTFT) and one time per output
// chunk per gap between token-bearing events (for n > 1, within each
// choice); the token counts are observed when known (a count of -1 is
// unknown and not reported, as the conventions ask).
func mapClient(r *record.Record, l *Labels, emit Emit) {
	if d, ok := r.E2E(); ok {
		emit(ClientDuration, d.Seconds(), l)
	}
	if r.Stream {
		if d, ok := r.TTFT(); ok {
			emit(ClientTTFC, d.Seconds(), l)
		}
		r.Gaps(func(g time.Duration) { emit(ClientTPOC, g.Seconds(), l) })
	}
	if r.InputTokens >= 0 {
		l[LTokenType] = "input"
		emit(ClientTokenUsage, float64(r.InputTokens), l)
	}
	if r.OutputTokens >= 0 {
		l[LTokenType] = "output"
		emit(ClientTokenUsage, float64(r.OutputTokens), l)
	}
}

// providerName returns name, or DefaultProviderName when it is empty.
func providerName(name string) string {
	if name == "" {
		return DefaultProviderName
	}
	return name
}
