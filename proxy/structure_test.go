package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/structure"
)

// The structure checks (docs/slo.md, "Structure") through the real
// proxy, for every API that has tool calls or a JSON output, each
// response scripted in its API's wire format: a tool call that holds; its
// arguments' JSON split across deltas and never closed; arguments that
// parse but break the tool's declared schema; a tool the request did not
// declare; arguments cut by the token limit; and the same for an output
// asked for as JSON. Each record's structure and structure_failed are
// exact, and so is its verdict under an SLO with structure: required;
// no argument or answer text (the marker) is in the record.

// The tool every request declares, and the output schema a JSON output
// is asked for with.
const (
	toolSchema   = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`
	outputSchema = `{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"],"additionalProperties":false}`
	marker       = "MARKER_7f3a9c"
)

// shape is one scripted answer: a tool call named name (tool) with its
// arguments' text in parts, or an answer text in parts (a JSON output);
// cut: it ended at its token limit.
type shape struct {
	tool  bool
	name  string
	parts []string
	cut   bool
}

// structAPI scripts one API: the request (with the tool declared, or the
// JSON output asked for), and the response body of a shape.
type structAPI struct {
	name, path, ct string
	toolsReq       string // "": the API has no tools
	jsonReq        string // "": no JSON output mode
	objectReq      string // JSON asked for with no schema; "": none
	stringArgs     bool   // the arguments stream as text (else a whole object per call)
	body           func(s shape) string
}

func sseEv(typ, data string) string {
	if typ == "" {
		return "data: " + data + "\n\n"
	}
	return "event: " + typ + "\ndata: " + data + "\n\n"
}

// q is s as a JSON string literal.
func q(s string) string { return strconv.Quote(s) }

var structAPIs = []structAPI{
	{ // OpenAI Chat Completions: the shape of the research notes §A1
		// (tool_calls deltas keyed by index, the name first; finish_reason
		// on a last empty delta; [DONE]).
		name: "chat", path: "/v1/chat/completions", ct: "text/event-stream", stringArgs: true,
		toolsReq:  `{"model":"m","stream":true,"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + toolSchema + `}}]}`,
		jsonReq:   `{"model":"m","stream":true,"messages":[{"role":"user","content":"answer"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":` + outputSchema + `}}}`,
		objectReq: `{"model":"m","stream":true,"messages":[{"role":"user","content":"answer"}],"response_format":{"type":"json_object"}}`,
		body: func(s shape) string {
			chunk := func(delta, finish string) string {
				return sseEv("", `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`+delta+`,"finish_reason":`+finish+`}]}`)
			}
			b := chunk(`{"role":"assistant","content":""}`, "null")
			finish := `"stop"`
			for i, p := range s.parts {
				if s.tool {
					fn := `{"arguments":` + q(p) + `}`
					if i == 0 {
						fn = `{"name":` + q(s.name) + `,"arguments":` + q(p) + `}`
					}
					b += chunk(`{"tool_calls":[{"index":0,`+map[bool]string{true: `"id":"call_1","type":"function",`}[i == 0]+`"function":`+fn+`}]}`, "null")
					finish = `"tool_calls"`
				} else {
					b += chunk(`{"content":`+q(p)+`}`, "null")
				}
			}
			if s.cut {
				finish = `"length"`
			}
			return b + chunk(`{}`, finish) + "data: [DONE]\n\n"
		},
	},
	{ // OpenAI Responses: openapi.yaml's streaming events
		// (response.output_item.added with the function_call item, then
		// response.function_call_arguments.delta keyed by output_index;
		// response.completed, or response.incomplete with
		// incomplete_details.reason max_output_tokens), in Ollama's
		// event:/data: framing (middleware/openai.go).
		name: "responses", path: "/v1/responses", ct: "text/event-stream", stringArgs: true,
		toolsReq: `{"model":"m","stream":true,"input":"weather?","tools":[{"type":"function","name":"get_weather","strict":true,"parameters":` + toolSchema + `}]}`,
		jsonReq:  `{"model":"m","stream":true,"input":"answer","text":{"format":{"type":"json_schema","name":"a","strict":true,"schema":` + outputSchema + `}}}`,
		body: func(s shape) string {
			b := sseEv("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"m","output":[]}}`)
			whole := strings.Join(s.parts, "")
			var item string
			if s.tool {
				b += sseEv("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":`+q(s.name)+`,"arguments":"","status":"in_progress"}}`)
				for i, p := range s.parts {
					b += sseEv("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":`+strconv.Itoa(2+i)+`,"item_id":"fc_1","output_index":0,"delta":`+q(p)+`}`)
				}
				item = `{"type":"function_call","id":"fc_1","call_id":"call_1","name":` + q(s.name) + `,"arguments":` + q(whole) + `,"status":"completed"}`
			} else {
				b += sseEv("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","status":"in_progress","content":[]}}`)
				for i, p := range s.parts {
					b += sseEv("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":`+strconv.Itoa(2+i)+`,"item_id":"msg_1","output_index":0,"content_index":0,"delta":`+q(p)+`,"logprobs":[]}`)
				}
				item = `{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":` + q(whole) + `,"annotations":[]}]}`
			}
			b += sseEv("response.output_item.done", `{"type":"response.output_item.done","sequence_number":90,"output_index":0,"item":`+item+`}`)
			usage := `"usage":{"input_tokens":5,"output_tokens":9,"total_tokens":14}`
			if s.cut {
				return b + sseEv("response.incomplete", `{"type":"response.incomplete","sequence_number":91,"response":{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"model":"m","output":[`+item+`],`+usage+`}}`)
			}
			return b + sseEv("response.completed", `{"type":"response.completed","sequence_number":91,"response":{"id":"resp_1","object":"response","status":"completed","model":"m","output":[`+item+`],`+usage+`}}`)
		},
	},
	{ // Anthropic Messages: content_block_start with a tool_use block
		// (input {}), input_json_delta partial_json deltas keyed by the
		// block's index, message_delta's stop_reason (tool_use, max_tokens);
		// the streaming documentation's shape. No JSON output mode.
		name: "messages", path: "/v1/messages", ct: "text/event-stream", stringArgs: true,
		toolsReq: `{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"weather?"}],"tools":[{"name":"get_weather","description":"the weather","input_schema":` + toolSchema + `}]}`,
		body: func(s shape) string {
			b := sseEv("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`)
			b += sseEv("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":`+q(s.name)+`,"input":{}}}`)
			for _, p := range s.parts {
				b += sseEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":`+q(p)+`}}`)
			}
			b += sseEv("content_block_stop", `{"type":"content_block_stop","index":0}`)
			stop := "tool_use"
			if s.cut {
				stop = "max_tokens"
			}
			return b + sseEv("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+stop+`","stop_sequence":null},"usage":{"output_tokens":12}}`) +
				sseEv("message_stop", `{"type":"message_stop"}`)
		},
	},
	{ // Gemini :streamGenerateContent?alt=sse: a functionCall part holds a
		// whole call ({name, args} as an object); a JSON output
		// (responseMimeType application/json) streams as text parts;
		// finishReason STOP or MAX_TOKENS on the last event
		// (https://ai.google.dev/api/generate-content).
		name: "gemini", path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", ct: "text/event-stream",
		toolsReq:  `{"contents":[{"role":"user","parts":[{"text":"weather?"}]}],"tools":[{"functionDeclarations":[{"name":"get_weather","description":"the weather","parametersJsonSchema":` + toolSchema + `}]}]}`,
		jsonReq:   `{"contents":[{"role":"user","parts":[{"text":"answer"}]}],"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":` + outputSchema + `}}`,
		objectReq: `{"contents":[{"role":"user","parts":[{"text":"answer"}]}],"generationConfig":{"responseMimeType":"application/json"}}`,
		body: func(s shape) string {
			ev := func(part, finish string) string {
				return sseEv("", `{"candidates": [{"content": {"parts": [`+part+`],"role": "model"}`+finish+`,"index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 7,"totalTokenCount": 16},"modelVersion": "gemini-2.5-flash","responseId": "r1"}`)
			}
			finish := `,"finishReason": "STOP"`
			if s.cut {
				finish = `,"finishReason": "MAX_TOKENS"`
			}
			if s.tool {
				return ev(`{"functionCall": {"name": `+q(s.name)+`,"args": `+strings.Join(s.parts, "")+`}}`, finish)
			}
			var b string
			for i, p := range s.parts {
				f := ""
				if i == len(s.parts)-1 {
					f = finish
				}
				b += ev(`{"text": `+q(p)+`}`, f)
			}
			return b
		},
	},
	{ // Ollama /api/chat: NDJSON; tool_calls hold whole calls
		// ({id, function: {index, name, arguments: {...}}}); format asks
		// for JSON; done_reason stop or length on the done line
		// (api/types.go ChatResponse, ToolCall).
		name: "ollama chat", path: "/api/chat", ct: "application/x-ndjson",
		toolsReq:  `{"model":"m","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"the weather","parameters":` + toolSchema + `}}]}`,
		jsonReq:   `{"model":"m","messages":[{"role":"user","content":"answer"}],"format":` + outputSchema + `}`,
		objectReq: `{"model":"m","messages":[{"role":"user","content":"answer"}],"format":"json"}`,
		body: func(s shape) string {
			line := func(msg string) string {
				return `{"model":"m","created_at":"2026-01-01T00:00:00Z","message":` + msg + `,"done":false}` + "\n"
			}
			var b string
			if s.tool {
				b = line(`{"role":"assistant","content":"","tool_calls":[{"id":"call_1","function":{"index":0,"name":` + q(s.name) + `,"arguments":` + strings.Join(s.parts, "") + `}}]}`)
			} else {
				for _, p := range s.parts {
					b += line(`{"role":"assistant","content":` + q(p) + `}`)
				}
			}
			reason := "stop"
			if s.cut {
				reason = "length"
			}
			return b + `{"model":"m","created_at":"2026-01-01T00:00:01Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"` + reason +
				`","total_duration":100,"load_duration":1,"prompt_eval_count":5,"prompt_eval_duration":10,"eval_count":7,"eval_duration":50}` + "\n"
		},
	},
	{ // Ollama /api/generate: format, the answer in response.
		name: "ollama generate", path: "/api/generate", ct: "application/x-ndjson",
		jsonReq:   `{"model":"m","prompt":"answer","format":` + outputSchema + `}`,
		objectReq: `{"model":"m","prompt":"answer","format":"json"}`,
		body: func(s shape) string {
			var b string
			for _, p := range s.parts {
				b += `{"model":"m","created_at":"2026-01-01T00:00:00Z","response":` + q(p) + `,"done":false}` + "\n"
			}
			reason := "stop"
			if s.cut {
				reason = "length"
			}
			return b + `{"model":"m","created_at":"2026-01-01T00:00:01Z","response":"","done":true,"done_reason":"` + reason +
				`","total_duration":100,"load_duration":1,"prompt_eval_count":5,"prompt_eval_duration":10,"eval_count":7,"eval_duration":50}` + "\n"
		},
	},
}

