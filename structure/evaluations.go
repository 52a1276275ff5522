package structure

import "github.com/santhosh-tekuri/jsonschema/v6"

// MaxEvaluations bounds the schema evaluations one validation may ask
// for (affordable): an answer's value against each subschema that may
// apply to it, and each pattern matched against a property name.
// Within it (an array of 128 Ki numbers, each checked against items,
// is half of it) a validation costs the library tens of milliseconds; a
// schema whose subschemas apply to the same value through many $refs
// (allOf of two $refs, each to a definition that does the same, 30
// deep) would otherwise ask for 2^30.
const MaxEvaluations = 1 << 18

// affordable reports whether validating v against s takes at most
// MaxEvaluations evaluations. It counts as if every subschema that may
// apply did (anyOf and oneOf in full, if with both then and else, a
// $dynamicRef or $recursiveRef at its static target), an upper bound of
// what the library does, and stops counting at the bound: its own cost
// is bounded by it.
func affordable(s *jsonschema.Schema, v any) bool {
	c := evalCount{left: MaxEvaluations}
	return c.visit(s, v, 0)
}

type evalCount struct{ left int }

// maxEvalDepth bounds visit's recursion: the instance's depth (at most
// MaxJSONDepth) and a chain of $refs at one value.
const maxEvalDepth = MaxJSONDepth + 1000

func (c *evalCount) visit(s *jsonschema.Schema, v any, depth int) bool {
	if s == nil {
		return true
	}
	if c.left--; c.left < 0 || depth > maxEvalDepth {
		return false
	}
	depth++
	if s.DynamicRef != nil && !c.visit(s.DynamicRef.Ref, v, depth) {
		return false
	}
	for _, x := range [...]*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else} {
		if !c.visit(x, v, depth) {
			return false
		}
	}
	for _, l := range [...][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for _, x := range l {
			if !c.visit(x, v, depth) {
				return false
			}
		}
	}
	for _, x := range s.DependentSchemas {
		if !c.visit(x, v, depth) {
			return false
		}
	}
	for _, x := range s.Dependencies {
		if x, ok := x.(*jsonschema.Schema); ok && !c.visit(x, v, depth) {
			return false
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for k, val := range v {
			p, named := s.Properties[k]
			if !c.visit(p, val, depth) {
				return false
			}
			if c.left -= len(s.PatternProperties); c.left < 0 {
				return false
			}
			for re, p := range s.PatternProperties {
				if re.MatchString(k) {
					named = true
					if !c.visit(p, val, depth) {
						return false
					}
				}
			}
			if a, ok := s.AdditionalProperties.(*jsonschema.Schema); ok && !named && !c.visit(a, val, depth) {
				return false
			}
			if !c.visit(s.UnevaluatedProperties, val, depth) || !c.visit(s.PropertyNames, k, depth) {
				return false
			}
		}
	case []any:
		for i, item := range v {
			var old, now *jsonschema.Schema // items before 2020-12, and since
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				old = items
			case []*jsonschema.Schema:
				if i < len(items) {
					old = items[i]
				} else if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
					old = a
				}
			}
			if now = s.Items2020; i < len(s.PrefixItems) {
				now = s.PrefixItems[i]
			}
			for _, x := range [...]*jsonschema.Schema{old, now, s.Contains, s.UnevaluatedItems} {
				if !c.visit(x, item, depth) {
					return false
				}
			}
		}
	}
	return true
}
