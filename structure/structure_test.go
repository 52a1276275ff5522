package structure

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tokentap/tokentap/stream"
)

// chatCall is an OpenAI chat chunk carrying a whole tool call.
func chatCall(name string, args []byte) []byte {
	n, _ := json.Marshal(name)
	a, _ := json.Marshal(string(args))
	return []byte(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":` +
		string(n) + `,"arguments":` + string(a) + `}}]},"finish_reason":null}]}`)
}

// chatText is an OpenAI chat chunk carrying answer text.
func chatText(text []byte) []byte {
	s, _ := json.Marshal(string(text))
	return []byte(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":` + string(s) + `},"finish_reason":null}]}`)
}

// collect returns a Collector holding what the chunks carry.
func collect(k *Checker, d *stream.Declared, chunks ...[]byte) *stream.Collector {
	col := k.Collector(d)
	var c stream.Chunk
	for _, ch := range chunks {
		stream.ParseCollect(stream.FormatOpenAI, ch, &c, col)
	}
	return col
}

const citySchema = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`

func TestCheck(t *testing.T) {
	tools := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "get_weather", Schema: []byte(citySchema)}, {Name: "noargs"}}}
	out := &stream.Declared{JSON: true, Schema: []byte(citySchema)}
	gemini := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "g", Schema: []byte(`{"type":"OBJECT"}`)}}}
	remote := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "g", Schema: []byte(`{"$ref":"http://127.0.0.1:1/s.json"}`)}}}
	for _, c := range []struct {
		name                     string
		d                        *stream.Declared
		chunks                   [][]byte
		partial, truncated, lost bool
		want                     Result
	}{
		{"valid call", tools, [][]byte{chatCall("get_weather", []byte(`{"city":"x"}`))}, false, false, false, Result{Status: Pass}},
		{"no arguments", tools, [][]byte{chatCall("noargs", nil)}, false, false, false, Result{Status: Pass}},
		{"invalid json", tools, [][]byte{chatCall("get_weather", []byte(`{"city":`))}, false, false, false, Result{Status: Fail, Failed: []string{ToolArgsInvalidJSON}}},
		{"cut", tools, [][]byte{chatCall("get_weather", []byte(`{"city":`))}, false, true, false, Result{Status: Fail, Failed: []string{TruncatedJSON}}},
		{"schema", tools, [][]byte{chatCall("get_weather", []byte(`{"town":"x"}`))}, false, false, false, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"unknown", tools, [][]byte{chatCall("other", []byte(`{}`))}, false, false, false, Result{Status: Fail, Failed: []string{UnknownTool}}},
		{"lost", tools, [][]byte{chatCall("get_weather", []byte(`{"city":"x"}`))}, false, false, true, Result{Status: Fail, Failed: []string{TooLarge}}},
		{"partial", tools, nil, true, false, false, Result{Status: Unchecked, Why: WhyPartial}},
		{"output valid", out, [][]byte{chatText([]byte(`{"city":`)), chatText([]byte(`"x"}`))}, false, false, false, Result{Status: Pass}},
		{"output invalid", out, [][]byte{chatText([]byte(`{"city":`))}, false, false, false, Result{Status: Fail, Failed: []string{OutputInvalidJSON}}},
		{"output schema", out, [][]byte{chatText([]byte(`{"town":"x"}`))}, false, false, false, Result{Status: Fail, Failed: []string{OutputSchema}}},
		{"output cut", out, [][]byte{chatText([]byte(`{"city":`))}, false, true, false, Result{Status: Fail, Failed: []string{TruncatedJSON}}},
		{"openapi schema", gemini, [][]byte{chatCall("g", []byte(`{}`))}, false, false, false, Result{Status: Unchecked, Why: WhySchema}},
		{"remote ref", remote, [][]byte{chatCall("g", []byte(`{}`))}, false, false, false, Result{Status: Unchecked, Why: WhySchema}},
		{"two failures in order", tools, [][]byte{chatCall("other", nil), []byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"name":"get_weather","arguments":"{}"}}]}}]}`)},
			false, false, false, Result{Status: Fail, Failed: []string{ToolArgsSchema, UnknownTool}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := &Checker{}
			col := collect(k, c.d, c.chunks...)
			defer col.Release()
			got := k.Check(c.d, col, c.partial, c.truncated, c.lost)
			if got.Status != c.want.Status || !slices.Equal(got.Failed, c.want.Failed) || got.Why != c.want.Why {
				t.Fatalf("%+v, want %+v", got, c.want)
			}
		})
	}
}

// The cap: a Collector over its bound says too_large, never pass.
func TestCheckTooLarge(t *testing.T) {
	k := &Checker{MaxBytes: 16}
	d := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "f"}}}
	col := collect(k, d, chatCall("f", []byte(`{"a":"`+strings.Repeat("x", 32)+`"}`)))
	defer col.Release()
	if got := k.Check(d, col, false, false, false); got.Status != Fail || !slices.Equal(got.Failed, []string{TooLarge}) {
		t.Fatalf("%+v, want too_large", got)
	}
}

// Each distinct schema is compiled once and the cache stays within
// MaxSchemas.
func TestSchemaCacheBounded(t *testing.T) {
	k := &Checker{MaxSchemas: 2}
	for i := range 5 {
		raw := []byte(`{"type":"object","maxProperties":` + string(rune('1'+i)) + `}`)
		s := k.schema(raw).s
		if s == nil || k.schema(raw).s != s {
			t.Fatalf("schema %d compiled %p, again %p", i, s, k.schema(raw).s)
		}
		if len(k.schemas) > 2 {
			t.Fatalf("%d schemas cached, bound 2", len(k.schemas))
		}
	}
}

