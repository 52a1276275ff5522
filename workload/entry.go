// Package workload is the frozen production workload: one line per
// finished request, in the Mooncake trace form that AIPerf, GuideLLM,
// SGLang's bench_serving and vLLM's bench serve replay (docs/capture.md).
// The capture writes it (no text, no token ids, no keys); tokentap replay
// reads it, and reads public Mooncake traces too.
package workload

// Entry is one line of a trace in the Mooncake form. The zero value is a
// request at the trace's first instant with no prompt and no answer.
type Entry struct {
	// Timestamp is the arrival, in whole milliseconds since the first
	// request of the file.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are the prompt's and the answer's
	// tokens (the engine's counts where it gave them: Meta says).
	InputLength  int64 `json:"input_length"`
	OutputLength int64 `json:"output_length"`
	// HashIDs are the ids of the prompt's blocks, ceil(InputLength /
	// block size) of them; equal leading ids mean a shared prefix.
	HashIDs []int64 `json:"hash_ids"`
	// SessionID names the conversation the request belongs to; "" when
	// none was identified.
	SessionID string `json:"session_id,omitempty"`
	// Replica names the replica that served the request, on the lines of
	// a merged trace (`sidecar capture merge`); "" elsewhere.
	Replica string `json:"replica,omitempty"`
	// Tokentap holds tokentap's own fields when they travel on the same
	// line; nil when the line has none (a public trace), or when they
	// are in the side file (docs/capture.md says which form is written).
	Tokentap *Meta `json:"tokentap,omitempty"`
}

// Meta is what tokentap knew of a captured request beyond the Mooncake
// fields: its route, its bounded model label, how it ended, how it was
// judged and what its latency was in production. No text, no key.
type Meta struct {
	// Line is the 1-based line of the Entry this belongs to, when Meta
	// is written to a side file; 0 on the same line.
	Line int64 `json:"line,omitempty"`
	// API is the request's API name (stream.Name), Model its bounded
	// model label.
	API   string `json:"api"`
	Model string `json:"model,omitempty"`
	// Stream says the request asked for a stream.
	Stream bool `json:"stream"`
	// Outcome and ErrorType as in the record (docs/records.md).
	Outcome   string `json:"outcome"`
	ErrorType string `json:"error_type,omitempty"`
	// InputLengthFrom and OutputLengthFrom say where the lengths came
	// from: "engine" (the usage the engine reported), "estimate" (the
	// sidecar's estimate, when the engine gave none) or "none" (0
	// written: nothing to estimate from).
	InputLengthFrom  string `json:"input_length_from"`
	OutputLengthFrom string `json:"output_length_from"`
	// TTFTMs, TPOTMs and E2EMs are the production latencies, in
	// milliseconds; nil when undefined (docs/measurement.md).
	TTFTMs *float64 `json:"ttft_ms,omitempty"`
	TPOTMs *float64 `json:"tpot_ms,omitempty"`
	E2EMs  *float64 `json:"e2e_ms,omitempty"`
	// SLO maps each SLO whose scope held the request to its verdict
	// ("met" or "missed").
	SLO map[string]string `json:"slo,omitempty"`
	// HashIDsFrom says what the hash_ids were computed from: "prompt"
	// (the whole prompt), "partial" (the prompt members complete within
	// the peek; the ids past them are the request's own) or "none" (no
	// prompt was read: every id is the request's own). "" on lines that
	// do not say (public traces).
	HashIDsFrom string `json:"hash_ids_from,omitempty"`
	// BlockSize is the tokens per hash id the capture used; 0 when the
	// line does not say.
	BlockSize int64 `json:"block_size,omitempty"`
	// IDs is "fleet" when hash_ids and session_id are fleet ids (equal
	// across the replicas that share the capture's secret:
	// capture.ids: fleet); "" when they are numbered per file.
	IDs string `json:"ids,omitempty"`
	// Replica names the sidecar that wrote the line (capture.replica), and
	// StartUnixMs is its file's start, in whole milliseconds since the Unix
	// epoch: the request arrived at StartUnixMs + timestamp. Both are
	// written with fleet ids only; "" and 0 otherwise.
	Replica     string `json:"replica,omitempty"`
	StartUnixMs int64  `json:"start_unix_ms,omitempty"`
}
