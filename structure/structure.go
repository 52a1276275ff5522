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
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokentap/tokentap/record"
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
	// A declared schema over one of Limits' bounds: refused before it is
	// compiled (or, for the time, as soon as its compile is past it).
	WhySchemaBytes    = "schema_too_large"         // more bytes than Limits.MaxSchemaBytes
	WhySchemaDepth    = "schema_too_deep"          // nested deeper than Limits.MaxSchemaDepth
	WhySchemaKeywords = "schema_too_many_keywords" // more members than Limits.MaxSchemaKeywords
	WhySchemaTime     = "schema_too_slow"          // its compile took longer than Limits.MaxCompile
	// WhyTooDeep: a call's arguments or the output nest deeper than the
	// JSON decoder reads (MaxJSONDepth): not told valid or invalid.
	WhyTooDeep = "json_too_deep"
	// WhyEvaluations: validating the answer against its schema would
	// take more than MaxEvaluations evaluations (affordable).
	WhyEvaluations = "validation_too_costly"
	// WhyPanic: the check panicked (the schema library on a schema or an
	// answer it did not expect); the request keeps its record, and a
	// schema whose compile panicked is refused as long as it is cached.
	WhyPanic = "check_panicked"
)

// Whys lists every value of Result.Why: the reason label's values of
// tokentap_structure_unchecked_total (a bounded set).
var Whys = []string{WhyPartial, WhyChoices, WhySchema, WhySchemaBytes, WhySchemaDepth, WhySchemaKeywords, WhySchemaTime, WhyTooDeep, WhyEvaluations, WhyPanic}

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

// MaxJSONDepth is how deep the JSON decoder (encoding/json's) reads an
// answer's arguments or output: deeper JSON is judged neither valid nor
// invalid, but unchecked (WhyTooDeep).
const MaxJSONDepth = 10000

// Limits bound what one declared schema may cost the sidecar
// (docs/slo.md, "What a schema may cost"): its bytes, its nesting, its
// members, and its compile's time. A schema over a bound is not compiled
// (or its compile stops) and the answers held to it are unchecked, with
// the bound named (Result.Why). The zero value of each field is its
// default.
type Limits struct {
	// MaxSchemaBytes bounds one schema's bytes; 0 means
	// DefaultMaxSchemaBytes.
	MaxSchemaBytes int
	// MaxSchemaDepth bounds its nesting (of objects and arrays, as
	// JSON); 0 means DefaultMaxSchemaDepth.
	MaxSchemaDepth int
	// MaxSchemaKeywords bounds its object members, all levels
	// together; 0 means DefaultMaxSchemaKeywords.
	MaxSchemaKeywords int
	// MaxCompile bounds its compile's time (the CPU time of the thread
	// compiling it, on Linux; elapsed time elsewhere): a compile still
	// running past it is stopped at its next regular expression, and one
	// that took longer is refused; either way the schema is refused for
	// as long as it is cached. 0 means DefaultMaxCompile.
	MaxCompile time.Duration
}

// The defaults of Limits, sized for what tool and output schemas are
// (OpenAI's structured outputs take 10 levels of nesting and 5,000
// properties) and so that the worst schema within them compiles in tens
// of milliseconds (docs/slo.md, "What a schema may cost").
const (
	DefaultMaxSchemaBytes    = 64 << 10
	DefaultMaxSchemaDepth    = 64
	DefaultMaxSchemaKeywords = 2000
	DefaultMaxCompile        = 100 * time.Millisecond
)

func (l Limits) bytes() int             { return cmp.Or(l.MaxSchemaBytes, DefaultMaxSchemaBytes) }
func (l Limits) depth() int             { return cmp.Or(l.MaxSchemaDepth, DefaultMaxSchemaDepth) }
func (l Limits) keywords() int          { return cmp.Or(l.MaxSchemaKeywords, DefaultMaxSchemaKeywords) }
func (l Limits) compile() time.Duration { return cmp.Or(l.MaxCompile, DefaultMaxCompile) }

// Drafts names the JSON Schema drafts a schema that names no $schema
// may be read as (Checker.DefaultDraft), as the schema library names
// them (jsonschema.Draft4 ... Draft2020): draft4, draft6, draft7,
// draft2019 (2019-09), draft2020 (2020-12).
var Drafts = []string{"draft4", "draft6", "draft7", "draft2019", "draft2020"}

// DefaultDraft is the draft of a schema that names no $schema when
// Checker.DefaultDraft is "": draft 2020-12, the latest.
const DefaultDraft = "draft2020"

// draft returns the library's draft named name (one of Drafts; ""
// means DefaultDraft), nil for an unknown name.
func draft(name string) *jsonschema.Draft {
	switch cmp.Or(name, DefaultDraft) {
	case "draft4":
		return jsonschema.Draft4
	case "draft6":
		return jsonschema.Draft6
	case "draft7":
		return jsonschema.Draft7
	case "draft2019":
		return jsonschema.Draft2019
	case "draft2020":
		return jsonschema.Draft2020
	}
	return nil
}

