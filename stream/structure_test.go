package stream

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
)

// collectFormats are the formats FuzzParseCollect picks from.
var collectFormats = []Format{FormatOpenAI, FormatResponses, FormatMessages, FormatOllama, FormatGemini, FormatTGI, FormatLlamaCpp}

// collectSeeds are payloads that carry tool calls and answer text in
// each format: the seeds of FuzzParseCollect (also in
// testdata/fuzz/FuzzParseCollect), by index in collectFormats.
var collectSeeds = []struct {
	format int
	data   string
}{
	{0, `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]},"finish_reason":null}]}`},
	{0, `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Par\u00e9s\"}"}}]},"finish_reason":null}]}`},
	{0, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`},
	{1, `{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":""}}`},
	{1, `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"city\":\"x\"}"}`},
	{1, `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"{\"answer\":"}`},
	{2, `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`},
	{2, `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"x"}}`},
	{3, `{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"x"}}}]},"done":false}`},
	{3, `{"model":"m","response":"{\"a\":","done":false}`},
	{4, `{"candidates":[{"content":{"parts":[{"functionCall":{"name":"get_weather","args":{"city":"x"}}},{"text":"{}"}],"role":"model"},"index":0}]}`},
	{5, `{"index":3,"token":{"id":5,"text":" x","logprob":-0.3,"special":false}}`},
	{6, `{"index":0,"content":" x","stop":false}`},
}

// FuzzParseCollect: whatever the payload, a Collector never changes what
// the parse reads (the Chunk is the one Parse gives), never holds more
// than its bound of text and arguments together, nor more than MaxCalls
// calls, nor a name over 256 bytes; fed the payload again, the bound
// still holds; and released, it comes back empty.
func FuzzParseCollect(f *testing.F) {
	for _, s := range collectSeeds {
		f.Add(uint8(s.format), []byte(s.data), uint16(64))
		f.Add(uint8(s.format), []byte(s.data), uint16(8))
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte, max uint16) {
		format := collectFormats[int(which)%len(collectFormats)]
		var plain, collected Chunk
		Parse(format, data, &plain)
		col := NewCollector(int(max), true)
		defer col.Release()
		ParseCollect(format, data, &collected, col)
		if !reflect.DeepEqual(plain, collected) {
			t.Fatalf("%v %q: the chunk read with a Collector differs:\n%+v\n%+v", format, data, collected, plain)
		}
		for range 3 {
			held := len(col.Text())
			for _, c := range col.Calls() {
				held += len(c.Args)
				if len(c.Name) > 256 {
					t.Fatalf("%v %q: a name of %d bytes", format, data, len(c.Name))
				}
			}
			if held > int(max) || len(col.Calls()) > MaxCalls {
				t.Fatalf("%v %q: %d bytes held, %d calls, bound %d", format, data, held, len(col.Calls()), max)
			}
			ParseCollect(format, data, &collected, col)
		}
		col.Release()
		col = NewCollector(int(max), true)
		if len(col.Text()) != 0 || len(col.Calls()) != 0 || col.Over() || col.Multi() {
			t.Fatalf("a released Collector came back holding %q, %d calls", col.Text(), len(col.Calls()))
		}
	})
}

// TestParseCollectAssembles: the deltas of one call, keyed by their
// index, assemble into its arguments unescaped; a call sent whole is a
// call of its own.
func TestParseCollectAssembles(t *testing.T) {
	col := NewCollector(1<<10, true)
	defer col.Release()
	var c Chunk
	for _, s := range collectSeeds[:2] {
		ParseCollect(FormatOpenAI, []byte(s.data), &c, col)
	}
	ParseCollect(FormatOllama, []byte(collectSeeds[8].data), &c, col)
	calls := col.Calls()
	if len(calls) != 3 || string(calls[0].Name) != "get_weather" || string(calls[0].Args) != `{"city":` ||
		string(calls[1].Args) != `"Parés"}` || string(calls[2].Name) != "get_weather" || string(calls[2].Args) != `{"city":"x"}` {
		t.Fatalf("calls %+v", calls)
	}
}

// FuzzDeclared: whatever a request body holds, what each API reads of
// its declarations is bounded and well formed: at most
// MaxDeclaredTools tools, each named, each schema a JSON object or a
// boolean, an output schema only with a JSON output.
func FuzzDeclared(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}}`,
		`{"tools":[{"type":"function","name":"f\u00e9","parameters":{}}],"text":{"format":{"type":"json_object"}}}`,
		`{"tools":[{"name":"t","input_schema":{"type":"object"}}]}`,
		`{"tools":[{"functionDeclarations":[{"name":"g","parameters":{"type":"OBJECT"}}]}],"generationConfig":{"responseMimeType":"application/json","responseSchema":{"type":"OBJECT"}}}`,
		`{"model":"m","format":"json","tools":[{"function":{"name":"a"}},{"function":{"name":""}}]}`,
		`{"format":{"type":"object"},"tools":[1,"x",{"function":{"name":1}}]}`,
		`{"tools":[{"type":"function","function":{"name":"f","parameters":false}}],"response_format":{"type":"json_schema","json_schema":{"schema":true}}}`,
	} {
		for i := range 6 {
			f.Add(uint8(i), []byte(s))
		}
	}
	var declaring []*API
	for _, a := range APIs() {
		if a.Request.Declares != nil {
			declaring = append(declaring, a)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		a := declaring[int(which)%len(declaring)]
		d := a.Request.Declares(func(k string) []byte { return member(body, k) })
		maybe := d.Maybe()
		d.ReadTools()
		if d.Any() && !maybe {
			t.Fatalf("%s %q: declares %d tools, JSON %v, but Maybe said no", a.Name, body, len(d.Tools), d.JSON)
		}
		if len(d.Tools) > MaxDeclaredTools || (d.Schema != nil && (!d.JSON || !isSchema(d.Schema))) {
			t.Fatalf("%s %q: %d tools, JSON %v schema %q", a.Name, body, len(d.Tools), d.JSON, d.Schema)
		}
		for _, tl := range d.Tools {
			if tl.Name == "" || (tl.Schema != nil && !isSchema(tl.Schema)) {
				t.Fatalf("%s %q: tool %q schema %q", a.Name, body, tl.Name, tl.Schema)
			}
		}
	})
}

// TestDeclaredBooleanSchemas: a schema may be a boolean (true: every
// instance is valid, false: none), and each API's declarations keep it
// as one, for a tool's parameters and for the output.
func TestDeclaredBooleanSchemas(t *testing.T) {
	for _, c := range []struct{ api, body string }{
		{NameChat, `{"tools":[{"type":"function","function":{"name":"f","parameters":%s}}],"response_format":{"type":"json_schema","json_schema":{"schema":%[1]s}}}`},
		{NameResponses, `{"tools":[{"type":"function","name":"f","parameters":%s}],"text":{"format":{"type":"json_schema","schema":%[1]s}}}`},
		{NameMessages, `{"tools":[{"name":"f","input_schema":%s}]}`},
		{NameGemini, `{"tools":[{"functionDeclarations":[{"name":"f","parametersJsonSchema":%s}]}],"generationConfig":{"responseMimeType":"application/json","responseJsonSchema":%[1]s}}`},
	} {
		a := LookupAPI(c.api)
		if a == nil || a.Request.Declares == nil {
			t.Fatalf("no API %q declaring tools", c.api)
		}
		for _, b := range []string{"true", "false"} {
			body := []byte(fmt.Sprintf(c.body, b))
			d := a.Request.Declares(func(k string) []byte { return member(body, k) })
			d.ReadTools()
			if len(d.Tools) != 1 || string(d.Tools[0].Schema) != b || (c.api != NameMessages && string(d.Schema) != b) {
				t.Errorf("%s, schema %s: tools %+v, output schema %q", c.api, b, d.Tools, d.Schema)
			}
		}
	}
}

// refTools is how the tools were read before the one-pass walk, each
// path looked up apart (member), kept as the reference the walk must
// agree with.
func refTools(tools []byte, names, schemas []string) (out []DeclaredTool) {
	eachElement(tools, func(t []byte) bool {
		if len(out) == MaxDeclaredTools {
			return false
		}
		var dt DeclaredTool
		for _, n := range names {
			if v := member(t, n); v != nil {
				dt.Name = str(v)
				break
			}
		}
		for _, p := range schemas {
			if v := member(t, p); isSchema(v) {
				dt.Schema = v
				break
			}
		}
		if dt.Name != "" {
			out = append(out, dt)
		}
		return true
	})
	return out
}

// FuzzToolsOnePass: the one-pass walk (walkTools, readGeminiTools)
// reads the same tools as looking each path up apart (refTools), on any
// bytes: each API's paths, duplicate keys, malformed elements, values
// that are not objects where a path goes through them.
func FuzzToolsOnePass(f *testing.F) {
	for _, s := range []string{
		`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`,
		`[{"function":1,"function":{"name":"f"}},{"function":{"name":"g","name":"h","parameters":true}}]`,
		`[{"name":"a","input_schema":{},"parameters":false},{"name":"b"} , {"name":`,
		`[{"functionDeclarations":[{"name":"g","parameters":{"type":"OBJECT"},"parametersJsonSchema":{}}]},{"functionDeclarations":[{"name":"x"}],"functionDeclarations":[{"name":"y"}]}]`,
		`[{"functionDeclarations":[{"name":"g"}],"x":]`,
	} {
		for i := range 4 {
			f.Add(uint8(i), []byte(s))
		}
	}
	sets := [][2][]string{
		{{"function.name"}, {"function.parameters"}},
		{{"name"}, {"parameters"}},
		{{"name"}, {"input_schema"}},
	}
	f.Fuzz(func(t *testing.T, which uint8, tools []byte) {
		var d Declared
		var want []DeclaredTool
		if i := int(which) % 4; i < len(sets) {
			d.addTools(tools, sets[i][0], sets[i][1])
			want = refTools(tools, sets[i][0], sets[i][1])
		} else {
			readGeminiTools(&d, tools)
			eachElement(tools, func(e []byte) bool {
				want = append(want, refTools(member(e, "functionDeclarations"), []string{"name"}, []string{"parametersJsonSchema", "parameters"})...)
				return len(want) < MaxDeclaredTools
			})
			want = want[:min(len(want), MaxDeclaredTools)]
		}
		if len(d.Tools) != len(want) {
			t.Fatalf("%q: %d tools, the reference %d: %+v against %+v", tools, len(d.Tools), len(want), d.Tools, want)
		}
		for i := range want {
			if d.Tools[i].Name != want[i].Name || !bytes.Equal(d.Tools[i].Schema, want[i].Schema) {
				t.Fatalf("%q: tool %d %+v, the reference %+v", tools, i, d.Tools[i], want[i])
			}
		}
	})
}

// TestToolCallKeys: each tool call is assembled under its own key. A
// whole message's tool_calls carry no index, and each element is a call
// of its own (they were pooled as call 0: two valid calls made one
// invalid, `{"a":1}{"b":2}`); an index the parser does not read is one
// call, never pooled with a call it read.
func TestToolCallKeys(t *testing.T) {
	type call struct{ name, args string }
	for _, tc := range []struct {
		name     string
		format   Format
		payloads []string
		want     []call
	}{
		{"whole message, parallel calls", FormatOpenAI, []string{
			`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","tool_calls":[` +
				`{"id":"a","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},` +
				`{"id":"b","type":"function","function":{"name":"g","arguments":"{\"b\":2}"}}]},"finish_reason":"tool_calls"}]}`,
		}, []call{{"f", `{"a":1}`}, {"g", `{"b":2}`}}},
		// SGLang's non-streamed answer (Qwen2.5, two parallel calls to one
		// tool) puts "index":-1 on every call
		// (https://docs.sglang.io/advanced_features/tool_parser.html,
		// "Non-stream response"): keyed by it, the two were one call.
		{"whole message, an index on every call", FormatOpenAI, []string{
			`{"id":"70d690c828e941cd93dadd33a3ef089a","object":"chat.completion","created":1756878542,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,` +
				`"message":{"role":"assistant","content":"To determine the current weather in Boston, I will use the get_current_weather function.","tool_calls":[` +
				`{"id":"call_a77925c9acd240229bc0c5a6","index":-1,"type":"function","function":{"name":"get_current_weather","arguments":"{\"city\": \"Boston\", \"state\": \"MA\", \"unit\": \"celsius\"}"}},` +
				`{"id":"call_e019c1c5f36e4f75a87c369d","index":-1,"type":"function","function":{"name":"get_current_weather","arguments":"{\"city\": \"Boston\", \"state\": \"MA\", \"unit\": \"fahrenheit\"}"}}],` +
				`"reasoning_content":null},"logprobs":null,"finish_reason":"tool_calls","matched_stop":null}],` +
				`"usage":{"prompt_tokens":281,"total_tokens":420,"completion_tokens":139,"prompt_tokens_details":null,"reasoning_tokens":0},"metadata":{"weight_version":"default"}}`,
		}, []call{{"get_current_weather", `{"city": "Boston", "state": "MA", "unit": "celsius"}`}, {"get_current_weather", `{"city": "Boston", "state": "MA", "unit": "fahrenheit"}`}}},
		// TGI before 3.2.0 sent a whole call's arguments as the object
		// itself (huggingface/text-generation-inference #3076, the test it
		// changed in router/src/lib.rs): read as a string, they were none.
		{"whole message, arguments as an object (TGI before 3.2)", FormatOpenAI, []string{
			`{"object":"chat.completion","id":"","created":1,"model":"m","system_fingerprint":"3.1.1-native","choices":[{"index":0,"message":{"role":"assistant",` +
				`"tool_calls":[{"id":"0","type":"function","function":{"description":null,"name":"myfn","arguments":{"format":"csv"}}}]},"logprobs":null,"finish_reason":"stop"}]}`,
		}, []call{{"myfn", `{"format":"csv"}`}}},
		{"stream deltas continue by index", FormatOpenAI, []string{
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\""}},{"index":1,"function":{"name":"g","arguments":""}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"function":{"arguments":"{}"}}]}}]}`,
		}, []call{{"f", `{"a":1}`}, {"g", `{}`}}},
		{"unread indices are one call apart from 0", FormatOpenAI, []string{
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1000000000000000000,"function":{"name":"x","arguments":"["}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":-2,"function":{"arguments":"1"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":"0","function":{"arguments":"]"}}]}}]}`,
		}, []call{{"f", `{}`}, {"x", `[1]`}}},
		{"legacy function_call is call 0", FormatOpenAI, []string{
			`{"choices":[{"index":0,"delta":{"function_call":{"name":"f","arguments":"{\"a\""}}}]}`,
			`{"choices":[{"index":0,"delta":{"function_call":{"arguments":":1}"}}}]}`,
		}, []call{{"f", `{"a":1}`}}},
		{"Anthropic block index", FormatMessages, []string{
			`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`,
			`{"type":"content_block_start","index":1.5,"content_block":{"type":"tool_use","id":"u","name":"g","input":{}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}`,
			`{"type":"content_block_delta","index":1.5,"delta":{"type":"input_json_delta","partial_json":"[]"}}`,
		}, []call{{"f", `{}`}, {"g", `[]`}}},
		// A server tool's input streams as input_json_delta too, under its
		// own block's index (vercel/ai packages/anthropic/src/__fixtures__/
		// anthropic-web-search-with-tool.1.chunks.txt): no call of the
		// client's, where it was read as one with no name.
		{"Anthropic server tool input is no call", FormatMessages, []string{
			`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01SaveResults","name":"save_results","input":{}}}`,
			`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`,
			`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"filename\": \"news.txt\"}"}}`,
			`{"type":"content_block_stop","index":1}`,
			`{"type":"content_block_start","index":2,"content_block":{"type":"server_tool_use","id":"srvtoolu_01WebSearch","name":"web_search","input":{}}}`,
			`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}`,
			`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"latest news\"}"}}`,
			`{"type":"content_block_stop","index":2}`,
		}, []call{{"save_results", `{"filename": "news.txt"}`}}},
		// llama.cpp's Responses stream names no output_index, and sends
		// each call whole before the next (ggml-org/llama.cpp
		// tools/server/server-task.cpp, to_json_oaicompat_resp): keyed 0,
		// two parallel calls were one.
		{"Responses without output_index", FormatResponses, []string{
			`{"type":"response.output_item.added","item":{"id":"fc_a1","arguments":"","call_id":"call_a1","name":"get_weather","type":"function_call","status":"in_progress"}}`,
			`{"type":"response.function_call_arguments.delta","delta":"{\"city\":","item_id":"fc_a1"}`,
			`{"type":"response.function_call_arguments.delta","delta":"\"Paris\"}","item_id":"fc_a1"}`,
			`{"type":"response.output_item.added","item":{"id":"fc_b2","arguments":"","call_id":"call_b2","name":"get_weather","type":"function_call","status":"in_progress"}}`,
			`{"type":"response.function_call_arguments.delta","delta":"{\"city\":\"Rome\"}","item_id":"fc_b2"}`,
		}, []call{{"get_weather", `{"city":"Paris"}`}, {"get_weather", `{"city":"Rome"}`}}},
		{"Responses output_index", FormatResponses, []string{
			`{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","name":"f","arguments":""}}`,
			`{"type":"response.output_item.added","output_index":99999999999999999999,"item":{"type":"function_call","name":"g","arguments":""}}`,
			`{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{}"}`,
			`{"type":"response.function_call_arguments.delta","output_index":99999999999999999999,"delta":"[]"}`,
		}, []call{{"f", `{}`}, {"g", `[]`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := NewCollector(1<<10, false)
			defer col.Release()
			var c Chunk
			for _, p := range tc.payloads {
				ParseCollect(tc.format, []byte(p), &c, col)
			}
			var got []call
			for _, k := range col.Calls() {
				got = append(got, call{string(k.Name), string(k.Args)})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("calls %q, want %q", got, tc.want)
			}
		})
	}
}
