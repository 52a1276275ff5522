package config

import (
	"cmp"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokentap/tokentap/stream"
)

// ProbeDef is one named probe. Zero fields take the defaults given per field.
type ProbeDef struct {
	Name string `yaml:"name"`
	// API is the wire format and route the probe speaks: one of
	// ProbeAPIs (the APIs of stream/api.go; docs/probe.md lists their
	// routes); "" means chat.
	API    string `yaml:"api"`
	Stream *bool  `yaml:"stream"` // default true
	Model  string `yaml:"model"`  // sent as is; default: the simulator's model or "default"
	// Prompt is sent as the user message (chat) or prompt (completions).
	// PromptTokens > 0 instead builds a deterministic prompt of about that
	// many tokens, for a fixed prefill size.
	Prompt       string   `yaml:"prompt"`
	PromptTokens int      `yaml:"prompt_tokens"`
	MaxTokens    int      `yaml:"max_tokens"`  // default 16
	Temperature  *float64 `yaml:"temperature"` // default 0
	Seed         *int64   `yaml:"seed"`        // default 42, where the engine honours it
	// IgnoreEOS asks the engine to generate exactly max_tokens, with the
	// API's own option (stream.Request.IgnoreEOS: vLLM's, SGLang's and
	// llama.cpp's ignore_eos): a shape-controlled probe. Refused for an
	// API that has none.
	IgnoreEOS bool              `yaml:"ignore_eos"`
	Headers   map[string]string `yaml:"headers"`
	// APIKeyFile or APIKeyEnv supply the API key, sent in the API's own
	// key header (stream.API.KeyHeader: a bearer token, Anthropic's
	// x-api-key, Gemini's x-goog-api-key); it is never logged.
	APIKeyFile string `yaml:"api_key_file"`
	APIKeyEnv  string `yaml:"api_key_env"`
	// Timeout bounds one probe; default 30s.
	Timeout time.Duration `yaml:"timeout"`
	// Interval is the mean time between scheduled probes; default 30s.
	Interval time.Duration `yaml:"interval"`
	// Schedule is "fixed" (default: every Interval, with relative Jitter)
	// or "poisson" (exponential gaps of mean Interval).
	Schedule string  `yaml:"schedule"`
	Jitter   float64 `yaml:"jitter"`
	// MaxConcurrent caps probes of this definition in flight; default 1.
	MaxConcurrent int `yaml:"max_concurrent"`
	// Target is "upstream" (default: measures the engine) or "sidecar"
	// (through the sidecar's own listener: measures the whole path).
	Target string `yaml:"target"`
	// URL, when set, is the base URL the probe is sent to instead of the
	// upstream: a hosted API (https://api.openai.com), with the system's
	// roots verifying its certificate. Put the key in api_key_env or
	// api_key_file, never in the URL.
	URL    string `yaml:"url"`
	Expect Expect `yaml:"expect"`
	// RecordPrompt puts the prompt text into /probes failures; off by
	// default.
	RecordPrompt bool `yaml:"record_prompt"`
}

// Expect is the quality check. Every set field must hold; a fast wrong
// answer is a failed probe.
type Expect struct {
	Contains        string `yaml:"contains"`
	Regex           string `yaml:"regex"`
	Exact           string `yaml:"exact"`
	JSONSchema      string `yaml:"json_schema"` // the schema as JSON text
	FinishReason    string `yaml:"finish_reason"`
	OutputTokensMin int64  `yaml:"output_tokens_min"`
	OutputTokensMax int64  `yaml:"output_tokens_max"` // 0: no upper bound
}

// Probes is the probes section (docs/probe.md).
//
// The zero value declares no probe (the built-in simulator adds its own
// default), never makes /readyz depend on probes, and keeps 50 results.
type Probes struct {
	Probes []ProbeDef `yaml:"probes"`
	// ReadyAfterFailures > 0 makes /readyz unready after that many
	// consecutive failed probes of any one definition (see docs/probe.md
	// for the risks). 0 (default) leaves readiness to the upstream check.
	ReadyAfterFailures int `yaml:"ready_after_failures"`
	// History is how many recent results each probe keeps for /probes;
	// default 50. Failures are kept in a second list of the same size.
	History int `yaml:"history"`
}

// ProbeAPIs returns the APIs a probe can speak: those stream describes
// with a probe request.
func ProbeAPIs() []string {
	var as []string
	for _, a := range stream.APIs() {
		if a.Probe != nil {
			as = append(as, string(a.Name))
		}
	}
	return as
}