// structCase is one scripted answer and the checks it fails (nil: pass).
type structCase struct {
	name string
	req  func(a structAPI) string
	s    shape
	want []string
}

func structCases(a structAPI) []structCase {
	tools := func(a structAPI) string { return a.toolsReq }
	asJSON := func(a structAPI) string { return a.jsonReq }
	var cs []structCase
	if a.toolsReq != "" {
		cs = append(cs,
			structCase{"tool valid", tools, shape{tool: true, name: "get_weather", parts: []string{`{"city":`, `"` + marker + `"}`}}, nil},
			structCase{"tool schema", tools, shape{tool: true, name: "get_weather", parts: []string{`{"town":"` + marker + `"}`}}, []string{structure.ToolArgsSchema}},
			structCase{"tool unknown", tools, shape{tool: true, name: marker + "_tool", parts: []string{`{}`}}, []string{structure.UnknownTool}},
		)
		if a.stringArgs { // arguments that stream as text can break, or be cut
			cs = append(cs,
				structCase{"tool invalid json", tools, shape{tool: true, name: "get_weather", parts: []string{`{"city":`, `"` + marker + `"`}}, []string{structure.ToolArgsInvalidJSON}},
				structCase{"tool cut", tools, shape{tool: true, name: "get_weather", parts: []string{`{"city":`, `"` + marker[:4]}, cut: true}, []string{structure.TruncatedJSON}},
			)
		}
	}
	if a.jsonReq != "" {
		cs = append(cs,
			structCase{"output valid", asJSON, shape{parts: []string{`{"answer":`, `"` + marker + `"}`}}, nil},
			structCase{"output invalid json", asJSON, shape{parts: []string{`{"answer":`, `"` + marker + `"`}}, []string{structure.OutputInvalidJSON}},
			structCase{"output schema", asJSON, shape{parts: []string{`{"other":"` + marker + `"}`}}, []string{structure.OutputSchema}},
			structCase{"output cut", asJSON, shape{parts: []string{`{"answer":`, `"` + marker[:4]}, cut: true}, []string{structure.TruncatedJSON}},
		)
	}
	if a.objectReq != "" { // any JSON: parses or not, no schema
		obj := func(a structAPI) string { return a.objectReq }
		cs = append(cs,
			structCase{"object valid", obj, shape{parts: []string{`{"other":`, `"` + marker + `"}`}}, nil},
			structCase{"object invalid json", obj, shape{parts: []string{`{"other":`, `"` + marker}}, []string{structure.OutputInvalidJSON}},
		)
	}
	return cs
}

