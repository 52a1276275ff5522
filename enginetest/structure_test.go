package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
)

// toolsModel is the tiny model with a template that takes tools: it
// renders .Tools, and a past call under {{ if .ToolCalls }} as a JSON
// object. Ollama v0.17.4 reads the tool-calling tag from the text after
// .ToolCalls up to its first "{" (tools/template.go, parseTag): none
// here, so the tag is "{", and an answer that starts with a JSON object
// naming a declared tool with its arguments is a tool call
// (tools/tools.go: findTool finds the name, findArguments the object's
// "arguments" member). Ollama reports the model as able to use tools
// because the template uses .Tools (server/images.go, Capabilities).
const (
	toolsModel     = "tiny-tools"
	toolsModelfile = `FROM ./tiny.gguf
TEMPLATE """{{- if .System }}<|system|>{{ .System }}
{{ end }}{{- if .Tools }}<|tools|>{{ range .Tools }}{{ .Function.Name }} {{ end }}
{{ end }}{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}{{ if .ToolCalls }}{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}{{ end }}{{ end }}
{{ end }}<|assistant|>"""
PARAMETER temperature 0
PARAMETER seed 42
PARAMETER num_thread 1
PARAMETER num_ctx 2048
`
)

// createToolsModel creates toolsModel in the shared Ollama, from the
// same tiny.gguf as the shared model.
func createToolsModel(t *testing.T, w *world) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(w.dir, "Modelfile.tools"), []byte(toolsModelfile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	create := exec.CommandContext(ctx, testtool.Need(t, "ollama"), "create", toolsModel, "-f", "Modelfile.tools")
	create.Env = append(cleanEnv(), "OLLAMA_HOST="+strings.TrimPrefix(w.ollama, "http://"))
	create.Dir = w.dir
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("ollama create %s: %v\n%s\n%s", toolsModel, err, out, w.logTail())
	}
}

// TestStructureForcedToolCall: a real Ollama makes a real tool call, and
// the sidecar checks it (docs/slo.md, "Structure"). The request to
// /api/chat declares get_weather and a JSON-schema format that admits
// only {"name": "get_weather", "arguments": {"city": "paris"}}: Ollama
// constrains the tiny model's output to it by grammar, and its tools
// parser turns the object into message.tool_calls. Declared with a
// parameters schema that the call meets, the check passes and the SLO
// (structure: required) is met; declared with one that it cannot meet
// (a required "days" the format never lets the model write), it fails
// and names tool_args_schema, in the record and in the verdict.
func TestStructureForcedToolCall(t *testing.T) {
	w := setup(t)
	createToolsModel(t, w)
	s := startStructureSidecar(t, w)
	const format = `{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"enum":["paris"]}},"required":["city"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}`
	for _, c := range []struct {
		name, params string
		want         []string
	}{
		{"met", `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`, nil},
		{"unmet", `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"]}`, []string{"tool_args_schema"}},
	} {
		for _, stream := range []bool{true, false} {
			t.Run(c.name+"/"+plain(stream), func(t *testing.T) {
				body := `{"model":"` + toolsModel + `","stream":` + map[bool]string{true: "true", false: "false"}[stream] +
					`,"messages":[{"role":"user","content":"the weather in paris?"}],` +
					`"tools":[{"type":"function","function":{"name":"get_weather","description":"the weather in a city","parameters":` + c.params + `}}],` +
					`"format":` + format + `,"options":{"num_predict":128,"temperature":0,"seed":7}}`
				x := post(t, s.proxy, "/api/chat", body, nil)
				r := s.next(t)
				if x.status != 200 {
					t.Fatalf("status %d: %s", x.status, x.body)
				}
				var calls []string
				for line := range bytes.Lines(x.body) {
					var m struct {
						Message struct {
							ToolCalls []struct {
								Function struct {
									Name      string          `json:"name"`
									Arguments json.RawMessage `json:"arguments"`
								} `json:"function"`
							} `json:"tool_calls"`
						} `json:"message"`
					}
					json.Unmarshal(line, &m)
					for _, tc := range m.Message.ToolCalls {
						calls = append(calls, tc.Function.Name+string(tc.Function.Arguments))
					}
				}
				if !slices.Equal(calls, []string{`get_weather{"city":"paris"}`}) {
					t.Fatalf("Ollama's tool calls %q, want the forced one; body:\n%s", calls, x.body)
				}
				status := "pass"
				if c.want != nil {
					status = "fail"
				}
				var failed []string
				if f, ok := r.raw["structure_failed"].([]any); ok {
					for _, v := range f {
						failed = append(failed, v.(string))
					}
				}
				verdicts, _ := r.raw["slo"].([]any)
				var vFailed []string
				qualified := false
				if len(verdicts) == 1 {
					v := verdicts[0].(map[string]any)
					qualified, _ = v["qualified"].(bool)
					for _, f := range v["failed"].([]any) {
						vFailed = append(vFailed, f.(string))
					}
				}
				if r.Outcome != "success" || r.raw["structure"] != status || !slices.Equal(failed, c.want) ||
					len(verdicts) != 1 || qualified != (c.want == nil) || !slices.Equal(vFailed, c.want) {
					t.Fatalf("record %s: want success, structure %s %v, verdict failed %v", r, status, c.want, c.want)
				}
				if bytes.Contains([]byte(r.String()), []byte("paris")) {
					t.Fatalf("the record holds the call's arguments: %s", r)
				}
				t.Logf("Ollama called %s; record: structure %v %v, verdict qualified %v failed %v", calls[0], r.raw["structure"], failed, qualified, vFailed)
			})
		}
	}
}

