// Package structure checks that a live answer holds as structure
// (docs/slo.md, "Structure"): each tool call names a declared tool and
// its arguments parse as JSON and match that tool's parameters schema,
// and an output asked for as JSON parses and matches its schema. It reads
// what each API's parser collected (stream.Collector) against what the
// request declared (stream.Declared), once per request at its end, never
// per token. It keeps nothing of the content: a Result holds check names
// only.
package structure

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"slices"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokentap/tokentap/stream"
)

// The check names: the values of a record's structure_failed and of the
// check label (a bounded set).
const (
	ToolArgsInvalidJSON = "tool_args_invalid_json" // a call's arguments do not parse as JSON
	ToolArgsSchema      = "tool_args_schema"       // ... parse but do not match the tool's parameters schema
	UnknownTool         = "unknown_tool"           // a call names a tool the request did not declare
	OutputInvalidJSON   = "output_invalid_json"    // an output asked for as JSON does not parse
	OutputSchema        = "output_schema"          // ... parses but does not match its schema
	TruncatedJSON       = "truncated_json"         // JSON (output or arguments) cut by the token limit
	TooLarge            = "too_large"              // more than the bound to hold: not checked, not passed
)

// Checks lists every check name, in the order a Result names them.
var Checks = []string{ToolArgsInvalidJSON, ToolArgsSchema, UnknownTool, OutputInvalidJSON, OutputSchema, TruncatedJSON, TooLarge}

// FastInvalid reports whether the failures of an SLO verdict are
// structure checks only (and there is one): the request succeeded within
// every latency threshold, and its answer does not hold.
func FastInvalid(failed []string) bool {
	for _, f := range failed {
		if !slices.Contains(Checks, f) {
			return false
		}
	}
	return len(failed) > 0
}

// The results of a check of one response (record.Record.Structure).
const (
	Pass      = "pass"
	Fail      = "fail"
	Unchecked = "unchecked" // it could not be checked (Result.Why)
)

// Why a response was not checked: the values of Result.Why.
const (
	WhyPartial = "request_partial" // the request body was longer than the peek: its tools are unknown
	WhyChoices = "choices"         // several choices (n > 1): their calls are not told apart
	WhySchema  = "schema_unusable" // a declared schema does not compile as JSON Schema (Gemini's OpenAPI subset)
)

// Result is the check of one response: Pass, Fail with the checks that
// failed, or Unchecked with why. The zero value is no check.
type Result struct {
	Status string
	Failed []string
	Why    string
}

// DefaultMaxBytes is the default bound on the answer text and tool
// arguments one response's check holds in memory.
const DefaultMaxBytes = 256 << 10

// Checker checks responses. It compiles each distinct schema once, in a
// bounded cache keyed by the schema's hash. Safe for concurrent use; its
// lock is taken once per schema looked up, at a request's end.
type Checker struct {
	// MaxBytes bounds what one response's Collector holds; 0 means
	// DefaultMaxBytes.
	MaxBytes int
	// MaxSchemas bounds the compiled schemas kept; 0 means 256. When it
	// is full the cache is emptied and starts again.
	MaxSchemas int

	mu      sync.Mutex
	schemas map[[32]byte]*jsonschema.Schema // nil value: does not compile
}

// Collector returns a Collector for a response to a request that
// declared d, nil when d declares nothing (no check applies).
func (k *Checker) Collector(d *stream.Declared) *stream.Collector {
	if k == nil || d == nil || !d.Any() {
		return nil
	}
	max := k.MaxBytes
	if max <= 0 {
		max = DefaultMaxBytes
	}
	return stream.NewCollector(max, d.JSON)
}

// schema returns the compiled schema of raw, nil when it does not compile.
func (k *Checker) schema(raw []byte) *jsonschema.Schema {
	key := sha256.Sum256(raw)
	k.mu.Lock()
	s, ok := k.schemas[key]
	k.mu.Unlock()
	if ok {
		return s
	}
	s = compile(raw)
	k.mu.Lock()
	limit := k.MaxSchemas
	if limit <= 0 {
		limit = 256
	}
	if k.schemas == nil || len(k.schemas) >= limit {
		k.schemas = make(map[[32]byte]*jsonschema.Schema)
	}
	k.schemas[key] = s
	k.mu.Unlock()
	return s
}

// compile compiles a schema, without loading any other document (a
// $ref to elsewhere does not compile).
func compile(raw []byte) *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		return nil
	}
	s, err := c.Compile("mem:///schema.json")
	if err != nil {
		return nil
	}
	return s
}

// noLoader loads nothing: a request's schema never makes the sidecar
// read a file or the network.
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errNoLoad }

type loadError struct{}

func (loadError) Error() string { return "structure: schemas are not loaded from elsewhere" }

var errNoLoad = loadError{}

// Check checks what col collected of a response against what its request
// declared. partial: the request body was not read whole; truncated: the
// response ended at its token limit (a finish reason of length or its
// kin); lost: the tap lost some of the response (an event or a body over
// its bounds). The checks that fail are named in the order of Checks.
func (k *Checker) Check(d *stream.Declared, col *stream.Collector, partial, truncated, lost bool) Result {
	switch {
	case partial:
		return Result{Status: Unchecked, Why: WhyPartial}
	case col == nil:
		return Result{}
	case col.Over() || lost:
		return Result{Status: Fail, Failed: []string{TooLarge}}
	case col.Multi():
		return Result{Status: Unchecked, Why: WhyChoices}
	}
	var failed [7]bool // by index in Checks
	unusable := false
	// parse reports whether doc is JSON and whether it meets schema raw
	// (nil: none, or one that cannot be used): one parse of doc, the
	// schema library's when there is a schema to validate against.
	parse := func(raw, doc []byte) (isJSON, meets bool) {
		var s *jsonschema.Schema
		if raw != nil {
			if s = k.schema(raw); s == nil {
				unusable = true
			}
		}
		if s == nil {
			return json.Valid(doc), true
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			return false, false
		}
		return true, s.Validate(inst) == nil
	}
	for _, c := range col.Calls() {
		var tool *stream.DeclaredTool
		for i := range d.Tools {
			if d.Tools[i].Name == string(c.Name) {
				tool = &d.Tools[i]
				break
			}
		}
		if tool == nil {
			failed[2] = true
			continue
		}
		args := bytes.TrimSpace(c.Args)
		if len(args) == 0 {
			args = []byte("{}") // a call with no arguments (Ollama, Gemini omit them)
		}
		switch isJSON, meets := parse(tool.Schema, args); {
		case !isJSON && truncated:
			failed[5] = true
		case !isJSON:
			failed[0] = true
		case !meets:
			failed[1] = true
		}
	}
	if d.JSON && len(col.Calls()) == 0 {
		switch isJSON, meets := parse(d.Schema, bytes.TrimSpace(col.Text())); {
		case !isJSON && truncated:
			failed[5] = true
		case !isJSON:
			failed[3] = true
		case !meets:
			failed[4] = true
		}
	}
	var r Result
	for i, f := range failed {
		if f {
			r.Failed = append(r.Failed, Checks[i])
		}
	}
	switch {
	case len(r.Failed) > 0:
		r.Status = Fail
	case unusable:
		r.Status, r.Why = Unchecked, WhySchema
	default:
		r.Status = Pass
	}
	return r
}