// Checker checks responses. It compiles each distinct schema once, in a
// bounded cache keyed by the schema's hash (a refused schema is cached
// as refused). Safe for concurrent use; its lock is taken once per
// schema looked up, at a request's end.
type Checker struct {
	// MaxBytes bounds what one response's Collector holds; 0 means
	// DefaultMaxBytes.
	MaxBytes int
	// MaxSchemas bounds the compiled schemas kept; 0 means 256. When it
	// is full the cache is emptied and starts again.
	MaxSchemas int
	// Limits bound what one schema may cost.
	Limits Limits
	// DefaultDraft is the draft a schema that names no $schema is read
	// as: one of Drafts; "" means DefaultDraft (2020-12). An unknown
	// name is read as "".
	DefaultDraft string

	// cpu is the clock that times compiles; nil means threadCPU (the
	// compiling thread's CPU time).
	cpu func() time.Duration

	// MaxCompiling bounds the schemas compiled at once; a compile past
	// it waits for its turn (on the end stages' goroutine, never the
	// client's). 0 means half the processors (GOMAXPROCS), at least one:
	// however many clients send schemas, compiles take at most that many
	// processors' time.
	MaxCompiling int

	mu       sync.Mutex
	schemas  map[[32]byte]compiled
	pending  map[[32]byte]*pendingCompile // compiles under way, each waited on by the checks that need it
	turns    chan struct{}                // one per compile running (MaxCompiling)
	turnOnce sync.Once
}

// pendingCompile is a compile under way: done is closed when c is set.
type pendingCompile struct {
	done chan struct{}
	c    compiled
}

// compiled is a schema in the cache: compiled, or refused (why says
// why: WhySchema or a bound's).
type compiled struct {
	s   *jsonschema.Schema
	why string
}

// Collector returns a Collector for a response to a request that
// declared d, nil when d cannot declare anything (stream.Declared.Maybe:
// no check applies). It does not read d's tools; Check does.
func (k *Checker) Collector(d *stream.Declared) *stream.Collector {
	if k == nil || d == nil || !d.Maybe() {
		return nil
	}
	max := k.MaxBytes
	if max <= 0 {
		max = DefaultMaxBytes
	}
	return stream.NewCollector(max, d.JSON)
}

// Record checks (Check) and writes the result's names into rec: its
// Structure, StructureFailed and StructureUnchecked. A check that
// panics writes unchecked, WhyPanic. A nil Checker writes nothing.
func (k *Checker) Record(rec *record.Record, d *stream.Declared, col *stream.Collector, partial, truncated, lost bool) {
	if k == nil {
		return
	}
	r := Result{Status: Unchecked, Why: WhyPanic}
	defer func() {
		_ = recover()
		rec.Structure, rec.StructureFailed, rec.StructureUnchecked = r.Status, r.Failed, r.Why
	}()
	r = k.Check(d, col, partial, truncated, lost)
}

// schema returns the compiled schema of raw, or why it cannot be used:
// from the cache, or from the one compile of it under way, or compiled
// now, in turn (MaxCompiling).
func (k *Checker) schema(raw []byte) compiled {
	if len(raw) > k.Limits.bytes() { // refused before it is hashed
		return compiled{why: WhySchemaBytes}
	}
	key := sha256.Sum256(raw)
	k.mu.Lock()
	if c, ok := k.schemas[key]; ok {
		k.mu.Unlock()
		return c
	}
	if p := k.pending[key]; p != nil { // the same schema, compiled once
		k.mu.Unlock()
		<-p.done
		return p.c
	}
	p := &pendingCompile{done: make(chan struct{})}
	if k.pending == nil {
		k.pending = make(map[[32]byte]*pendingCompile)
	}
	k.pending[key] = p
	k.mu.Unlock()
	k.turnOnce.Do(func() {
		n := k.MaxCompiling
		if n <= 0 {
			n = max(1, runtime.GOMAXPROCS(0)/2)
		}
		k.turns = make(chan struct{}, n)
	})
	c := k.compileInTurn(raw)
	k.mu.Lock()
	delete(k.pending, key)
	p.c = c
	close(p.done)
	limit := k.MaxSchemas
	if limit <= 0 {
		limit = 256
	}
	if k.schemas == nil || len(k.schemas) >= limit {
		k.schemas = make(map[[32]byte]compiled)
	}
	k.schemas[key] = c
	k.mu.Unlock()
	return c
}

