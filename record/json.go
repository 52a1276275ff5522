package record

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// member is one member of the record's JSON object (docs/records.md).
type member struct {
	name string
	// omit reports whether the member is left out of r's object; nil:
	// always written.
	omit func(r *Record) bool
	// value appends the member's value.
	value func(b []byte, r *Record) []byte
	key   string // `"name":`, filled from name
}

// members is the record's JSON schema, in the order written.
var members = func() []member {
	table := []member{
		{name: "id", value: str(func(r *Record) string { return r.ID })},
		{name: "start", value: func(b []byte, r *Record) []byte {
			b = append(b, '"')
			b = r.Arrive.UTC().AppendFormat(b, time.RFC3339Nano)
			return append(b, '"')
		}},
		{name: "traffic", value: str(func(r *Record) string { return r.Traffic })},
		{name: "tenant", omit: func(r *Record) bool { return r.Tenant == "" }, value: str(func(r *Record) string { return r.Tenant })},
		{name: "target", omit: noTarget, value: str(func(r *Record) string { return r.Target })},
		{name: "target_rule", omit: func(r *Record) bool { return noTarget(r) || r.TargetRule == r.Target },
			value: str(func(r *Record) string { return r.TargetRule })},
		{name: "trace_id", omit: func(r *Record) bool { return r.TraceID == "" }, value: str(func(r *Record) string { return r.TraceID })},
		{name: "api", value: str(func(r *Record) string { return string(r.API) })},
		{name: "model", value: str(func(r *Record) string { return r.Model })},
		{name: "model_truncated", omit: func(r *Record) bool { return !r.ModelTruncated }, value: boolean(true)},
		{name: "stream", value: func(b []byte, r *Record) []byte { return strconv.AppendBool(b, r.Stream) }},
		{name: "outcome", value: str(func(r *Record) string { return string(r.Outcome) })},
		{name: "http_status", value: integer(func(r *Record) int64 { return int64(r.HTTPStatus) })},
		{name: "error_type", value: str(func(r *Record) string { return r.ErrorType })},
		{name: "error_code", omit: func(r *Record) bool { return r.ErrorCode == 0 }, value: integer(func(r *Record) int64 { return r.ErrorCode })},
		{name: "finish_reason", value: str(func(r *Record) string { return r.FinishReason })},
		{name: "input_tokens", value: count(func(r *Record) int64 { return r.InputTokens })},
		{name: "output_tokens", value: count(func(r *Record) int64 { return r.OutputTokens })},
		{name: "cached_tokens", omit: func(r *Record) bool { return r.CachedTokens <= 0 }, value: integer(func(r *Record) int64 { return r.CachedTokens })},
		{name: "token_source", value: str(func(r *Record) string { return r.TokenSource })},
		{name: "events", value: integer(func(r *Record) int64 { return int64(r.Events) })},
		{name: "token_events", value: integer(func(r *Record) int64 { return int64(len(r.TokenAt)) })},
		{name: "malformed", omit: func(r *Record) bool { return !r.Malformed }, value: boolean(true)},
		{name: "usage_injected", omit: func(r *Record) bool { return !r.UsageInjected }, value: boolean(true)},
		{name: "tap_failed", omit: func(r *Record) bool { return r.TapFailed == "" }, value: str(func(r *Record) string { return r.TapFailed })},
		{name: "oversized_events", omit: func(r *Record) bool { return r.OversizedEvents <= 0 },
			value: integer(func(r *Record) int64 { return int64(r.OversizedEvents) })},
		{name: "request_read", omit: func(r *Record) bool { return r.RequestRead == "" }, value: str(func(r *Record) string { return r.RequestRead })},
		{name: "structure", omit: func(r *Record) bool { return r.Structure == "" }, value: str(func(r *Record) string { return r.Structure })},
		{name: "structure_failed", omit: func(r *Record) bool { return len(r.StructureFailed) == 0 }, value: func(b []byte, r *Record) []byte {
			enc, _ := json.Marshal(r.StructureFailed)
			return append(b, enc...)
		}},
		{name: "structure_unchecked", omit: func(r *Record) bool { return r.StructureUnchecked == "" },
			value: str(func(r *Record) string { return r.StructureUnchecked })},
		{name: "response_id", omit: func(r *Record) bool { return r.ResponseID == "" }, value: str(func(r *Record) string { return r.ResponseID })},
	}
	for _, f := range engineFields {
		bit := f.bit
		table = append(table, member{name: f.name, omit: func(r *Record) bool { return r.Engine.Known&bit == 0 },
			value: millis(func(r *Record) (time.Duration, bool) { return r.Engine.get(bit), true })})
	}
	table = append(table, []member{
		{name: "upstream", omit: func(r *Record) bool { return !r.Upstream.Asked }, value: func(b []byte, r *Record) []byte { return r.Upstream.AppendJSON(b) }},
		{name: "ttfb_ms", value: millis((*Record).TTFB)},
		{name: "ttft_ms", value: millis((*Record).TTFT)},
		{name: "ttfot_ms", value: millis((*Record).TTFOT)},
		{name: "token_ms", value: func(b []byte, r *Record) []byte {
			b = append(b, '[')
			for i, t := range r.TokenAt {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendFloat(b, ms(t), 'f', -1, 64)
			}
			return append(b, ']')
		}},
		{name: "tokens_per_event", value: func(b []byte, r *Record) []byte {
			if !r.PerEventKnown() {
				return append(b, "null"...)
			}
			b = append(b, '[')
			for i, k := range r.TokensPerEvent {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, int64(k), 10)
			}
			return append(b, ']')
		}},
		{name: "terminal_ms", value: millis(func(r *Record) (time.Duration, bool) { return since(r.Arrive, r.Terminal) })},
		{name: "tpot_ms", value: millis((*Record).TPOT)},
		{name: "e2e_ms", value: millis((*Record).E2E)},
		{name: "max_itl_ms", value: millis((*Record).MaxITL)},
		{name: "choices", omit: func(r *Record) bool { return r.Choices == nil }, value: func(b []byte, r *Record) []byte { return r.appendChoices(b) }},
		{name: "choices_untracked", omit: func(r *Record) bool { return r.Choices == nil || r.ChoicesUntracked <= 0 },
			value: integer(func(r *Record) int64 { return int64(r.ChoicesUntracked) })},
		{name: "choice_index_unread", omit: func(r *Record) bool { return r.ChoiceIndexUnread <= 0 },
			value: integer(func(r *Record) int64 { return int64(r.ChoiceIndexUnread) })},
		{name: "stalls", omit: unjudged, value: integer(func(r *Record) int64 { return int64(r.Stalls) })},
		{name: "prompt_class", omit: unjudged, value: str(func(r *Record) string { return r.PromptClass })},
		{name: "output_class", omit: unjudged, value: str(func(r *Record) string { return r.OutputClass })},
		{name: "preemptions_during", omit: func(r *Record) bool { return r.PreemptionsDuring < 0 },
			value: integer(func(r *Record) int64 { return int64(r.PreemptionsDuring) })},
		{name: "stall_cause", omit: func(r *Record) bool { return r.StallCause == "" }, value: str(func(r *Record) string { return r.StallCause })},
		{name: "causes", omit: func(r *Record) bool { return len(r.Causes) == 0 }, value: func(b []byte, r *Record) []byte { return r.appendCauses(b) }},
		{name: "causes_cut", omit: func(r *Record) bool { return r.CausesCut <= 0 }, value: integer(func(r *Record) int64 { return int64(r.CausesCut) })},
		{name: "load", omit: noLoad, value: rounded(func(r *Record) float64 { return r.Load }, 100)},
		{name: "load_bucket", omit: noLoad, value: str(func(r *Record) string { return r.LoadBucket })},
		{name: "probe", omit: func(r *Record) bool { return r.Probe == nil }, value: func(b []byte, r *Record) []byte {
			p := r.Probe
			enc, _ := json.Marshal(map[string]any{"name": p.Name, "scheduled": p.Scheduled.UTC().Format(time.RFC3339Nano),
				"schedule_lag_ms": ms(r.Arrive.Sub(p.Scheduled)), "result": p.Result, "failed_check": p.Check, "failure": p.Failure})
			return append(b, enc...)
		}},
		{name: "replay", omit: func(r *Record) bool { return r.Replay == nil }, value: func(b []byte, r *Record) []byte {
			p := r.Replay
			m := map[string]any{"line": p.Line, "scheduled": p.Scheduled.UTC().Format(time.RFC3339Nano), "rate": p.Rate}
			if p.NotSent == "" {
				m["schedule_lag_ms"] = ms(r.Arrive.Sub(p.Scheduled))
			} else {
				m["not_sent"] = p.NotSent
			}
			enc, _ := json.Marshal(m)
			return append(b, enc...)
		}},
		{name: "energy_j", omit: noEnergy, value: rounded(func(r *Record) float64 { return r.EnergyJ }, 1e4)},
		{name: "energy_dynamic_j", omit: noEnergy, value: rounded(func(r *Record) float64 { return r.EnergyDynamicJ }, 1e4)},
		{name: "energy_source", omit: noEnergy, value: str(func(r *Record) string { return r.EnergySource })},
		{name: "energy_interval_ms", omit: func(r *Record) bool { return noEnergy(r) || r.EnergyInterval <= 0 },
			value: func(b []byte, r *Record) []byte { return strconv.AppendInt(b, r.EnergyInterval.Milliseconds(), 10) }},
		{name: "decode_sol_ratio", omit: func(r *Record) bool { return noEnergy(r) || r.DecodeSOL <= 0 },
			value: rounded(func(r *Record) float64 { return r.DecodeSOL }, 1e4)},
		{name: "slo", omit: func(r *Record) bool { return len(r.SLO) == 0 }, value: func(b []byte, r *Record) []byte {
			enc, _ := json.Marshal(verdictsJSON(r.SLO))
			return append(b, enc...)
		}},
	}...)
	for i := range table {
		table[i].key = `"` + table[i].name + `":`
	}
	return table
}()

