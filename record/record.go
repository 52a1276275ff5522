// Package record holds the per-request record: the instants of one
// request's life (docs/measurement.md §1), its token counts (§2), the
// quantities derived from them (§3) and its outcome. The proxy fills one
// Record per request; exporters and sinks read it when it is finished.
package record

import (
	"math"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Outcome is the terminal state of a request; every request that arrived
// gets exactly one.
type Outcome string

// The outcomes of docs/measurement.md §3.
const (
	Success   Outcome = "success"
	Error     Outcome = "error"
	Rejected  Outcome = "rejected"
	Cancelled Outcome = "cancelled"
	Timeout   Outcome = "timeout"
	// NoAnswer is a response whose status carries no answer for the API
	// (a redirect or another 3xx, a 2xx other than 200, 201 and 203 to a
	// generation request) or an answer status with an empty body
	// (docs/measurement.md §3, "Which statuses are answers"). Never a
	// success, never qualified for an SLO.
	NoAnswer Outcome = "no_answer"
	// NotSent is the canary probe's record of a scheduled probe that could
	// not be sent (docs/measurement.md §7). It is never a proxied request's
	// outcome and never counted as one.
	NotSent Outcome = "not_sent"
)

// Error types: a bounded set, safe as a metric label.
const (
	ErrHTTP4xx         = "http_4xx"
	ErrHTTP5xx         = "http_5xx"
	ErrRejected        = "rejected"
	ErrStreamError     = "stream_error" // an error event after HTTP 200
	ErrMalformed       = "malformed_stream"
	ErrUpstreamReset   = "upstream_reset"
	ErrUpstreamConnect = "upstream_unreachable"
	ErrIncomplete      = "incomplete_stream" // clean EOF, no end marker, no finish reason
	ErrShutdown        = "shutdown"          // cut when the shutdown grace period was over
	ErrTimeout         = "timeout"
	ErrCancelled       = "cancelled"
	ErrUpstreamTLS     = "upstream_tls"   // the upstream's certificate failed verification, or its TLS handshake failed (egress)
	ErrInternal        = "internal"       // the sidecar's own fault: its handler panicked (answered 502 when no status was written)
	ErrHTTP3xx         = "http_3xx"       // no_answer: a redirect, a 304, any 3xx
	ErrNoAnswerStatus  = "http_no_answer" // no_answer: a 2xx other than 200, 201 and 203 to a generation request (202, 204, 205, 206 ...)
	ErrEmptyBody       = "empty_body"     // no_answer: an answer status whose body had no byte
	ErrHTMLBody        = "html_body"      // no_answer: an answer status to a generation request whose body is a web page (text/html)
	ErrEmptyAnswer     = "empty_answer"   // no_answer: an answer status whose whole JSON body names no answer ({}, {"choices":[]})
	ErrLoop            = "loop_detected"  // the request came back to this sidecar (its Via names it): answered 508, not forwarded
)

// Record is one request: plain data, with no behaviour attached. Time
// fields are zero when the instant did not happen (no token, no upstream
// response...). Offsets in the JSON form are milliseconds from Arrive,
// taken from the monotonic clock.
//
// Who writes what, and when (docs/design.md draws it): the proxy and its
// tap fill the request's fields, instants and token times while it runs
// (package proxy), and settle Outcome and the token counts when it ends;
// the canary probe sets Probe (package probe); the end-of-request pipeline
// (package pipeline) then sets, in this order, the SLO fields (Stalls,
// classes, SLO: from package slo's verdict) and the energy fields (from
// package gpu's attribution), and hands the record to the metric
// backends and sinks, which only read it.
type Record struct {
	ID      string
	Traffic string // "live" for proxied traffic, "canary" for probes, "replay" for tokentap replay
	// API is the request's API, named as stream's registry names it
	// (stream.APIs); everything no route matches is stream.NameOther,
	// passed through untouched, and a connection that switched protocols
	// stream.NameUpgrade: one record per connection.
	API   stream.Name
	Model string // the requested model as sent, at most MaxModelBytes; "" when unknown
	// ModelTruncated says Model was cut to MaxModelBytes.
	ModelTruncated bool
	Stream         bool

	// Target is the host (with its port when not the scheme's default)
	// that an egress request went to, and TargetRule the intercept
	// allow-list entry it matched (the bounded metric label); both ""
	// behind the reverse proxy (docs/egress.md).
	Target, TargetRule string

	Outcome      Outcome
	HTTPStatus   int    // the status the client got; 0 if none was sent
	ErrorType    string // one of the Err* constants; "" on success
	ErrorCode    int64  // engine error code from an error event, if any
	FinishReason string

	InputTokens   int64 // -1 when unknown
	OutputTokens  int64 // -1 when unknown
	CachedTokens  int64
	TokenSource   string // usage | token_ids | logprobs | events | none
	Events        int    // protocol events seen
	Malformed     bool   // some event could not be parsed
	UsageInjected bool   // the sidecar asked the engine for usage
	ResponseModel string
	ResponseID    string // the engine's id for the completion
	// Engine holds the durations the engine itself reported (engine_*).
	Engine EngineTimes
	// TraceID and SpanID identify the request's inference span when it is
	// traced and sampled; "" otherwise.
	TraceID, SpanID string
	TapFailed       string // why the tap gave up on this response (fail open); "" if it did not
	MaxTokens       int64  // requested max_tokens, 0 when not sent

	// OversizedEvents counts the response's events over the tap's 1 MiB
	// bound: forwarded, not read (their tokens unknown), the events
	// after them measured. 0 when none.
	OversizedEvents int
	// RequestRead says the request's body was not read whole: "partial"
	// (longer than the peek, --peek-bytes) or "unparsed" (not one JSON
	// object); its fields were then read best effort, and stream decided
	// from the response. "" when it was read whole.
	RequestRead string
	// Structure is the structure check of the answer (docs/slo.md,
	// "Structure"): "pass", "fail" (StructureFailed names the checks
	// that failed), "unchecked" (StructureUnchecked says why), or "" when
	// none applied. Only these names are kept, never the content.
	Structure          string
	StructureFailed    []string
	StructureUnchecked string

	Arrive           time.Time // request headers read: the zero of every offset
	UpstreamSent     time.Time
	Headers          time.Time
	FirstByte        time.Time
	FirstEvent       time.Time
	FirstToken       time.Time
	FirstOutputToken time.Time
	LastToken        time.Time
	Terminal         time.Time
	// Upstream holds the connection phases (upstream.go): the zero value
	// when the request never reached the transport.
	Upstream Upstream

	// TokenAt holds the offset from Arrive of every token-bearing event.
	TokenAt []time.Duration
	// TokensPerEvent is parallel to TokenAt when every token-bearing
	// event said how many tokens it carried; nil otherwise.
	TokensPerEvent []int32
	perEventKnown  bool
	// MaxGap is the largest gap between consecutive token-bearing events
	// (of the same choice, the worst choice's, when Choices is set).
	MaxGap time.Duration
	// Choices follows each choice on its own once the response carried a
	// second choice index (n > 1; choice.go): at most MaxChoices, in the
	// order they appeared; nil for a response with one choice.
	// ChoicesUntracked counts the choices beyond MaxChoices, and the
	// choices with an index the parser does not read, as one.
	// ChoiceIndexUnread counts the payloads whose choice index the parser
	// did not read (stream.IndexOutOfRange): their choice is untracked,
	// never pooled with another; Choices is set (empty when no choice was
	// named) from the first. EventChoice is parallel to TokenAt while
	// Choices is set: the position in Choices of each token event's
	// choice (UntrackedChoice beyond it).
	Choices           []Choice
	ChoicesUntracked  int
	ChoiceIndexUnread int
	EventChoice       []uint8
	// Stalls counts gaps above the configured stall threshold; set when
	// the request is judged (package slo).
	Stalls int
	// PromptClass and OutputClass are the request classes by input and
	// output tokens; "" until judged, "unknown" when the count is unknown.
	PromptClass, OutputClass string
	// SLO holds one verdict per declared SLO whose scope the request is in.
	SLO []Verdict
	// Probe is set on canary probe records.
	Probe *ProbeInfo
	// Replay is set on the records of tokentap replay (package replay).
	Replay *ReplayInfo
	// EnergyJ is the GPU energy attributed to the request, EnergyDynamicJ
	// the part above the idle baseline; EnergySource says how it was
	// measured ("" when energy is off).
	EnergyJ, EnergyDynamicJ float64
	EnergySource            string
	// EnergyInterval is the sampling interval whose energy was shared
	// out (energy.interval); 0 when energy is off. With the DCGM source
	// the exporter's own collection interval bounds the resolution too
	// (docs/energy.md).
	EnergyInterval time.Duration
	// DecodeSOL is the measured decode rate as a fraction of the memory-
	// bandwidth ceiling (0 when unknown).
	DecodeSOL float64
	// PreemptionsDuring is how far the engine's preemption counter
	// advanced while the request ran, at scrape resolution (package
	// engine, docs/engine-signals.md): the engine's preemptions of any
	// sequence, not this request's own. -1 when unknown: no engine
	// scraper, no scrape yet, or an engine without the counter.
	PreemptionsDuring int
	// StallCause is what coincided with the request's stalls, best
	// effort: preemption, kv_cache_full, queue_spike, or "".
	StallCause string
	// Causes says why the request was slow: one entry per slow event
	// (its first token over its threshold, each stall), in time order,
	// at most MaxCauses; CausesCut counts the slow events past the bound,
	// not attributed. Set when the request ends (package cause); nil
	// when nothing was slow or attribution is off.
	Causes    []Cause
	CausesCut int
	// Load is the load the request ran under: the time-weighted mean
	// number of requests in flight through the sidecar during its life,
	// itself included (so at least 1); LoadBucket is the label of the
	// load bucket it falls in ("" when not measured). Set by the
	// pipeline when the request ends (docs/cost.md).
	Load       float64
	LoadBucket string
	// Tenant is who the request is for (docs/config.md, tenant): the
	// proxy sets its identity at arrival (package tenant: a declared
	// name, "t-" and a keyed hash's hex, or "_none"), and the pipeline
	// bounds it to the label when the request ends ("_other" past the
	// bound). Never the header's value or the API key. "" when tenants
	// are off.
	Tenant string
}

// ReplayInfo is what a replayed request's record adds: the trace line it
// came from and its open-loop schedule.
type ReplayInfo struct {
	Line      int64     // the 1-based line of the trace
	Scheduled time.Time // the schedule's instant; Arrive is when it was sent
	Rate      float64   // the arrival-rate multiplier of the run (--rate, or the step of --rates)
	NotSent   string    // why it was not sent (concurrency_cap, shutdown); "" when sent
}

// ProbeInfo is what a canary record adds.
type ProbeInfo struct {
	Name      string
	Scheduled time.Time // the open-loop schedule's instant; Arrive is when it was sent
	Result    string    // success, failed, not_sent
	Check     string    // the quality check that failed, if any
	Failure   string    // why it failed
}

// Verdict is a request's judgement against one SLO (docs/measurement.md §5).
type Verdict struct {
	Name string
	// Qualified: the outcome was success and every applicable threshold held.
	Qualified bool
	// Excluded: left out of the denominator by the SLO's declared option
	// (client cancellations, when count_cancelled is false).
	Excluded bool
	// Failed names each threshold that failed, or the outcome
	// (error, rejected, timeout, cancelled, no_answer) when it was not success, and
	// under structure: required each structure check that failed
	// (StructureFailed).
	Failed []string
	// NotApplicable names thresholds that do not apply to this request
	// (TPOT for a one-token answer; "structure" when the answer could
	// not be checked).
	NotApplicable []string
	// Fluidity is the request's fluidity score, when the SLO has one.
	Fluidity *float64
}

// MaxModelBytes bounds the model name a record keeps: a client's model
// string is request-derived and could otherwise make every record line,
// span and label arbitrarily large.
const MaxModelBytes = 256

// SetModel sets Model to name, cut at MaxModelBytes on a UTF-8 boundary.
func (r *Record) SetModel(name string) {
	if len(name) <= MaxModelBytes {
		r.Model = name
		return
	}
	cut := MaxModelBytes
	for cut > 0 && name[cut]&0xC0 == 0x80 {
		cut--
	}
	r.Model, r.ModelTruncated = name[:cut], true
}

// Cut returns b as a string of at most n bytes, cut before a UTF-8
// continuation byte so that a multi-byte character is never split (an
// engine's model or id over its bound keeps whole characters).
func Cut(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	for n > 0 && b[n]&0xC0 == 0x80 {
		n--
	}
	return string(b[:n])
}

// Reset clears r for reuse, keeping the capacity of its slices.
func (r *Record) Reset() {
	ta, tpe := r.TokenAt[:0], r.TokensPerEvent[:0]
	*r = Record{TokenAt: ta, TokensPerEvent: tpe, InputTokens: -1, OutputTokens: -1, PreemptionsDuring: -1, perEventKnown: true}
	r.EventChoice = r.EventChoice[:0] // its room kept; Choices nil again (one choice)
}

// MaxHint bounds the room New makes for token events: a request's
// max_tokens is a claim, not bytes received, so a record never reserves
// more than this for it (more events grow the slices as they come).
const MaxHint = 8192

// New returns a reset record with room for hint token events, hint
// clamped to [0, MaxHint].
func New(hint int) *Record {
	hint = min(max(hint, 0), MaxHint)
	r := &Record{TokenAt: make([]time.Duration, 0, hint), TokensPerEvent: make([]int32, 0, hint)}
	r.Reset()
	return r
}

// AddToken records a token-bearing event read at t carrying k tokens
// (k <= 0: unknown) and returns the gap to the previous token-bearing
// event (0 and false for the first). It does not allocate while the
// record's capacity lasts.
func (r *Record) AddToken(t time.Time, k int64, output bool) (gap time.Duration, ok bool) {
	if !r.FirstToken.IsZero() {
		gap, ok = t.Sub(r.LastToken), true
		if gap > r.MaxGap {
			r.MaxGap = gap
		}
	}
	r.appendEvent(t, k, output)
	return gap, ok
}

// appendEvent adds a token event to the request's instants and TokenAt.
func (r *Record) appendEvent(t time.Time, k int64, output bool) {
	if r.FirstToken.IsZero() {
		r.FirstToken = t
	}
	if output && r.FirstOutputToken.IsZero() {
		r.FirstOutputToken = t
	}
	r.LastToken = t
	r.TokenAt = append(r.TokenAt, t.Sub(r.Arrive))
	if k > 0 && k <= math.MaxInt32 && r.perEventKnown {
		r.TokensPerEvent = append(r.TokensPerEvent, int32(k))
	} else {
		r.perEventKnown = false
	}
}

// TokenEvents is the number of token-bearing events.
func (r *Record) TokenEvents() int { return len(r.TokenAt) }

// PerEventKnown reports whether every token-bearing event carried a count.
func (r *Record) PerEventKnown() bool {
	return r.perEventKnown && len(r.TokensPerEvent) == len(r.TokenAt) && len(r.TokenAt) > 0
}

func since(a, b time.Time) (time.Duration, bool) {
	if a.IsZero() || b.IsZero() {
		return 0, false
	}
	return b.Sub(a), true
}

// TTFT is FirstToken − Arrive; ok is false when no token arrived.
func (r *Record) TTFT() (time.Duration, bool) { return since(r.Arrive, r.FirstToken) }

// TTFOT is FirstOutputToken − Arrive (reasoning excluded).
func (r *Record) TTFOT() (time.Duration, bool) { return since(r.Arrive, r.FirstOutputToken) }

// TTFB is FirstByte − Arrive.
func (r *Record) TTFB() (time.Duration, bool) { return since(r.Arrive, r.FirstByte) }

// E2E is Terminal − Arrive. It is never the last-token latency.
func (r *Record) E2E() (time.Duration, bool) { return since(r.Arrive, r.Terminal) }

// TPOT is (LastToken − FirstToken) / (n − 1) with n the output token
// count; ok is false for n ≤ 1, when it is undefined (not zero). With
// Choices set it is the worst (largest) of the choices' TPOTs.
func (r *Record) TPOT() (time.Duration, bool) {
	if r.Choices != nil {
		return r.choicesTPOT()
	}
	n := r.OutputTokens
	if r.FirstToken.IsZero() || n < 2 {
		return 0, false
	}
	return r.LastToken.Sub(r.FirstToken) / time.Duration(n-1), true
}

// MaxITL is MaxGap; ok is false when there is no gap: fewer than two
// token events (of one choice, with Choices set).
func (r *Record) MaxITL() (time.Duration, bool) {
	if r.Choices != nil {
		for i := range r.Choices {
			if r.Choices[i].Events >= 2 {
				return r.MaxGap, true
			}
		}
		return 0, false
	}
	return r.MaxGap, len(r.TokenAt) >= 2
}

// Gaps calls fn with every inter-token-event gap, in order: with Choices
// set, every gap between two token events of the same choice.
func (r *Record) Gaps(fn func(time.Duration)) {
	if r.Choices != nil {
		r.choiceGaps(fn)
		return
	}
	for i := 1; i < len(r.TokenAt); i++ {
		fn(r.TokenAt[i] - r.TokenAt[i-1])
	}
}

// Cause is what made one slow event slow (docs/measurement.md §6b, "Why
// slow"): a first token over its threshold, or a stall. Set by the
// pipeline's attribution stage (package cause) when the request ends.
type Cause struct {
	// What is the slow event: "ttft" or "stall".
	What string
	// Cause is one of the bounded cause names (package cause):
	// connection, queue, long_prefill_ahead (ttft), prefill_interference
	// (stall), preemption (stall), unexplained.
	Cause string
	// Ms is the milliseconds of the event the cause explains: the part of
	// the first token's wait, or of the stall, that its evidence covers
	// (for unexplained, the whole wait or stall).
	Ms float64
	// At is the stall's start (the token event before the gap); zero for
	// a first token.
	At time.Time
	// Ref is the record id of the request the cause points to (the long
	// prompt ahead, the prefill that interfered, the request whose end
	// freed a slot); "" when it points to none. Never content.
	Ref string
}

// MaxCauses bounds Causes: a request's first slow events are attributed
// one by one; the slow events past the bound are counted in CausesCut.
const MaxCauses = 256
