package record

import (
	"strconv"
	"time"
)

// EngineTimes are durations the engine itself reported about the request
// (docs/records.md, engine_* fields), kept beside the sidecar's own
// measurements: with them an operator sees how much of TTFT was the
// engine's prefill and how much was queueing and the network. Known has
// one bit per field the engine reported; the others are meaningless.
// stream.EngineTimes has the same shape (the tap converts one into the
// other).
type EngineTimes struct {
	// Load: loading the model (Ollama's load_duration).
	Load time.Duration
	// Queue: waiting in the engine's queue (TGI's x-queue-time).
	Queue time.Duration
	// Prompt: evaluating the prompt, the prefill (Ollama's
	// prompt_eval_duration, llama.cpp's timings.prompt_ms).
	Prompt time.Duration
	// Decode: generating the output (Ollama's eval_duration, llama.cpp's
	// timings.predicted_ms).
	Decode time.Duration
	// Inference: prefill and decode together where the engine does not
	// split them (TGI's x-inference-time).
	Inference time.Duration
	// Total: the engine's whole handling of the request (Ollama's
	// total_duration, TGI's x-total-time).
	Total time.Duration
	Known uint8
}

// Bits of EngineTimes.Known, in the order the fields are written.
const (
	EngineLoad uint8 = 1 << iota
	EngineQueue
	EnginePrompt
	EngineDecode
	EngineInference
	EngineTotal
)

var engineFields = [...]struct {
	bit  uint8
	name string
}{
	{EngineLoad, "engine_load_ms"},
	{EngineQueue, "engine_queue_ms"},
	{EnginePrompt, "engine_prompt_ms"},
	{EngineDecode, "engine_decode_ms"},
	{EngineInference, "engine_inference_ms"},
	{EngineTotal, "engine_total_ms"},
}

func (e *EngineTimes) get(bit uint8) time.Duration {
	switch bit {
	case EngineLoad:
		return e.Load
	case EngineQueue:
		return e.Queue
	case EnginePrompt:
		return e.Prompt
	case EngineDecode:
		return e.Decode
	case EngineInference:
		return e.Inference
	}
	return e.Total
}

// appendJSON writes the reported fields as "engine_*_ms":v, members, each
// followed by a comma (MarshalJSON's convention).
func (e *EngineTimes) appendJSON(b []byte) []byte {
	for _, f := range engineFields {
		if e.Known&f.bit == 0 {
			continue
		}
		b = append(b, '"')
		b = append(b, f.name...)
		b = append(b, '"', ':')
		b = strconv.AppendFloat(b, ms(e.get(f.bit)), 'f', -1, 64)
		b = append(b, ',')
	}
	return b
}
