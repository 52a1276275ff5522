// Package probe sends low-rate synthetic canary requests on an open-loop
// schedule and measures them with the same stream tap, record and SLO
// verdicts as live traffic (docs/measurement.md §7). A probe fires at its
// scheduled instants whatever the engine does; one that cannot be sent on
// time is recorded as not_sent, never dropped.
package probe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/stream"
)

// The section types live in package config (a leaf).
type (
	Config = config.Probes
	Def    = config.ProbeDef
	Expect = config.Expect
)

// Check result names: a bounded label set.
const (
	CheckContains     = "contains"
	CheckRegex        = "regex"
	CheckExact        = "exact"
	CheckJSONSchema   = "json_schema"
	CheckFinishReason = "finish_reason"
	CheckOutputTokens = "output_tokens"
)

// request builds the path and body of a probe in its API's own shape
// (stream.API.Probe). d.API is one of config.ProbeAPIs (Validate).
func request(d *Def) (string, []byte) {
	prompt := d.Prompt
	if d.PromptTokens > 0 {
		prompt = fixedPrompt(d.PromptTokens)
	}
	a := stream.LookupAPI(d.API)
	path, m := a.Probe(stream.ProbeParams{Model: d.Model, Prompt: prompt, MaxTokens: d.MaxTokens,
		Temperature: *d.Temperature, Seed: *d.Seed, Stream: *d.Stream})
	if d.IgnoreEOS && a.Request.IgnoreEOS != "" { // Validate refuses it where the API has none
		m[a.Request.IgnoreEOS] = true
	}
	b, _ := json.Marshal(m)
	return path, b
}

// fixedPrompt is a deterministic prompt of about n tokens: n short common
// words, which every tokenizer we know counts as about one token each.
func fixedPrompt(n int) string {
	words := []string{"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept"}
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[i%len(words)])
	}
	return b.String()
}

// checker is a probe's quality check with its patterns compiled.
type checker struct {
	Expect
	re     *regexp.Regexp
	schema *jsonschema.Schema
}

// newChecker compiles e (validated by config: errors cannot happen).
func newChecker(e Expect) *checker {
	c := &checker{Expect: e}
	if e.Regex != "" {
		c.re, _ = regexp.Compile(e.Regex)
	}
	if e.JSONSchema != "" {
		c.schema, _ = config.CompileSchema(e.JSONSchema)
	}
	return c
}

// check runs the quality checks on a response's text, finish reason and
// output tokens; it returns the first failing check and why.
func (e *checker) check(text, finish string, outputTokens int64) (string, string) {
	switch {
	case e.Contains != "" && !strings.Contains(text, e.Contains):
		return CheckContains, fmt.Sprintf("text does not contain %q", e.Contains)
	case e.re != nil && !e.re.MatchString(text):
		return CheckRegex, fmt.Sprintf("text does not match %q", e.Regex)
	case e.Exact != "" && text != e.Exact:
		return CheckExact, "text is not the expected text"
	case e.FinishReason != "" && finish != e.FinishReason:
		return CheckFinishReason, fmt.Sprintf("finish_reason %q, want %q", finish, e.FinishReason)
	case e.OutputTokensMin > 0 && outputTokens < e.OutputTokensMin,
		e.OutputTokensMax > 0 && outputTokens > e.OutputTokensMax:
		return CheckOutputTokens, fmt.Sprintf("%d output tokens, want [%d,%d]", outputTokens, e.OutputTokensMin, e.OutputTokensMax)
	}
	if e.schema != nil {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
		if err == nil {
			err = e.schema.Validate(v)
		}
		if err != nil {
			msg := err.Error()
			if len(msg) > 200 {
				msg = msg[:200]
			}
			return CheckJSONSchema, "output is not valid for the schema: " + msg
		}
	}
	return "", ""
}