// structFront is front with the structure checks on and the verdict of
// one SLO that requires them (its only threshold an E2E of a minute,
// which every answer here meets), as the sidecar wires them.
func structFront(t *testing.T, up http.Handler) (*httptest.Server, *collect) {
	t.Helper()
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
	opts := Options{Structure: &structure.Checker{}}
	opts.Upstream, _ = url.Parse(us.URL)
	var sink collect
	judge := slo.NewJudge(slo.Config{Objectives: []slo.Objective{{Name: "answers", Target: 0.9, Structure: config.StructureRequired,
		Thresholds: slo.Thresholds{E2E: time.Minute}}}})
	opts.Pipeline = pipeline.New(pipeline.Options{Judge: judge, Sinks: []record.Sink{&sink}})
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	fs := httptest.NewServer(p)
	t.Cleanup(fs.Close)
	return fs, &sink
}

func TestStructureChecksEveryAPI(t *testing.T) {
	for _, a := range structAPIs {
		for _, c := range structCases(a) {
			t.Run(a.name+"/"+c.name, func(t *testing.T) {
				body := a.body(c.s)
				up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", a.ct)
					// One write per event: the deltas arrive apart.
					for ev := range strings.SplitAfterSeq(body, "\n") {
						w.Write([]byte(ev))
						w.(http.Flusher).Flush()
					}
				})
				fs, sink := structFront(t, up)
				resp, got := do(t, fs, a.path, c.req(a))
				if resp.StatusCode != 200 || got != body {
					t.Fatalf("status %d; the client got %q, want the engine's bytes", resp.StatusCode, got)
				}
				r := only(t, sink)
				wantStatus := structure.Pass
				if c.want != nil {
					wantStatus = structure.Fail
				}
				if r.Structure != wantStatus || !slices.Equal(r.StructureFailed, c.want) || r.Outcome != "success" {
					t.Fatalf("outcome %s finish %q structure %q %v, want success, %q %v", r.Outcome, r.FinishReason, r.Structure, r.StructureFailed, wantStatus, c.want)
				}
				if len(r.SLO) != 1 || r.SLO[0].Qualified != (c.want == nil) || !slices.Equal(r.SLO[0].Failed, c.want) {
					t.Fatalf("verdicts %+v, want qualified %v, failed exactly %v", r.SLO, c.want == nil, c.want)
				}
				if b, _ := r.MarshalJSON(); strings.Contains(string(b), marker[:4]) {
					t.Fatalf("content in the record: %s", b)
				}
			})
		}
	}
}

