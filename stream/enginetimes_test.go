package stream

import (
	"testing"
	"time"
)

// Merge copies the reported fields only; Field covers every bit of
// EngineFields and no other value.
func TestEngineTimesMerge(t *testing.T) {
	var dst, src EngineTimes
	dst.Set(EngineLoad, 1)
	dst.Set(EngineTotal, 2)
	src.Set(EngineTotal, 5)
	src.Set(EngineQueue, 3)
	src.Decode = 9 // not reported: Known lacks its bit
	dst.Merge(&src)
	want := EngineTimes{Load: 1, Queue: 3, Total: 5, Known: EngineLoad | EngineQueue | EngineTotal}
	if dst != want {
		t.Fatalf("merged %+v, want %+v", dst, want)
	}
	var all uint8
	for _, f := range EngineFields {
		if dst.Field(f.Bit) == nil {
			t.Errorf("no field for %s", f.Name)
		}
		all |= f.Bit
	}
	if dst.Field(1<<6) != nil || all != EngineLoad|EngineQueue|EnginePrompt|EngineDecode|EngineInference|EngineTotal {
		t.Errorf("EngineFields bits %b", all)
	}
	var e EngineTimes
	e.Set(1<<7, time.Second)
	if e.Known != 0 {
		t.Errorf("an unknown bit was set: %+v", e)
	}
}
