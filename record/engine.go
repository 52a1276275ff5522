package record

import (
	"time"

	"github.com/tokentap/tokentap/stream"
)

// EngineTimes are durations the engine itself reported about the request
// (docs/records.md, engine_* fields), kept beside the sidecar's own
// measurements. They are stream.EngineTimes, the parser's, whose fields
// say what each one is, with the record's JSON: the tap converts the one
// into the other.
type EngineTimes stream.EngineTimes

// Bits of EngineTimes.Known (stream's), in the order the fields are
// written.
const (
	EngineLoad      = stream.EngineLoad
	EngineQueue     = stream.EngineQueue
	EnginePrompt    = stream.EnginePrompt
	EngineDecode    = stream.EngineDecode
	EngineInference = stream.EngineInference
	EngineTotal     = stream.EngineTotal
)

// engineFields are stream.EngineFields with the record's JSON names.
var engineFields = func() (fs [len(stream.EngineFields)]struct {
	bit  uint8
	name string
}) {
	for i, f := range stream.EngineFields {
		fs[i].bit, fs[i].name = f.Bit, "engine_"+f.Name+"_ms"
	}
	return fs
}()

func (e *EngineTimes) get(bit uint8) time.Duration { return *(*stream.EngineTimes)(e).Field(bit) }