// TestStructureChecksWholeBodies: a whole (not streamed) answer's tool
// call, in each API's response object, is checked as a stream's is.
func TestStructureChecksWholeBodies(t *testing.T) {
	byName := map[string]structAPI{}
	for _, a := range structAPIs {
		byName[a.name] = a
	}
	usage := `"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}`
	for _, c := range []struct{ api, path, body string }{
		{"chat", "/v1/chat/completions", `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
			`"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":%s}}]},"finish_reason":"tool_calls"}],` + usage + `}`},
		// Parallel calls: a whole message's carry no index, and each is a
		// call of its own (they were pooled into one, whose arguments
		// were two objects end to end: never valid JSON).
		{"chat", "/v1/chat/completions", `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
			`"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":%s}},` +
			`{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":%s}}]},"finish_reason":"tool_calls"}],` + usage + `}`},
		// SGLang's non-streamed parallel calls each carry "index":-1
		// (https://docs.sglang.io/advanced_features/tool_parser.html):
		// still a call each, not one keyed by the index.
		{"chat", "/v1/chat/completions", `{"id":"70d690c8","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"I will look.",` +
			`"tool_calls":[{"id":"call_1","index":-1,"type":"function","function":{"name":"get_weather","arguments":%s}},` +
			`{"id":"call_2","index":-1,"type":"function","function":{"name":"get_weather","arguments":%s}}],"reasoning_content":null},"logprobs":null,"finish_reason":"tool_calls","matched_stop":null}],` + usage + `}`},
		// TGI before 3.2.0: the arguments as the object itself
		// (huggingface/text-generation-inference #3076).
		{"chat", "/v1/chat/completions", `{"object":"chat.completion","id":"","created":1,"model":"m","system_fingerprint":"3.1.1-native","choices":[{"index":0,"message":{"role":"assistant",` +
			`"tool_calls":[{"id":"0","type":"function","function":{"description":null,"name":"get_weather","arguments":%o}}]},"logprobs":null,"finish_reason":"stop"}],` + usage + `}`},
		{"responses", "/v1/responses", `{"id":"resp_1","object":"response","status":"completed","model":"m","output":[{"type":"function_call","id":"fc_1","call_id":"call_1",` +
			`"name":"get_weather","arguments":%s,"status":"completed"}],"usage":{"input_tokens":5,"output_tokens":9,"total_tokens":14}}`},
		{"messages", "/v1/messages", `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":%o}],` +
			`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":12}}`},
		{"gemini", "/v1beta/models/gemini-2.5-flash:generateContent", `{"candidates": [{"content": {"parts": [{"functionCall": {"name": "get_weather","args": %o}}],"role": "model"},` +
			`"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 7,"totalTokenCount": 16},"modelVersion": "gemini-2.5-flash","responseId": "r1"}`},
		{"ollama chat", "/api/chat", `{"model":"m","created_at":"2026-01-01T00:00:01Z","message":{"role":"assistant","content":"","tool_calls":[{"id":"call_1","function":{"index":0,` +
			`"name":"get_weather","arguments":%o}}]},"done":true,"done_reason":"stop","total_duration":100,"prompt_eval_count":5,"eval_count":7}`},
	} {
		for _, args := range []struct {
			json string
			want []string
		}{{`{"city":"` + marker + `"}`, nil}, {`{"town":"` + marker + `"}`, []string{structure.ToolArgsSchema}}} {
			t.Run(c.api, func(t *testing.T) {
				body := strings.NewReplacer("%s", q(args.json), "%o", args.json).Replace(c.body)
				up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.Write([]byte(body))
				})
				req := strings.Replace(byName[c.api].toolsReq, `"stream":true`, `"stream":false`, 1)
				if strings.HasPrefix(c.api, "ollama") {
					req = strings.Replace(req, `{"model":"m",`, `{"model":"m","stream":false,`, 1)
				}
				fs, sink := front(t, up, Options{Structure: &structure.Checker{}})
				do(t, fs, c.path, req)
				r := only(t, sink)
				wantStatus := structure.Pass
				if args.want != nil {
					wantStatus = structure.Fail
				}
				if r.Stream || r.Structure != wantStatus || !slices.Equal(r.StructureFailed, args.want) {
					t.Fatalf("stream %v structure %q %v, want a whole body, %q %v", r.Stream, r.Structure, r.StructureFailed, wantStatus, args.want)
				}
			})
		}
	}
}