// WithDefaults fills the zero fields; call Validate first.
func (c Probes) WithDefaults(defaultModel string) Probes {
	if c.History <= 0 {
		c.History = 50
	}
	out := make([]ProbeDef, len(c.Probes))
	for i, d := range c.Probes {
		if d.API == "" {
			d.API = stream.NameChat
		}
		if d.Stream == nil {
			t := true
			d.Stream = &t
		}
		if d.Model == "" {
			d.Model = defaultModel
		}
		if d.MaxTokens <= 0 {
			d.MaxTokens = 16
		}
		if d.Temperature == nil {
			z := 0.0
			d.Temperature = &z
		}
		if d.Seed == nil {
			s := int64(42)
			d.Seed = &s
		}
		if d.Timeout <= 0 {
			d.Timeout = 30 * time.Second
		}
		if d.Interval <= 0 {
			d.Interval = 30 * time.Second
		}
		if d.Schedule == "" {
			d.Schedule = "fixed"
		}
		if d.MaxConcurrent <= 0 {
			d.MaxConcurrent = 1
		}
		if d.Target == "" {
			d.Target = "upstream"
		}
		if d.Prompt == "" && d.PromptTokens == 0 {
			d.Prompt = "Reply with one short sentence."
		}
		out[i] = d
	}
	c.Probes = out
	return c
}

// CompileSchema compiles a probe's expect.json_schema.
func CompileSchema(text string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("probe.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("probe.json")
}

// Validate returns one error per problem, naming the probe and the field.
func (c Probes) Validate() []error {
	var errs []error
	seen := map[string]bool{}
	for i, d := range c.Probes {
		name := d.Name
		bad := func(f string, a ...any) {
			errs = append(errs, fmt.Errorf("probe %s: "+f, append([]any{name}, a...)...))
		}
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
			bad("name is required")
		} else if seen[name] {
			bad("name is used twice")
		}
		seen[name] = true
		if len(name) > 64 {
			bad("name longer than 64 bytes")
		}
		if d.API != "" && !slices.Contains(ProbeAPIs(), d.API) {
			bad("api must be one of %s, got %q", strings.Join(ProbeAPIs(), ", "), d.API)
		} else if a := stream.LookupAPI(cmp.Or(d.API, stream.NameChat)); d.IgnoreEOS && a.Request.IgnoreEOS == "" {
			bad("ignore_eos: the %s API has no such option (its limit is a cap)", a.Name)
		}
		if d.Schedule != "" && d.Schedule != "fixed" && d.Schedule != "poisson" {
			bad("schedule must be fixed or poisson, got %q", d.Schedule)
		}
		if d.Target != "" && d.Target != "upstream" && d.Target != "sidecar" {
			bad("target must be upstream or sidecar, got %q", d.Target)
		}
		if d.URL != "" {
			if u, err := url.Parse(d.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
				bad("url must be an http(s) URL with a host and no credentials, got %q", Redacted(d.URL))
			}
			if d.Target == "sidecar" {
				bad("url and target: sidecar exclude each other")
			}
		}
		if d.Interval < 0 || (d.Interval > 0 && d.Interval < 100*time.Millisecond) {
			bad("interval must be at least 100ms")
		}
		if d.Jitter < 0 || d.Jitter >= 1 {
			bad("jitter must be in [0,1)")
		}
		if d.MaxConcurrent < 0 || d.MaxTokens < 0 || d.PromptTokens < 0 {
			bad("max_concurrent, max_tokens and prompt_tokens must not be negative")
		}
		if d.Expect.Regex != "" {
			if _, err := regexp.Compile(d.Expect.Regex); err != nil {
				bad("expect.regex: %v", err)
			}
		}
		if d.Expect.JSONSchema != "" {
			if _, err := CompileSchema(d.Expect.JSONSchema); err != nil {
				bad("expect.json_schema: %v", err)
			}
		}
		if d.Expect.OutputTokensMax > 0 && d.Expect.OutputTokensMax < d.Expect.OutputTokensMin {
			bad("expect.output_tokens_max is below output_tokens_min")
		}
		if d.APIKeyFile != "" {
			if _, err := os.Stat(d.APIKeyFile); err != nil {
				bad("api_key_file: %v", err)
			}
		}
		if len(c.Probes) > 16 {
			errs = append(errs, fmt.Errorf("probes: at most 16 (the probe name is a label)"))
			break
		}
	}
	if c.ReadyAfterFailures < 0 {
		errs = append(errs, fmt.Errorf("probes.ready_after_failures must not be negative"))
	}
	return errs
}