// The omit rules that several members share.
func noTarget(r *Record) bool { return r.Target == "" }
func unjudged(r *Record) bool { return r.PromptClass == "" }
func noLoad(r *Record) bool   { return r.LoadBucket == "" }
func noEnergy(r *Record) bool { return r.EnergySource == "" }

// The value writers: each returns a member's value func from the field
// it reads.

func str(f func(*Record) string) func([]byte, *Record) []byte {
	return func(b []byte, r *Record) []byte { return appendJSONString(b, f(r)) }
}

func integer(f func(*Record) int64) func([]byte, *Record) []byte {
	return func(b []byte, r *Record) []byte { return strconv.AppendInt(b, f(r), 10) }
}

// count writes a count, null when it is unknown (negative).
func count(f func(*Record) int64) func([]byte, *Record) []byte {
	return func(b []byte, r *Record) []byte {
		if v := f(r); v >= 0 {
			return strconv.AppendInt(b, v, 10)
		}
		return append(b, "null"...)
	}
}

func boolean(v bool) func([]byte, *Record) []byte {
	return func(b []byte, _ *Record) []byte { return strconv.AppendBool(b, v) }
}

// millis writes a duration in milliseconds at µs resolution, null when
// it is undefined (ok false).
func millis(f func(*Record) (time.Duration, bool)) func([]byte, *Record) []byte {
	return func(b []byte, r *Record) []byte {
		if d, ok := f(r); ok {
			return strconv.AppendFloat(b, ms(d), 'f', -1, 64)
		}
		return append(b, "null"...)
	}
}

