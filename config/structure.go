package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Structure is the structure section (docs/config.md, structure): what
// a declared schema may cost the structure checks, and the draft of a
// schema that names no $schema (docs/slo.md, "Structure"). The zero
// value takes every default.
type Structure struct {
	// DefaultDraft is the JSON Schema draft of a schema that names no
	// $schema, as the schema library names them (SchemaDrafts); ""
	// means draft2020 (2020-12).
	DefaultDraft string `yaml:"default_draft"`
	// MaxSchemaBytes bounds one declared schema's bytes; 0 means 64 KiB.
	MaxSchemaBytes int `yaml:"max_schema_bytes"`
	// MaxSchemaDepth bounds its nesting (objects and arrays); 0 means 64.
	MaxSchemaDepth int `yaml:"max_schema_depth"`
	// MaxSchemaKeywords bounds its object members, all levels together;
	// 0 means 2,000.
	MaxSchemaKeywords int `yaml:"max_schema_keywords"`
	// MaxCompile bounds the time one schema's compile may take; 0 means
	// 100ms.
	MaxCompile time.Duration `yaml:"max_compile"`
}

// SchemaDrafts are the values of structure.default_draft: the drafts
// the schema library reads (jsonschema.Draft4 ... Draft2020), in its
// names (package structure, Drafts).
var SchemaDrafts = []string{"draft4", "draft6", "draft7", "draft2019", "draft2020"}

// The upper bounds of the structure section's limits: past them a
// schema could cost seconds of CPU and hundreds of megabytes
// (docs/slo.md, "What a schema may cost"). The depth's is the lowest:
// a compile's cost grows faster than its depth (400 levels of
// properties, 800 deep, took 1.7 s) and is stopped only at patterns.
const (
	MaxSchemaBytesLimit    = 4 << 20
	MaxSchemaDepthLimit    = 256
	MaxSchemaKeywordsLimit = 20000
	MaxCompileLimit        = 10 * time.Second
)

// Validate returns one error per problem, each naming its setting.
func (s Structure) Validate() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if s.DefaultDraft != "" && !slices.Contains(SchemaDrafts, s.DefaultDraft) {
		bad("structure.default_draft: must be one of %s, got %q", strings.Join(SchemaDrafts, ", "), s.DefaultDraft)
	}
	limit := func(name string, v, most int) {
		if v < 0 || v > most {
			bad("structure.%s: must be between 0 (the default) and %d, got %d", name, most, v)
		}
	}
	limit("max_schema_bytes", s.MaxSchemaBytes, MaxSchemaBytesLimit)
	limit("max_schema_depth", s.MaxSchemaDepth, MaxSchemaDepthLimit)
	limit("max_schema_keywords", s.MaxSchemaKeywords, MaxSchemaKeywordsLimit)
	if s.MaxCompile < 0 || s.MaxCompile > MaxCompileLimit {
		bad("structure.max_compile: must be between 0 (the default) and %v, got %v", MaxCompileLimit, s.MaxCompile)
	}
	return errs
}