// compileInTurn compiles raw when its turn comes (MaxCompiling). A
// compile that panics (the schema library on a schema it did not
// expect) is a schema refused, WhyPanic: its turn is given back and
// the checks waiting for it are answered.
func (k *Checker) compileInTurn(raw []byte) (c compiled) {
	k.turns <- struct{}{}
	defer func() {
		<-k.turns
		if recover() != nil {
			c = compiled{why: WhyPanic}
		}
	}()
	return k.compile(raw)
}

// compile compiles a schema within k.Limits (its bytes are checked
// before: schema), without loading any other document (a $ref to
// elsewhere does not compile). The bounds on depth and members are
// checked first, in one pass over raw: a schema over one is never
// decoded. The compile's time is bounded at each
// regular expression it compiles (a pattern-heavy schema is stopped
// there) and measured at its end.
func (k *Checker) compile(raw []byte) compiled {
	l := k.Limits
	depth, members := shape(raw, l.depth())
	switch {
	case depth > l.depth():
		return compiled{why: WhySchemaDepth}
	case members > l.keywords():
		return compiled{why: WhySchemaKeywords}
	}
	cpu := k.cpu
	if cpu == nil {
		cpu = threadCPU
		runtime.LockOSThread() // the thread's CPU time is the compile's
		defer runtime.UnlockOSThread()
	}
	start, bound := cpu(), l.compile()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return compiled{why: WhySchema}
	}
	slow := false
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	c.DefaultDraft(cmp.Or(draft(k.DefaultDraft), jsonschema.Draft2020))
	c.UseRegexpEngine(func(expr string) (jsonschema.Regexp, error) {
		if cpu()-start > bound {
			slow = true
			return nil, errSlow
		}
		return regexp.Compile(expr)
	})
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		return compiled{why: WhySchema}
	}
	s, err := c.Compile("mem:///schema.json")
	switch {
	case slow || cpu()-start > bound:
		return compiled{why: WhySchemaTime}
	case err != nil:
		return compiled{why: WhySchema}
	}
	return compiled{s: s}
}

// shape returns how deep raw (JSON) nests, objects and arrays, and how
// many object members it has, in one pass that does not decode it. It
// stops counting at a depth past bound.
func shape(raw []byte, bound int) (depth, members int) {
	d := 0
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if d++; d > depth {
				if depth = d; depth > bound {
					return depth, members
				}
			}
		case '}', ']':
			d--
		case ':':
			members++
		}
	}
	return depth, members
}

// noLoader loads nothing: a request's schema never makes the sidecar
// read a file or the network.
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errNoLoad }

type loadError struct{}

func (loadError) Error() string { return "structure: schemas are not loaded from elsewhere" }

var errNoLoad = loadError{}

type slowError struct{}

func (slowError) Error() string { return "structure: the schema's compile is past its time bound" }

var errSlow = slowError{}

// Check checks what col collected of a response against what its request
// declared. partial: the request body was not read whole; truncated: the
// response ended at its token limit (a finish reason of length or its
// kin); lost: the tap lost some of the response (an event or a body over
// its bounds). The checks that fail are named in the order of Checks.
func (k *Checker) Check(d *stream.Declared, col *stream.Collector, partial, truncated, lost bool) Result {
	d.ReadTools() // here, after the client's response (stream.Declared)
	switch {
	case partial:
		return Result{Status: Unchecked, Why: WhyPartial}
	case col == nil || !d.Any(): // nothing declared (a tools array of unnamed tools)
		return Result{}
	case col.Over() || lost:
		return Result{Status: Fail, Failed: []string{TooLarge}}
	case col.Multi():
		return Result{Status: Unchecked, Why: WhyChoices}
	}
	var failed [7]bool     // by index in Checks
	why, deep := "", false // the first schema refused and why; JSON too deep to read
	// parse reports whether doc is JSON and whether it meets schema raw
	// (nil: none, or one that cannot be used): one parse of doc, the
	// schema library's when there is a schema to validate against. JSON
	// nested deeper than the decoder reads is neither (why says so).
	parse := func(raw, doc []byte) (isJSON, meets bool) {
		var s *jsonschema.Schema
		if raw != nil {
			c := k.schema(raw)
			if s = c.s; s == nil && why == "" {
				why = c.why
			}
		}
		isJSON, meets = false, false
		if s == nil {
			isJSON, meets = json.Valid(doc), true
		} else if inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc)); err == nil {
			if !affordable(s, inst) {
				if why == "" {
					why = WhyEvaluations
				}
				return true, true
			}
			isJSON, meets = true, s.Validate(inst) == nil
		}
		if !isJSON {
			if d, _ := shape(doc, MaxJSONDepth); d > MaxJSONDepth {
				deep = true
				return true, true
			}
		}
		return isJSON, meets
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
	case why != "":
		r.Status, r.Why = Unchecked, why
	case deep:
		r.Status, r.Why = Unchecked, WhyTooDeep
	default:
		r.Status = Pass
	}
	return r
}
