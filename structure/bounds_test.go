package structure

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// deepSchema is the first hostile schema: 1,500 levels of
// properties, about 62 KB (63,002 bytes).
func deepSchema() []byte {
	return []byte(strings.Repeat(`{"type":"object","properties":{"abcdef":`, 1500) + "{}" + strings.Repeat("}}", 1500))
}

// nestedSchema is a schema of depth levels of objects, well formed.
func nestedSchema(depth int) []byte {
	return []byte(strings.Repeat(`{"properties":{"a":`, depth) + `{}` + strings.Repeat(`}}`, depth))
}

// depthOf is JSON (a schema of unknown keywords) nested n deep.
func depthOf(n int) []byte {
	return []byte(strings.Repeat(`{"x":`, n-1) + `{}` + strings.Repeat(`}`, n-1))
}

// patternsSchema is the second: n properties, each with a
// pattern of its own (60,000 make about 3.4 MB).
func patternsSchema(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string","pattern":"^[a-z]{%d}[0-9]x+$"}`, i, i%50+1)
	}
	b.WriteString(`}}`)
	return []byte(b.String())
}

// cpu is the process's CPU time (user and system) so far.
func cpu(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// checkCall checks one call to tool "f", declared with schema, whose
// arguments are args.
func checkCall(k *Checker, schema, args []byte) Result {
	d := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "f", Schema: schema}}}
	col := collect(k, d, chatCall("f", args))
	defer col.Release()
	return k.Check(d, col, false, false, false)
}

// The hostile schemas (16 s and 24 s of CPU before the bounds)
// cost the check at most 50 ms of CPU each under the default bounds,
// measured around it, and are refused by name: unchecked, the bound
// said. With the bound that refused them raised, the next bound does.
func TestHostileSchemasBounded(t *testing.T) {
	if len(deepSchema()) != 63002 || len(patternsSchema(60000)) < 3<<20 {
		t.Fatalf("schemas of %d and %d bytes", len(deepSchema()), len(patternsSchema(60000)))
	}
	for _, c := range []struct {
		name     string
		schema   []byte
		k        *Checker
		why      string
		defaults bool // the default bounds: at most 50 ms of CPU
	}{
		{"62 KB nested 1,500 levels", deepSchema(), &Checker{}, WhySchemaDepth, true},
		{"3.4 MB of 60,000 patterns", patternsSchema(60000), &Checker{}, WhySchemaBytes, true},
		{"3.4 MB of 60,000 patterns, bytes allowed", patternsSchema(60000), &Checker{Limits: Limits{MaxSchemaBytes: 4 << 20}}, WhySchemaKeywords, false},
		{"1,500 levels, depth allowed", nestedSchema(1500), &Checker{Limits: Limits{MaxSchemaDepth: 4000}}, WhySchemaKeywords, false},
	} {
		before := cpu(t)
		r := checkCall(c.k, c.schema, []byte(`{"a":{}}`))
		used := cpu(t) - before
		if r.Status != Unchecked || r.Why != c.why {
			t.Errorf("%s: %+v, want unchecked %s", c.name, r, c.why)
		}
		if c.defaults && used > 50*time.Millisecond {
			t.Errorf("%s: the check took %v of CPU, bound 50ms", c.name, used)
		}
		t.Logf("%s (%d bytes): %s in %v of CPU", c.name, len(c.schema), r.Why, used)
	}
}

// steps is a clock that moves on by step at each reading.
type steps struct {
	now, step time.Duration
}

func (s *steps) read() time.Duration { s.now += s.step; return s.now }

// The compile's time bound: a compile past it stops at its next pattern
// (a clock that moves an hour at each reading is past it at once), one
// that ends past it is refused all the same, and the refusal is cached:
// the schema is not compiled again.
func TestCompileTimeBound(t *testing.T) {
	for _, schema := range []string{`{"properties":{"a":{"pattern":"^x"}}}`, `{"properties":{"a":{"type":"string"}}}`} {
		clock := &steps{step: time.Hour}
		k := &Checker{cpu: clock.read}
		if r := checkCall(k, []byte(schema), []byte(`{"a":"x"}`)); r.Status != Unchecked || r.Why != WhySchemaTime {
			t.Fatalf("%s: %+v, want unchecked %s", schema, r, WhySchemaTime)
		}
		read := clock.now
		if r := checkCall(k, []byte(schema), []byte(`{"a":"x"}`)); r.Why != WhySchemaTime || clock.now != read {
			t.Fatalf("%s again: %+v, the clock read again: %v", schema, r, clock.now != read)
		}
	}
	// Within the bound (a clock that moves a microsecond a reading) the
	// same schemas compile and check.
	k := &Checker{cpu: (&steps{step: time.Microsecond}).read}
	if r := checkCall(k, []byte(`{"properties":{"a":{"pattern":"^x"}}}`), []byte(`{"a":"y"}`)); r.Status != Fail || r.Failed[0] != ToolArgsSchema {
		t.Fatalf("within the bound: %+v, want fail tool_args_schema", r)
	}
}

