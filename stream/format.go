package stream

import (
	"bytes"
	"strconv"
	"time"
)

// EngineTimes are durations the engine itself reported about one request,
// kept beside the sidecar's own measurements: with them an operator sees
// how much of TTFT was the engine's prefill and how much was queueing and
// the network. Known has one bit per field the engine reported; the
// others are meaningless. record.EngineTimes is this type, with the
// record's JSON.
type EngineTimes struct {
	// Load: loading the model (Ollama's load_duration).
	Load time.Duration
	// Queue: waiting in the engine's queue (TGI's x-queue-time header).
	Queue time.Duration
	// Prompt: evaluating the prompt, the prefill (Ollama's
	// prompt_eval_duration, llama.cpp's timings.prompt_ms).
	Prompt time.Duration
	// Decode: generating the output tokens (Ollama's eval_duration,
	// llama.cpp's timings.predicted_ms).
	Decode time.Duration
	// Inference: prefill and decode together, where the engine does not
	// split them (TGI's x-inference-time header).
	Inference time.Duration
	// Total: the engine's whole handling of the request (Ollama's
	// total_duration, TGI's x-total-time header).
	Total time.Duration
	Known uint8
}

// Bits of EngineTimes.Known.
const (
	EngineLoad uint8 = 1 << iota
	EngineQueue
	EnginePrompt
	EngineDecode
	EngineInference
	EngineTotal
)

// EngineFields are the fields of EngineTimes, by their bit, in the
// record's order; Name is the record's (engine_<Name>_ms).
var EngineFields = [...]struct {
	Bit  uint8
	Name string
}{
	{EngineLoad, "load"},
	{EngineQueue, "queue"},
	{EnginePrompt, "prompt"},
	{EngineDecode, "decode"},
	{EngineInference, "inference"},
	{EngineTotal, "total"},
}

// Field returns the field of one bit of Known; nil for a value that is
// not one of the bits.
func (e *EngineTimes) Field(bit uint8) *time.Duration {
	switch bit {
	case EngineLoad:
		return &e.Load
	case EngineQueue:
		return &e.Queue
	case EnginePrompt:
		return &e.Prompt
	case EngineDecode:
		return &e.Decode
	case EngineInference:
		return &e.Inference
	case EngineTotal:
		return &e.Total
	}
	return nil
}

// Set records one duration the engine reported.
func (e *EngineTimes) Set(bit uint8, d time.Duration) {
	if f := e.Field(bit); f != nil {
		*f = d
		e.Known |= bit
	}
}

// Merge copies the durations src reports into e, keeping e's others.
func (e *EngineTimes) Merge(src *EngineTimes) {
	for _, f := range EngineFields {
		if src.Known&f.Bit != 0 {
			*e.Field(f.Bit) = *src.Field(f.Bit)
			e.Known |= f.Bit
		}
	}
}

// setNanos sets a duration given in integer nanoseconds (Ollama).
func (e *EngineTimes) setNanos(bit uint8, v []byte) {
	if n, ok := intVal(v); ok && n >= 0 {
		e.Set(bit, time.Duration(n))
	}
}

// setMillis sets a duration given in (fractional) milliseconds (llama.cpp).
func (e *EngineTimes) setMillis(bit uint8, v []byte) {
	if f, ok := floatVal(v); ok && f >= 0 && f < 1e12 {
		e.Set(bit, time.Duration(f*1e6))
	}
}

// floatVal parses a JSON number. Plain decimals are read by hand (no
// allocation); an exponent falls back to strconv.
func floatVal(v []byte) (float64, bool) {
	if len(v) == 0 || len(v) > 64 {
		return 0, false
	}
	if bytes.ContainsAny(v, "eE") {
		f, err := strconv.ParseFloat(string(v), 64)
		return f, err == nil
	}
	neg := v[0] == '-'
	if neg {
		v = v[1:]
	}
	var ip, fp, scale float64 = 0, 0, 1
	digits, frac := 0, false
	for _, ch := range v {
		switch {
		case ch >= '0' && ch <= '9':
			digits++
			if frac {
				scale *= 10
				fp = fp*10 + float64(ch-'0')
			} else {
				ip = ip*10 + float64(ch-'0')
			}
		case ch == '.' && !frac:
			frac = true
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	f := ip + fp/scale
	if neg {
		f = -f
	}
	return f, true
}

// boolVal reports whether v is the JSON literal true.
func boolVal(v []byte) bool { return string(v) == "true" }

// nonEmptyStr reports whether v is a JSON string with at least one
// character.
func nonEmptyStr(v []byte) bool {
	s, ok := strVal(v)
	return ok && len(s) > 0
}