// rounded writes a float rounded to 1/scale.
func rounded(f func(*Record) float64, scale float64) func([]byte, *Record) []byte {
	return func(b []byte, r *Record) []byte {
		return strconv.AppendFloat(b, math.Round(f(r)*scale)/scale, 'f', -1, 64)
	}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 } // µs resolution

// MarshalJSON writes the documented record schema (docs/records.md): the
// members table, in order, less the members whose omit rule holds.
func (r *Record) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 512+12*len(r.TokenAt))
	b = append(b, '{')
	for i := range members {
		m := &members[i]
		if m.omit != nil && m.omit(r) {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, m.key...)
		b = m.value(b, r)
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as a JSON string, escaped byte for byte as
// encoding/json escapes it (", \\, control characters, <, > and &, U+2028
// and U+2029; invalid UTF-8 as U+FFFD), without allocating.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

type verdictJSON struct {
	Name          string   `json:"name"`
	Qualified     bool     `json:"qualified"`
	Excluded      bool     `json:"excluded,omitempty"`
	Failed        []string `json:"failed"`
	NotApplicable []string `json:"not_applicable"`
	Fluidity      *float64 `json:"fluidity,omitempty"`
}

func verdictsJSON(vs []Verdict) []verdictJSON {
	out := make([]verdictJSON, len(vs))
	for i, v := range vs {
		out[i] = verdictJSON(v)
		if out[i].Failed == nil {
			out[i].Failed = []string{}
		}
		if out[i].NotApplicable == nil {
			out[i].NotApplicable = []string{}
		}
	}
	return out
}

// appendCauses writes the causes as an array of objects: what, cause,
// ms (µs resolution), at_ms (a stall's start, from Arrive; absent for a
// first token) and ref (absent when "").
func (r *Record) appendCauses(b []byte) []byte {
	b = append(b, '[')
	for i := range r.Causes {
		c := &r.Causes[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"what":`...)
		b = appendJSONString(b, c.What)
		b = append(b, `,"cause":`...)
		b = appendJSONString(b, c.Cause)
		b = append(b, `,"ms":`...)
		b = strconv.AppendFloat(b, math.Round(c.Ms*1e3)/1e3, 'f', -1, 64)
		if !c.At.IsZero() {
			b = append(b, `,"at_ms":`...)
			b = strconv.AppendFloat(b, ms(c.At.Sub(r.Arrive)), 'f', -1, 64)
		}
		if c.Ref != "" {
			b = append(b, `,"ref":`...)
			b = appendJSONString(b, c.Ref)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}
