package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// response_id and the engine's durations reach the JSON when set, and
// only then.
func TestResponseIDAndEngineTimesJSON(t *testing.T) {
	r := New(0)
	r.Arrive = time.Unix(1000, 0)
	b, _ := r.MarshalJSON()
	if strings.Contains(string(b), "response_id") || strings.Contains(string(b), "engine_") {
		t.Fatalf("unset fields written: %s", b)
	}
	r.ResponseID = "chatcmpl-7\"x"
	r.Engine = EngineTimes{Prompt: 342546 * time.Microsecond, Decode: 4535599 * time.Microsecond, Load: 0,
		Known: EnginePrompt | EngineDecode | EngineLoad}
	b, _ = r.MarshalJSON()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if m["response_id"] != "chatcmpl-7\"x" || m["engine_prompt_ms"] != 342.546 || m["engine_decode_ms"] != 4535.599 || m["engine_load_ms"] != 0.0 {
		t.Fatalf("got %s", b)
	}
	if _, ok := m["engine_total_ms"]; ok {
		t.Fatalf("engine_total_ms written though not reported: %s", b)
	}
}