// Each bound refuses what is one past it and takes what is at it.
func TestSchemaBounds(t *testing.T) {
	members := func(n int) []byte { // n members: "properties" and n-1 properties
		var b strings.Builder
		b.WriteString(`{"properties":{`)
		for i := range n - 1 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d":{}`, i)
		}
		b.WriteString(`}}`)
		return []byte(b.String())
	}
	l := Limits{MaxSchemaBytes: 600, MaxSchemaDepth: 10, MaxSchemaKeywords: 40}
	for _, c := range []struct {
		name   string
		schema []byte
		why    string
	}{
		{"depth at the bound", depthOf(10), ""},
		{"depth past it", depthOf(11), WhySchemaDepth},
		{"members at the bound", members(40), ""},
		{"members past it", members(41), WhySchemaKeywords},
		{"bytes at the bound", []byte(`{"description":"` + strings.Repeat("x", 600-len(`{"description":""}`)) + `"}`), ""},
		{"bytes past it", []byte(`{"description":"` + strings.Repeat("x", 601-len(`{"description":""}`)) + `"}`), WhySchemaBytes},
	} {
		r := checkCall(&Checker{Limits: l}, c.schema, []byte(`{}`))
		want := Result{Status: Pass}
		if c.why != "" {
			want = Result{Status: Unchecked, Why: c.why}
		}
		if r.Status != want.Status || r.Why != want.Why {
			t.Errorf("%s (%d bytes): %+v, want %+v", c.name, len(c.schema), r, want)
		}
	}
}

// Arguments nested deeper than the JSON decoder reads (valid JSON, or
// not) are unchecked json_too_deep, with a schema or without; at the
// decoder's depth they are read.
func TestArgumentsTooDeep(t *testing.T) {
	deep := []byte(strings.Repeat("[", 100000) + strings.Repeat("]", 100000))
	atBound := []byte(strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth))
	for _, c := range []struct {
		name         string
		schema, args []byte
		want         Result
	}{
		{"100,000 deep, no schema", nil, deep, Result{Status: Unchecked, Why: WhyTooDeep}},
		{"100,000 deep, a schema", []byte(`{"type":"array"}`), deep, Result{Status: Unchecked, Why: WhyTooDeep}},
		{"at the decoder's depth", []byte(`{"type":"array"}`), atBound, Result{Status: Pass}},
		{"at the decoder's depth, not the schema's", []byte(`{"type":"object"}`), atBound, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
	} {
		r := checkCall(&Checker{}, c.schema, c.args)
		if r.Status != c.want.Status || r.Why != c.want.Why || fmt.Sprint(r.Failed) != fmt.Sprint(c.want.Failed) {
			t.Errorf("%s: %+v, want %+v", c.name, r, c.want)
		}
	}
}

// A schema whose subschemas apply to the same value through $refs, each
// definition to the next twice (2^30 evaluations), or through
// properties and patternProperties at once, down the answer's nesting
// (2^40 for 40 levels), is unchecked validation_too_costly, at the
// bound's cost (measured); the same schemas against small answers are
// checked.
func TestValidationBounded(t *testing.T) {
	var defs strings.Builder
	for i := range 30 {
		fmt.Fprintf(&defs, `"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%[2]d"}]},`, i, i+1)
	}
	fanOut := `{"$defs":{` + defs.String() + `"d30":{"type":"object"}},"$ref":"#/$defs/d0"}`
	twice := `{"$defs":{"t":{"type":"object","properties":{"a":{"$ref":"#/$defs/t"}},"patternProperties":{"^a$":{"$ref":"#/$defs/t"}}}},"$ref":"#/$defs/t"}`
	nest := func(n int) []byte { return []byte(strings.Repeat(`{"a":`, n) + `{}` + strings.Repeat(`}`, n)) }
	for _, c := range []struct {
		name, schema string
		args         []byte
		want         Result
	}{
		{"2^30 by $refs", fanOut, []byte(`{}`), Result{Status: Unchecked, Why: WhyEvaluations}},
		{"2^40 down the nesting", twice, nest(40), Result{Status: Unchecked, Why: WhyEvaluations}},
		{"2^4 down the nesting", twice, nest(4), Result{Status: Pass}},
		{"2^4 down the nesting, not the schema", twice, []byte(`{"a":{"a":1}}`), Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
	} {
		before := cpu(t)
		r := checkCall(&Checker{}, []byte(c.schema), c.args)
		used := cpu(t) - before
		if !same(r, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, r, c.want)
		}
		t.Logf("%s: %+v in %v of CPU", c.name, r, used)
	}
}