// TestStructureFormatOutput: the JSON-schema format path alone
// (output_schema), on /api/generate. Ollama constrains the answer to the
// format's grammar, so an answer that breaks the declared schema needs a
// keyword the grammar does not enforce: llama.cpp's
// json-schema-to-grammar (which Ollama's llm/server.go calls) ignores
// "not", so {"city": "paris"} is generated under a schema that forbids
// it. The check passes on the plain schema and fails, naming
// output_schema, on the one with "not".
func TestStructureFormatOutput(t *testing.T) {
	w := setup(t)
	s := startStructureSidecar(t, w)
	const city = `"type":"object","properties":{"city":{"enum":["paris"]}},"required":["city"],"additionalProperties":false`
	for _, c := range []struct {
		name, format string
		want         []string
	}{
		{"met", `{` + city + `}`, nil},
		{"unmet", `{` + city + `,"not":{"required":["city"]}}`, []string{"output_schema"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"model":"` + modelName + `","stream":true,"prompt":"the weather in paris?","format":` + c.format +
				`,"options":{"num_predict":64,"temperature":0,"seed":7}}`
			x := post(t, s.proxy, "/api/generate", body, nil)
			r := s.next(t)
			var answer strings.Builder
			for line := range bytes.Lines(x.body) {
				var m struct {
					Response string `json:"response"`
				}
				json.Unmarshal(line, &m)
				answer.WriteString(m.Response)
			}
			var got map[string]any
			if x.status != 200 || json.Unmarshal([]byte(answer.String()), &got) != nil || got["city"] != "paris" {
				t.Fatalf("status %d, answer %q: want the forced object", x.status, answer.String())
			}
			status := "pass"
			if c.want != nil {
				status = "fail"
			}
			var failed []string
			if f, ok := r.raw["structure_failed"].([]any); ok {
				for _, v := range f {
					failed = append(failed, v.(string))
				}
			}
			if r.Outcome != "success" || r.raw["structure"] != status || !slices.Equal(failed, c.want) || strings.Contains(r.String(), "paris") {
				t.Fatalf("record %s: want success, structure %s %v, no answer text", r, status, c.want)
			}
			t.Logf("Ollama answered %s; record: structure %v %v", answer.String(), r.raw["structure"], failed)
		})
	}
}

// startStructureSidecar starts a sidecar in front of w whose one SLO,
// answers, requires structure (and any end-to-end time under 10 min).
func startStructureSidecar(t *testing.T, w *world) *sidecar {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "tokentap.yaml")
	if err := os.WriteFile(cfg, []byte(`slo:
  objectives:
    - name: answers
      target: 0.9
      structure: required
      thresholds:
        e2e: 10m
`), 0o644); err != nil {
		t.Fatal(err)
	}
	return startSidecar(t, w, "--config", cfg)
}
