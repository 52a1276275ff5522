package stream

import (
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is what the structure checks read of a response (docs/slo.md,
// "Structure"): each API's parser, given a Collector, writes the answer
// text and assembles its tool calls (OpenAI chat's
// tool_calls[].function.arguments deltas, Responses'
// function_call_arguments.delta, Anthropic's input_json_delta, Gemini's
// functionCall.args, Ollama's tool_calls) by the call's index, in memory
// and bounded. It is asked for only when the request declared tools or a
// JSON output and an SLO requires the checks; otherwise the parsers get
// nil and nothing is kept. The collected content is never written
// anywhere: the checks (package structure) read it and the Collector
// goes back to its pool.

// ToolCall is one tool call a response made: its name and its arguments
// (the JSON text, assembled from the deltas), unescaped.
type ToolCall struct {
	key  int64
	Name []byte
	Args []byte
}

// MaxCalls bounds the tool calls one response's Collector keeps; past it
// the Collector is Over.
const MaxCalls = 64

var collectors = sync.Pool{New: func() any { return new(Collector) }}

// maxPooled is the largest buffer a Collector keeps when it goes back to
// its pool: one that grew past it (a large answer) is dropped, so the
// pool holds no more than a few of these per processor.
const maxPooled = 64 << 10

// NewCollector returns an empty Collector for a structure check, from a
// pool: it keeps at most max bytes of answer text and tool arguments
// together (past that it is Over and keeps nothing more), and the answer
// text only when text is true. Release it when done.
func NewCollector(max int, text bool) *Collector {
	t := collectors.Get().(*Collector)
	t.check, t.text, t.max = true, text, max
	return t
}

// Release empties t and returns it to the pool; t must not be used
// after.
func (t *Collector) Release() {
	t.buf, t.held, t.over, t.n, t.multi = t.buf[:0], 0, false, 0, false
	if cap(t.buf) > maxPooled {
		t.buf = nil
	}
	for i := range t.calls {
		c := &t.calls[i]
		c.Name, c.Args = c.Name[:0], c.Args[:0]
		if cap(c.Args) > maxPooled {
			c.Args = nil
		}
	}
	collectors.Put(t)
}

// Text is the answer text collected (when asked for).
func (t *Collector) Text() []byte { return t.buf }

// Calls are the tool calls collected, in the order they began.
func (t *Collector) Calls() []ToolCall { return t.calls[:t.n] }

// Over reports whether the bound was hit: something was not kept.
func (t *Collector) Over() bool { return t.over }

// SetOver marks t as Over: the tap lost content it could not read (an
// event over the framer's bound, a whole body over its bound).
func (t *Collector) SetOver() { t.over = true }

// Multi reports whether the response carried more than one choice: its
// calls and text are not told apart by choice, so the checks do not read
// them.
func (t *Collector) Multi() bool { return t.multi }

// SetMulti marks t as carrying several choices.
func (t *Collector) SetMulti() { t.multi = true }

// newCall is the key that begins a new call (callName): the APIs that
// send each call whole (Gemini, Ollama, a whole body's) have no index.
const newCall = -1

// callKey is the key of a tool call whose "index" member is v (raw
// JSON, nil when absent): absent, the key given (newCall for an element
// of a whole message's tool_calls, which carry no index: each is a call
// of its own); a non-negative integer, itself; anything else (10^18, a
// fraction, a string, a negative number) IndexOutOfRange, one key for
// every index the parser does not read, never pooled with a call it
// read (as an unread choice index is, Chunk.Index). Read as 0, such an
// index appended its arguments to call 0's: two valid calls made one
// invalid.
func callKey(v []byte, absent int64) int64 {
	if len(v) == 0 {
		return absent
	}
	if n, ok := intVal(v); ok && n >= 0 {
		return n
	}
	return IndexOutOfRange
}

// call returns the call with key, a new one when there is none (nil when
// over MaxCalls). The key newCall always begins a new call, which gets a
// key of its own below it (-2, -3...).
func (t *Collector) call(key int64) *ToolCall {
	if key != newCall {
		if c := t.find(key); c != nil {
			return c
		}
	}
	if t.n == MaxCalls {
		t.over = true
		return nil
	}
	if t.n == len(t.calls) {
		t.calls = append(t.calls, ToolCall{})
	}
	c := &t.calls[t.n]
	t.n++
	c.key = key
	if key == newCall {
		c.key = newCall - int64(t.n)
	}
	return c
}

// find returns the call with key, nil when there is none.
func (t *Collector) find(key int64) *ToolCall {
	for i := t.n - 1; i >= 0; i-- {
		if t.calls[i].key == key {
			return &t.calls[i]
		}
	}
	return nil
}

// lastKey is the key of the call begun last; absent when none has.
func (t *Collector) lastKey(absent int64) int64 {
	if t.n == 0 {
		return absent
	}
	return t.calls[t.n-1].key
}

// began reports whether a call with key has begun (callName, callArgs).
func (t *Collector) began(key int64) bool { return t.find(key) != nil }

// callName sets the name of the call with key (a JSON string value; the
// key newCall begins a new call) and returns the call's key.
func (t *Collector) callName(key int64, name []byte) int64 {
	if !t.check {
		return key
	}
	c := t.call(key)
	if c == nil {
		return key
	}
	if s, ok := strVal(name); ok && len(s) > 0 && len(c.Name) == 0 {
		if len(s) > 256 {
			s = s[:256] // a tool name is short; a longer one is not declared anyway
		}
		c.Name = appendUnescaped(c.Name, s)
	}
	return c.key
}

// callArgs appends an arguments fragment to the call with key: a JSON
// string value (a delta of the arguments' text) when str, else a raw JSON
// value (Gemini's and Ollama's arguments object), copied as it is.
func (t *Collector) callArgs(key int64, v []byte, str bool) {
	if !t.check || len(v) == 0 {
		return
	}
	c := t.call(key)
	if c == nil {
		return
	}
	if str {
		c.Args = t.appendStr(c.Args, v)
		return
	}
	if t.room(len(v)) {
		c.Args = append(c.Args, v...)
		t.held += len(v)
	}
}

// room reports whether n more bytes fit under the bound, marking t Over
// when they do not.
func (t *Collector) room(n int) bool {
	if t.over || t.held+n > t.max {
		t.over = true
		return false
	}
	return true
}

// appendStr appends the JSON string value v unescaped, within the bound;
// a value that is not a string adds nothing.
func (t *Collector) appendStr(dst, v []byte) []byte {
	s, ok := strVal(v)
	if !ok || !t.room(len(s)) { // unescaping never lengthens
		return dst
	}
	n := len(dst)
	dst = appendUnescaped(dst, s)
	t.held += len(dst) - n
	return dst
}

// appendUnescaped appends the contents of a JSON string (its escapes
// resolved; without its quotes) to dst. It never allocates beyond dst's
// growth. A malformed escape is kept as it is; invalid UTF-8 is copied.
func appendUnescaped(dst, s []byte) []byte {
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\\' {
			i++
		}
		dst = append(dst, s[:i]...)
		s = s[i:]
		if len(s) < 2 {
			return append(dst, s...)
		}
		switch s[1] {
		case '"', '\\', '/':
			dst = append(dst, s[1])
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(s[2:])
			if !ok {
				dst = append(dst, s[:2]...)
				s = s[2:]
				continue
			}
			s = s[6:]
			if utf16.IsSurrogate(r) {
				r2, ok := rune(-1), false
				if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
					r2, ok = hex4(s[2:])
				}
				if d := utf16.DecodeRune(r, r2); ok && d != utf8.RuneError {
					r, s = d, s[6:]
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			dst = append(dst, s[:2]...)
		}
		s = s[2:]
	}
	return dst
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// ParseCollect is Parse, writing to t (when not nil) the answer text and
// tool calls of the payload for the structure checks (NewCollector). With
// a nil t it is Parse; with one, it allocates only as t's buffers grow.
func ParseCollect(f Format, data []byte, c *Chunk, t *Collector) {
	if t == nil {
		f.parse(data, c, nil)
		return
	}
	n := len(t.buf)
	f.parse(data, c, t)
	if c.Malformed {
		t.buf = t.buf[:n]
	}
}

// Declared is what a request body declares that the structure checks
// hold the response to: its tools (a call must name one, and its
// arguments must match that tool's parameters schema) and whether the
// output was asked for as JSON (and its schema). The zero value declares
// nothing: no check applies.
//
// Design note: an API's Declares reads the output's declaration at once
// and leaves the tools for ReadTools, which the check calls after the
// client's response: a tool's schema may be megabytes (reading a 3.4 MB
// one took 12 ms), and Declares runs before the request is forwarded.
// Maybe tells, cheaply, whether anything may be declared (what to
// collect as the answer streams).
type Declared struct {
	// Tools are the declared tools, once ReadTools has read them.
	Tools []DeclaredTool
	// JSON: the output was asked for as JSON (OpenAI's response_format
	// json_object or json_schema, Responses' text.format, Ollama's
	// format, Gemini's responseMimeType application/json).
	JSON bool
	// Schema is the output's JSON Schema (raw, aliasing the body: an
	// object or a boolean); nil: any JSON.
	Schema []byte
	// tools is the body's tools member, not read yet; read reads it
	// into Tools (ReadTools), the API's way.
	tools []byte
	read  func(d *Declared, tools []byte)
}

// Maybe reports whether d may declare something a check applies to,
// without reading the tools: the output asked for as JSON, or a tools
// member that is a non-empty array.
func (d *Declared) Maybe() bool {
	if d.JSON || len(d.Tools) > 0 {
		return true
	}
	t := trimWS(d.tools)
	if len(t) == 0 || t[0] != '[' {
		return false
	}
	rest := trimWS(t[1:])
	return len(rest) > 0 && rest[0] != ']'
}

// ReadTools reads the declared tools into Tools, once; the zero
// Declared, or one read already, is left as it is.
func (d *Declared) ReadTools() {
	if d.tools != nil && d.read != nil {
		t := d.tools
		d.tools = nil
		d.read(d, t)
	}
}

// DeclaredTool is one declared tool: its name (unescaped) and its
// parameters' JSON Schema (raw, aliasing the body: an object or a
// boolean; nil: none given).
type DeclaredTool struct {
	Name   string
	Schema []byte
}

// Any reports whether d declares something a check applies to; its
// tools count once read (ReadTools).
func (d *Declared) Any() bool { return len(d.Tools) > 0 || d.JSON }

// MaxDeclaredTools bounds the tools read from one request; past it the
// rest are not read, and a call to one of them is an unknown tool (an
// API takes a few dozen at most: OpenAI documents 128).
const MaxDeclaredTools = 256

// isSchema reports whether the JSON value v can be a JSON Schema: an
// object, or a boolean (true: every instance is valid; false: none).
func isSchema(v []byte) bool {
	return isObject(v) || string(v) == "true" || string(v) == "false"
}

// member returns the value of the member path ("function.name") of the
// object v, nil when absent.
func member(v []byte, path string) []byte {
	for path != "" {
		key, rest := path, ""
		for i := 0; i < len(path); i++ {
			if path[i] == '.' {
				key, rest = path[:i], path[i+1:]
				break
			}
		}
		var found []byte
		eachMember(v, func(k, val []byte) bool {
			if string(k) == key {
				found = val
				return false
			}
			return true
		})
		if found == nil {
			return nil
		}
		v, path = found, rest
	}
	return v
}

// str returns the unescaped string value v, "" when it is not one.
func str(v []byte) string {
	s, ok := strVal(v)
	if !ok {
		return ""
	}
	return string(appendUnescaped(nil, s))
}

// The APIs' ways to read their tools (Declared.ReadTools).

// readFunctionTools: Chat Completions' and Ollama's
// {type: function, function: {name, parameters}}.
func readFunctionTools(d *Declared, t []byte) {
	d.addTools(t, []string{"function.name"}, []string{"function.parameters"})
}

// readResponsesTools: the Responses API's {type: function, name, parameters}.
func readResponsesTools(d *Declared, t []byte) {
	d.addTools(t, []string{"name"}, []string{"parameters"})
}

// readMessagesTools: Anthropic's {name, input_schema}.
func readMessagesTools(d *Declared, t []byte) {
	d.addTools(t, []string{"name"}, []string{"input_schema"})
}

// readGeminiTools: Gemini's [{functionDeclarations: [{name,
// parametersJsonSchema | parameters}]}].
func readGeminiTools(d *Declared, t []byte) {
	i := skipWS(t, 0)
	if i >= len(t) || t[i] != '[' {
		return
	}
	walkArray(t, i, func(v int) int {
		if t[v] != '{' {
			return skipValue(t, v)
		}
		met, n := false, len(d.Tools) // a member's first occurrence counts
		e := walkObject(t, v, func(k []byte, kv int) int {
			if met || string(k) != "functionDeclarations" {
				return skipValue(t, kv)
			}
			met = true
			return d.walkTools(t, kv, []string{"name"}, []string{"parametersJsonSchema", "parameters"})
		})
		if e == -1 { // an element not read whole declares nothing
			d.Tools = d.Tools[:n]
		}
		return e
	})
}

// addTools appends to d each element of the array tools, its name and
// schema at the first present of the member paths names and schemas.
func (d *Declared) addTools(tools []byte, names, schemas []string) {
	d.walkTools(tools, skipWS(tools, 0), names, schemas)
}

// walkTools is addTools for the array value at b[i]: it returns the
// index just after it, -1 when it is malformed (the tools of the
// elements read whole before are kept), or stopWalk past
// MaxDeclaredTools.
//
// Design note: each byte is scanned once. A tool's schema may be
// megabytes, and looking each path up apart (member) scanned it four
// times: 12 ms for a 3.4 MB schema, where the check's whole bound is 50.
func (d *Declared) walkTools(b []byte, i int, names, schemas []string) int {
	i = skipWS(b, i)
	if i >= len(b) || b[i] != '[' {
		return skipValue(b, i)
	}
	return walkArray(b, i, func(v int) int {
		if len(d.Tools) == MaxDeclaredTools {
			return stopWalk
		}
		// The first present of names, the first of schemas that is a
		// schema: their indexes in the lists (len: none yet).
		name, schema := len(names), len(schemas)
		var dt DeclaredTool
		var all [8]string // the paths wanted, names' then schemas'
		want := all[:copy(all[:], names)]
		want = append(want, schemas...)
		end := walkPaths(b, v, "", want, func(path string, val []byte) {
			for j, p := range want {
				if p != path {
					continue
				}
				switch k := j - len(names); {
				case k < 0 && j < name:
					name, dt.Name = j, str(val)
				case k >= 0 && k < schema && isSchema(val):
					schema, dt.Schema = k, val
				}
			}
		})
		if end >= 0 && dt.Name != "" { // an element read whole
			d.Tools = append(d.Tools, dt)
		}
		return end
	})
}

// walkPaths returns the index just after the value at b[v] (-1 when it
// is malformed), calling found with each of the dotted member paths want
// (from the value: those under prefix) that the value holds, and
// its raw value, in the order met. As member, it reads a key's first
// occurrence only (one that is not an object where a path goes through
// it ends that path). It descends only into the members a wanted path
// goes through, and scans each byte once, however deep the paths (at
// most 64 of them).
func walkPaths(b []byte, v int, prefix string, want []string, found func(path string, val []byte)) int {
	v = skipWS(b, v)
	if v >= len(b) || b[v] != '{' {
		return skipValue(b, v)
	}
	var passed uint64 // the wanted paths whose key at this level was met
	return walkObject(b, v, func(k []byte, kv int) int {
		deeper, whole := "", ""
		for j, p := range want {
			if passed&(1<<j) != 0 || len(p) <= len(prefix) || p[:len(prefix)] != prefix {
				continue // met already, or not under this object
			}
			rest := p[len(prefix):]
			switch {
			case rest == string(k):
				whole = p
				passed |= 1 << j
			case len(rest) > len(k) && rest[len(k)] == '.' && rest[:len(k)] == string(k):
				deeper = p[:len(prefix)+len(k)+1]
				passed |= 1 << j
			}
		}
		var e int
		if deeper != "" && kv < len(b) && b[kv] == '{' {
			e = walkPaths(b, kv, deeper, want, found)
		} else {
			e = skipValue(b, kv)
		}
		if e >= 0 && whole != "" {
			found(whole, b[kv:e])
		}
		return e
	})
}

// declaresOpenAI: Chat Completions' tools
// ({type: function, function: {name, parameters}}) and response_format
// ({type: json_object} or {type: json_schema, json_schema: {schema}});
// openai/openai-openapi openapi.yaml, CreateChatCompletionRequest. Ollama's
// /api/chat takes the same tools (api/types.go, Tool) and its format:
// "json" or a schema object.
func declaresOpenAI(m func(string) []byte) (d Declared) {
	d.tools, d.read = m("tools"), readFunctionTools
	rf := m("response_format")
	switch str(member(rf, "type")) {
	case "json_object":
		d.JSON = true
	case "json_schema":
		d.JSON = true
		if s := member(rf, "json_schema.schema"); isSchema(s) {
			d.Schema = s
		}
	}
	return d
}

// declaresOllama: /api/chat's tools (as OpenAI's) and format, "json" or
// a JSON Schema object (ollama api/types.go, ChatRequest.Format).
func declaresOllama(m func(string) []byte) (d Declared) {
	d.tools, d.read = m("tools"), readFunctionTools
	f := trimWS(m("format"))
	switch {
	case string(f) == `"json"`:
		d.JSON = true
	case isObject(f):
		d.JSON, d.Schema = true, f
	}
	return d
}

// declaresResponses: the Responses API's function tools
// ({type: function, name, parameters}) and text.format
// ({type: json_schema, schema} or {type: json_object}); openapi.yaml,
// CreateResponse.
func declaresResponses(m func(string) []byte) (d Declared) {
	d.tools, d.read = m("tools"), readResponsesTools
	f := member(m("text"), "format")
	switch str(member(f, "type")) {
	case "json_object":
		d.JSON = true
	case "json_schema":
		d.JSON = true
		if s := member(f, "schema"); isSchema(s) {
			d.Schema = s
		}
	}
	return d
}

// declaresMessages: Anthropic's tools ({name, input_schema}; the Messages
// API reference). Anthropic has no JSON output mode in the stable API.
func declaresMessages(m func(string) []byte) (d Declared) {
	d.tools, d.read = m("tools"), readMessagesTools
	return d
}

// declaresGemini: Gemini's tools ({functionDeclarations: [{name,
// parametersJsonSchema | parameters}]}) and generationConfig
// (responseMimeType application/json, with responseJsonSchema or
// responseSchema); the generateContent reference. responseSchema and
// parameters are an OpenAPI subset ("type":"OBJECT"): a schema that does
// not compile as JSON Schema is not validated against (package
// structure says so).
func declaresGemini(m func(string) []byte) (d Declared) {
	d.tools, d.read = m("tools"), readGeminiTools
	gc := m("generationConfig")
	if str(member(gc, "responseMimeType")) == "application/json" {
		d.JSON = true
		for _, p := range []string{"responseJsonSchema", "responseSchema"} {
			if s := member(gc, p); isSchema(s) {
				d.Schema = s
				break
			}
		}
	}
	return d
}