// TestStructureRealShapes: answers in shapes real servers send, through
// the real proxy, are judged as the answers they are.
func TestStructureRealShapes(t *testing.T) {
	for _, c := range []struct {
		name, path, ct, req, body string
		status, why               string
	}{
		// A recorded Anthropic stream whose one tool use is the server's
		// web search (vercel/ai packages/anthropic/src/__fixtures__/
		// anthropic-web-search-tool.1.chunks.txt, its results cut short):
		// its input streams as input_json_delta, and is no call of the
		// client's (it was read as one with no name: unknown_tool).
		{"anthropic web search", "/v1/messages", "text/event-stream",
			`{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"news?"}],"tools":[{"name":"get_weather","input_schema":` + toolSchema + `},{"type":"web_search_20250305","name":"web_search","max_uses":5}]}`,
			sseEv("message_start", `{"type":"message_start","message":{"id":"msg_01LHpEgU4KbfgXGVi3UtHQY1","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2037,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}`) +
				sseEv("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_01Bj5uzzLcYG5hfueSLcDH8k","name":"web_search","input":{}}}`) +
				sseEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`) +
				sseEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"t"}}`) +
				sseEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"ech news today\"}"}}`) +
				sseEv("content_block_stop", `{"type":"content_block_stop","index":0}`) +
				sseEv("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01Bj5uzzLcYG5hfueSLcDH8k","content":[{"type":"web_search_result","title":"t","url":"https://example.com/","encrypted_content":"Erke","page_age":null}]}}`) +
				sseEv("content_block_stop", `{"type":"content_block_stop","index":1}`) +
				sseEv("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}`) +
				sseEv("content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":"`+marker+`"}}`) +
				sseEv("content_block_stop", `{"type":"content_block_stop","index":2}`) +
				sseEv("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":88}}`) +
				sseEv("message_stop", `{"type":"message_stop"}`),
			structure.Pass, ""},
		// llama.cpp's Responses stream of two parallel calls: no
		// output_index on its events, each call whole before the next
		// (ggml-org/llama.cpp tools/server/server-task.cpp,
		// to_json_oaicompat_resp); they were one call.
		{"llama.cpp responses parallel calls", "/v1/responses", "text/event-stream",
			`{"model":"m","stream":true,"input":"weather?","tools":[{"type":"function","name":"get_weather","parameters":` + toolSchema + `}]}`,
			sseEv("response.created", `{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress"}}`) +
				sseEv("response.in_progress", `{"type":"response.in_progress","response":{"id":"resp_1","object":"response","status":"in_progress"}}`) +
				sseEv("response.output_item.added", `{"type":"response.output_item.added","item":{"id":"fc_a1","arguments":"","call_id":"call_a1","name":"get_weather","type":"function_call","status":"in_progress"}}`) +
				sseEv("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","delta":"{\"city\":","item_id":"fc_a1"}`) +
				sseEv("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","delta":"\"`+marker+`\"}","item_id":"fc_a1"}`) +
				sseEv("response.output_item.added", `{"type":"response.output_item.added","item":{"id":"fc_b2","arguments":"","call_id":"call_b2","name":"get_weather","type":"function_call","status":"in_progress"}}`) +
				sseEv("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","delta":"{\"city\":\"Rome\"}","item_id":"fc_b2"}`) +
				sseEv("response.completed", `{"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","model":"m","output":[`+
					`{"type":"function_call","id":"fc_a1","call_id":"call_a1","name":"get_weather","arguments":"{\"city\":\"`+marker+`\"}","status":"completed"},`+
					`{"type":"function_call","id":"fc_b2","call_id":"call_b2","name":"get_weather","arguments":"{\"city\":\"Rome\"}","status":"completed"}],`+
					`"usage":{"input_tokens":5,"output_tokens":20,"total_tokens":25}}}`),
			structure.Pass, ""},
		// Gemini's candidateCount 2 (https://ai.google.dev/api/rest/v1beta/GenerationConfig):
		// two valid JSON answers, not one invalid text.
		{"gemini two candidates", "/v1beta/models/gemini-2.5-flash:generateContent", "application/json",
			`{"contents":[{"role":"user","parts":[{"text":"answer"}]}],"generationConfig":{"candidateCount":2,"responseMimeType":"application/json","responseJsonSchema":` + outputSchema + `}}`,
			`{"candidates": [{"content": {"parts": [{"text": "{\"answer\": \"` + marker + `\"}"}],"role": "model"},"finishReason": "STOP","avgLogprobs": -0.01},` +
				`{"content": {"parts": [{"text": "{\"answer\": \"b\"}"}],"role": "model"},"finishReason": "STOP","index": 1,"avgLogprobs": -0.02}],` +
				`"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 12,"totalTokenCount": 21},"modelVersion": "gemini-2.5-flash","responseId": "r1"}`,
			structure.Unchecked, structure.WhyChoices},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.ct)
				w.Write([]byte(c.body))
			})
			fs, sink := front(t, up, Options{Structure: &structure.Checker{}})
			resp, got := do(t, fs, c.path, c.req)
			if resp.StatusCode != 200 || got != c.body {
				t.Fatalf("status %d; the client got %q, want the engine's bytes", resp.StatusCode, got)
			}
			r := only(t, sink)
			if r.Outcome != "success" || r.Structure != c.status || r.StructureFailed != nil || r.StructureUnchecked != c.why {
				t.Fatalf("outcome %s structure %q %v unchecked %q, want success, %q, unchecked %q", r.Outcome, r.Structure, r.StructureFailed, r.StructureUnchecked, c.status, c.why)
			}
		})
	}
}
