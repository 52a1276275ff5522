package proxy

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/structure"
)

// TestStructureChecksChat: a chat stream's tool call, assembled from its
// deltas, is checked against the declared tool; the record keeps only
// the names of the checks.
func TestStructureChecksChat(t *testing.T) {
	const req = `{"model":"m","stream":true,"messages":[],"tools":[{"type":"function","function":{"name":"get_weather",
		"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}}}]}`
	ev := func(name, args string) string {
		return `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"` + name + `","arguments":` + args + `}}]}}]}` + "\n\n"
	}
	for _, c := range []struct {
		name, body, finish string
		want               []string
	}{
		{"valid", ev("get_weather", `"{\"city\":"`) + ev("", `"\"MARKER\"}"`), "tool_calls", nil},
		{"invalid json", ev("get_weather", `"{\"city\":"`) + ev("", `"\"MARKER\""`), "tool_calls", []string{structure.ToolArgsInvalidJSON}},
		{"schema", ev("get_weather", `"{\"town\":\"MARKER\"}"`), "tool_calls", []string{structure.ToolArgsSchema}},
		{"unknown", ev("MARKER_tool", `"{}"`), "tool_calls", []string{structure.UnknownTool}},
		{"cut", ev("get_weather", `"{\"city\":\"MARK"`), "length", []string{structure.TruncatedJSON}},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write([]byte(c.body + `data: {"choices":[{"index":0,"delta":{},"finish_reason":"` + c.finish + `"}]}` + "\n\ndata: [DONE]\n\n"))
			})
			fs, sink := front(t, up, Options{Structure: &structure.Checker{}})
			do(t, fs, "/v1/chat/completions", req)
			r := only(t, sink)
			wantStatus := structure.Pass
			if c.want != nil {
				wantStatus = structure.Fail
			}
			if r.Structure != wantStatus || !slices.Equal(r.StructureFailed, c.want) {
				t.Fatalf("structure %q %v, want %q %v", r.Structure, r.StructureFailed, wantStatus, c.want)
			}
			if b, _ := r.MarshalJSON(); strings.Contains(string(b), "MARK") {
				t.Fatalf("content in the record: %s", b)
			}
		})
	}
}
