package structure

import (
	"fmt"
	"slices"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/stream"
)

// Boolean schemas: true passes every instance, false none (the tool's
// arguments and the output alike); arguments that are not JSON are
// still invalid JSON under either.
func TestBooleanSchemas(t *testing.T) {
	for _, c := range []struct {
		schema, args string
		want         Result
	}{
		{"true", `{"a":1}`, Result{Status: Pass}},
		{"true", `[]`, Result{Status: Pass}},
		{"false", `{"a":1}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"false", `{}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"false", `{"a":`, Result{Status: Fail, Failed: []string{ToolArgsInvalidJSON}}},
		{"true", `{"a":`, Result{Status: Fail, Failed: []string{ToolArgsInvalidJSON}}},
	} {
		if r := checkCall(&Checker{}, []byte(c.schema), []byte(c.args)); !same(r, c.want) {
			t.Errorf("tool schema %s, arguments %s: %+v, want %+v", c.schema, c.args, r, c.want)
		}
	}
	for _, c := range []struct {
		schema string
		want   Result
	}{{"true", Result{Status: Pass}}, {"false", Result{Status: Fail, Failed: []string{OutputSchema}}}} {
		d := &stream.Declared{JSON: true, Schema: []byte(c.schema)}
		k := &Checker{}
		col := collect(k, d, chatText([]byte(`{"city":"x"}`)))
		if r := k.Check(d, col, false, false, false); !same(r, c.want) {
			t.Errorf("output schema %s: %+v, want %+v", c.schema, r, c.want)
		}
		col.Release()
	}
}

func same(a, b Result) bool {
	return a.Status == b.Status && a.Why == b.Why && slices.Equal(a.Failed, b.Failed)
}

// The $schema URL of each draft the library reads.
var draftURLs = map[string]string{
	"draft4":    "http://json-schema.org/draft-04/schema#",
	"draft6":    "http://json-schema.org/draft-06/schema#",
	"draft7":    "http://json-schema.org/draft-07/schema#",
	"draft2019": "https://json-schema.org/draft/2019-09/schema",
	"draft2020": "https://json-schema.org/draft/2020-12/schema",
}

// Each supported draft, named by $schema, is read as that draft: a
// keyword that the draft brought (or whose meaning it changed) is
// applied, and the draft before it ignores it (or refuses it).
func TestEachDraftNamed(t *testing.T) {
	for _, c := range []struct {
		draft, body, args string
		want              Result
		before            Result // the same body under the draft before
	}{
		// draft 4: exclusiveMaximum is a boolean modifier of maximum.
		{"draft4", `"properties":{"n":{"maximum":10,"exclusiveMaximum":true}}`, `{"n":10}`,
			Result{Status: Fail, Failed: []string{ToolArgsSchema}}, Result{}},
		// draft 6: const.
		{"draft6", `"properties":{"n":{"const":1}}`, `{"n":2}`,
			Result{Status: Fail, Failed: []string{ToolArgsSchema}}, Result{Status: Pass}},
		// draft 7: if/then.
		{"draft7", `"properties":{"n":{"if":{"minimum":5},"then":{"multipleOf":2}}}`, `{"n":7}`,
			Result{Status: Fail, Failed: []string{ToolArgsSchema}}, Result{Status: Pass}},
		// 2019-09: dependentRequired.
		{"draft2019", `"dependentRequired":{"a":["b"]}`, `{"a":1}`,
			Result{Status: Fail, Failed: []string{ToolArgsSchema}}, Result{Status: Pass}},
		// 2020-12: prefixItems.
		{"draft2020", `"properties":{"n":{"prefixItems":[{"type":"string"}]}}`, `{"n":[1]}`,
			Result{Status: Fail, Failed: []string{ToolArgsSchema}}, Result{Status: Pass}},
	} {
		schema := fmt.Sprintf(`{"$schema":%q,%s}`, draftURLs[c.draft], c.body)
		if r := checkCall(&Checker{}, []byte(schema), []byte(c.args)); !same(r, c.want) {
			t.Errorf("%s: %+v, want %+v", schema, r, c.want)
		}
		i := slices.Index(Drafts, c.draft)
		if i == 0 {
			continue
		}
		schema = fmt.Sprintf(`{"$schema":%q,%s}`, draftURLs[Drafts[i-1]], c.body)
		if r := checkCall(&Checker{}, []byte(schema), []byte(c.args)); !same(r, c.before) {
			t.Errorf("%s: %+v, want %+v", schema, r, c.before)
		}
	}
	// Draft 4's boolean exclusiveMaximum is no schema under draft 6.
	schema := fmt.Sprintf(`{"$schema":%q,"properties":{"n":{"maximum":10,"exclusiveMaximum":true}}}`, draftURLs["draft6"])
	if r := checkCall(&Checker{}, []byte(schema), []byte(`{"n":10}`)); !same(r, Result{Status: Unchecked, Why: WhySchema}) {
		t.Errorf("%s: %+v, want unchecked %s", schema, r, WhySchema)
	}
}

// A schema that names no $schema is read as the default draft: 2020-12
// unless Checker.DefaultDraft names another. Under 2020-12 a draft-07
// schema's array-form items does not compile and $ref's siblings apply;
// under draft7 items checks each element and $ref's siblings are
// ignored.
func TestDefaultDraft(t *testing.T) {
	items := `{"properties":{"n":{"items":[{"type":"string"}]}}}`
	ref := `{"definitions":{"s":{"type":"string"}},"properties":{"n":{"$ref":"#/definitions/s","maxLength":2}}}`
	for _, c := range []struct {
		def, schema, args string
		want              Result
	}{
		{"", items, `{"n":[1]}`, Result{Status: Unchecked, Why: WhySchema}},
		{"draft2020", items, `{"n":[1]}`, Result{Status: Unchecked, Why: WhySchema}},
		{"draft7", items, `{"n":[1]}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"draft7", items, `{"n":["x",1]}`, Result{Status: Pass}},
		{"", ref, `{"n":"abcd"}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"draft7", ref, `{"n":"abcd"}`, Result{Status: Pass}},
		{"draft7", ref, `{"n":1}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		{"draft4", `{"properties":{"n":{"maximum":10,"exclusiveMaximum":true}}}`, `{"n":10}`, Result{Status: Fail, Failed: []string{ToolArgsSchema}}},
		// A schema that names its draft is read as that draft, whatever the default.
		{"draft7", `{"$schema":"https://json-schema.org/draft/2020-12/schema","properties":{"n":{"items":[{"type":"string"}]}}}`, `{"n":[1]}`, Result{Status: Unchecked, Why: WhySchema}},
	} {
		if r := checkCall(&Checker{DefaultDraft: c.def}, []byte(c.schema), []byte(c.args)); !same(r, c.want) {
			t.Errorf("default %q, %s, arguments %s: %+v, want %+v", c.def, c.schema, c.args, r, c.want)
		}
	}
}

// The configuration's names of the drafts are the checker's.
func TestDraftNames(t *testing.T) {
	if !slices.Equal(config.SchemaDrafts, Drafts) {
		t.Fatalf("config.SchemaDrafts %q, structure.Drafts %q", config.SchemaDrafts, Drafts)
	}
	for _, d := range Drafts {
		if draft(d) == nil {
			t.Errorf("%s: not read", d)
		}
	}
	if draft("draft-07") != nil || draft("") != jsonschema.Draft2020 || DefaultDraft != "draft2020" {
		t.Errorf("draft-07 read, or \"\" refused, or the default %q", DefaultDraft)
	}
}