// FuzzShape: on JSON, shape's depth and member count are encoding/json's
// (a walk of its tokens); on anything, it returns, never past the bound
// by more than one level.
func FuzzShape(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c:{["}]}`, `"\\"{"`, `[[[]]]`, `{"a\"b":{"c":1},"d":[]}`, `{`, `]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		depth, members := shape(b, 8)
		if depth > 9 {
			t.Fatalf("%q: depth %d past the bound 8 by more than one", b, depth)
		}
		if !json.Valid(b) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		d, most, keys := 0, 0, 0
		var open []json.Delim
		expectKey := false
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			switch v := tok.(type) {
			case json.Delim:
				if v == '{' || v == '[' {
					if expectKey && len(open) > 0 && open[len(open)-1] == '{' {
						expectKey = false
					}
					d++
					most = max(most, d)
					open = append(open, v)
					expectKey = v == '{'
					continue
				}
				d--
				open = open[:len(open)-1]
				expectKey = len(open) > 0 && open[len(open)-1] == '{'
				continue
			case string:
				if expectKey {
					keys++
					expectKey = false
					continue
				}
			}
			expectKey = len(open) > 0 && open[len(open)-1] == '{'
		}
		if most <= 8 && (depth != most || members != keys) {
			t.Fatalf("%q: shape %d deep, %d members; encoding/json %d, %d", b, depth, members, most, keys)
		}
	})
}

// gate is a compile clock that holds each compile at its first reading
// until released, and counts the compiles inside at once.
type gate struct {
	mu           sync.Mutex
	inside, most int
	entered      chan struct{}
	release      chan struct{}
}

func (g *gate) read() time.Duration {
	g.mu.Lock()
	g.inside++
	g.most = max(g.most, g.inside)
	g.mu.Unlock()
	g.entered <- struct{}{}
	<-g.release
	g.mu.Lock()
	g.inside--
	g.mu.Unlock()
	return 0
}

// Compiles are bounded in number (MaxCompiling): eight checks of eight
// distinct schemas, each compile held at its clock, have at most two
// compiles inside at once, and each gets its turn; eight checks of one
// new schema at once compile it once.
func TestCompilesInTurn(t *testing.T) {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	k := &Checker{MaxCompiling: 2, cpu: g.read}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if r := checkCall(k, []byte(fmt.Sprintf(`{"maxProperties":%d}`, i+1)), []byte(`{}`)); r.Status != Pass {
				t.Errorf("schema %d: %+v", i, r)
			}
		})
	}
	// Two compiles in: a compile held at its first reading cannot
	// read again, so the second is another's.
	<-g.entered
	<-g.entered
	g.release <- struct{}{}
	g.release <- struct{}{}
	// Each compile reads its clock twice (start, end): 14 readings more.
	for range 14 {
		<-g.entered
		g.mu.Lock()
		inside := g.inside
		g.mu.Unlock()
		if inside > 2 {
			t.Fatalf("%d compiles inside at once, bound 2", inside)
		}
		g.release <- struct{}{}
	}
	wg.Wait()
	if g.most != 2 {
		t.Fatalf("at most %d compiles at once, want 2", g.most)
	}

	one := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	k = &Checker{cpu: one.read}
	for range 8 {
		wg.Go(func() { checkCall(k, []byte(`{"type":"object"}`), []byte(`{}`)) })
	}
	<-one.entered
	one.release <- struct{}{}
	<-one.entered // the one compile's second reading
	one.release <- struct{}{}
	wg.Wait()
	if one.most != 1 || len(k.schemas) != 1 {
		t.Fatalf("one schema: %d compiles at once, %d cached", one.most, len(k.schemas))
	}
}

// Record writes the check's names into the record, and a check that
// panics (here on a nil Declared with a call collected) leaves the
// record unchecked, check_panicked, instead of losing it.
func TestRecordPanic(t *testing.T) {
	k := &Checker{}
	d := &stream.Declared{Tools: []stream.DeclaredTool{{Name: "f", Schema: []byte(`false`)}}}
	col := collect(k, d, chatCall("f", []byte(`{}`)))
	defer col.Release()
	var rec record.Record
	k.Record(&rec, d, col, false, false, false)
	if rec.Structure != Fail || fmt.Sprint(rec.StructureFailed) != "[tool_args_schema]" || rec.StructureUnchecked != "" {
		t.Fatalf("record %q %v %q, want fail [tool_args_schema]", rec.Structure, rec.StructureFailed, rec.StructureUnchecked)
	}
	rec = record.Record{}
	k.Record(&rec, nil, col, false, false, false)
	if rec.Structure != Unchecked || rec.StructureFailed != nil || rec.StructureUnchecked != WhyPanic {
		t.Fatalf("record %q %v %q, want unchecked %s", rec.Structure, rec.StructureFailed, rec.StructureUnchecked, WhyPanic)
	}
}

// A compile that panics (here its clock) refuses its schema,
// check_panicked, gives its turn back and answers the checks: with one
// turn, the next schema still compiles.
func TestCompilePanic(t *testing.T) {
	panics := true
	k := &Checker{MaxCompiling: 1, cpu: func() time.Duration {
		if panics {
			panic("the clock")
		}
		return 0
	}}
	if r := checkCall(k, []byte(`{"type":"object"}`), []byte(`{}`)); !same(r, Result{Status: Unchecked, Why: WhyPanic}) {
		t.Fatalf("%+v, want unchecked %s", r, WhyPanic)
	}
	panics = false
	if r := checkCall(k, []byte(`{"type":"array"}`), []byte(`{}`)); !same(r, Result{Status: Fail, Failed: []string{ToolArgsSchema}}) {
		t.Fatalf("the next schema: %+v, want fail tool_args_schema", r)
	}
}