func TestFastInvalid(t *testing.T) {
	for _, c := range []struct {
		failed []string
		want   bool
	}{{nil, false}, {[]string{ToolArgsSchema}, true}, {[]string{TooLarge, UnknownTool}, true}, {[]string{"ttft", ToolArgsSchema}, false}, {[]string{"error"}, false}} {
		if got := FastInvalid(c.failed); got != c.want {
			t.Errorf("FastInvalid(%q) = %v", c.failed, got)
		}
	}
}

// FuzzCheck: on any arguments, answer text and schemas (a request's
// schema is the client's to write), Check returns a well-formed Result
// (a known status; fail exactly when checks are named, in the order of
// Checks, each once; a reason exactly when unchecked), the same twice,
// and agrees with encoding/json on whether the arguments parse.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(`{"city":"x"}`), []byte(`{"city":"x"}`), []byte(citySchema), []byte(citySchema), uint8(3))
	f.Add([]byte(`{"city":`), []byte(`{"town":1}`), []byte(citySchema), []byte(`{"type":"OBJECT"}`), uint8(11))
	f.Add([]byte(`[1,2`), []byte(`not json`), []byte(`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}`), []byte(`{"pattern":"(a+)+$"}`), uint8(1))
	f.Add([]byte(``), []byte(``), []byte(`{"$ref":"file:///etc/passwd"}`), []byte(`{}`), uint8(16))
	f.Fuzz(func(t *testing.T, args, text, toolSchema, outSchema []byte, flags uint8) {
		d := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "t"}}, JSON: flags&1 != 0}
		if isSchema(toolSchema) {
			d.Tools[0].Schema = toolSchema // Declared holds only objects and booleans as schemas
		}
		if d.JSON && isSchema(outSchema) {
			d.Schema = outSchema
		}
		call := flags&2 != 0
		var chunks [][]byte
		if call {
			chunks = append(chunks, chatCall("t", args))
		}
		chunks = append(chunks, chatText(text))
		k := &Checker{MaxBytes: 1 << 16}
		col := collect(k, d, chunks...)
		defer col.Release()
		partial, truncated, lost := flags&4 != 0, flags&8 != 0, flags&16 != 0
		r := k.Check(d, col, partial, truncated, lost)
		if r2 := k.Check(d, col, partial, truncated, lost); r2.Status != r.Status || !slices.Equal(r2.Failed, r.Failed) || r2.Why != r.Why {
			t.Fatalf("twice: %+v then %+v", r, r2)
		}
		switch r.Status {
		case Pass, Fail, Unchecked:
		default:
			t.Fatalf("status %q", r.Status)
		}
		if (r.Status == Fail) != (len(r.Failed) > 0) || (r.Status == Unchecked) != (r.Why != "") {
			t.Fatalf("inconsistent %+v", r)
		}
		last := -1
		for _, c := range r.Failed {
			i := slices.Index(Checks, c)
			if i <= last {
				t.Fatalf("failed %q: not in the order of Checks, or unknown, or twice", r.Failed)
			}
			last = i
		}
		switch {
		case partial:
			if r.Why != WhyPartial {
				t.Fatalf("a partial request: %+v", r)
			}
			return
		case lost:
			if !slices.Equal(r.Failed, []string{TooLarge}) {
				t.Fatalf("a lost response: %+v", r)
			}
			return
		}
		if !call || !utf8.Valid(args) { // invalid UTF-8 is sent replaced (json.Marshal)
			return
		}
		a := bytes.TrimSpace(args)
		if r.Why == WhyTooDeep {
			if d, _ := shape(a, MaxJSONDepth); d <= MaxJSONDepth {
				t.Fatalf("arguments %d deep: %+v", d, r)
			}
			return
		}
		valid := len(a) == 0 || json.Valid(a)
		invalid := slices.Contains(r.Failed, ToolArgsInvalidJSON) || slices.Contains(r.Failed, TruncatedJSON)
		if valid == invalid || (!valid && truncated != slices.Contains(r.Failed, TruncatedJSON)) {
			t.Fatalf("arguments %q (valid %v, cut %v): %+v", args, valid, truncated, r)
		}
	})
}

// isSchema reports whether b is JSON that Declared takes as a schema: an
// object or a boolean.
func isSchema(b []byte) bool {
	t := bytes.TrimSpace(b)
	return json.Valid(t) && (bytes.HasPrefix(t, []byte("{")) || string(t) == "true" || string(t) == "false")
}

// BenchmarkCheck4KiB is what the check itself costs at a request's end
// for a 4 KiB argument, its schema already compiled: parsing the
// arguments and validating them (docs/performance.md, "Structure
// checks").
func BenchmarkCheck4KiB(b *testing.B) {
	schema := `{"type":"object","properties":{"city":{"type":"string","maxLength":8192},"days":{"type":"integer","minimum":1},"units":{"enum":["c","f"]}},"required":["city","days"],"additionalProperties":false}`
	args := `{"city":"` + strings.Repeat("x", 4096-len(`{"city":"","days":3,"units":"c"}`)) + `","days":3,"units":"c"}`
	d := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "get_weather", Schema: []byte(schema)}}}
	k := &Checker{}
	col := collect(k, d, chatCall("get_weather", []byte(args)))
	defer col.Release()
	if r := k.Check(d, col, false, false, false); r.Status != Pass {
		b.Fatalf("%+v", r)
	}
	b.ReportAllocs()
	for b.Loop() {
		k.Check(d, col, false, false, false)
	}
}
