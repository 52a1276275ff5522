package config

import (
	"fmt"
	"regexp"
)

// Tracing is the tracing section. The OTel SDK itself is configured
// through the standard OTEL_* environment (endpoint, protocol, headers,
// service name, resource attributes, sampler, exporters), as with any
// OTel SDK; this section holds what the environment cannot say.
//
// The zero value keeps every span the head sampler keeps, names the
// provider "openai_compatible" and captures no content.
type Tracing struct {
	// ProviderName is gen_ai.provider.name; empty means
	// "openai_compatible" (docs/tracing.md explains the trade-off).
	ProviderName string `yaml:"provider_name"`
	// Keep is "all" (default: the head sampler of OTEL_TRACES_SAMPLER
	// decides) or "slow_or_failed": every request that missed an SLO or
	// failed is exported, and KeepRatio of the rest, decided when the
	// request ends.
	Keep      string  `yaml:"keep"`
	KeepRatio float64 `yaml:"keep_ratio"`
	// CaptureContent records prompts and completions on the spans
	// (opt-in, pre-production), redacted and truncated.
	CaptureContent  bool     `yaml:"capture_content"`
	MaxContentBytes int      `yaml:"max_content_bytes"`
	Redact          []string `yaml:"redact"` // extra regular expressions
}

// Bounds on tracing.redact: every pattern runs over every captured
// message part, so their number and size are the cost of content
// capture per request.
const (
	MaxRedactPatterns     = 64
	MaxRedactPatternBytes = 1024
)

// Validate returns one error per problem.
func (c Tracing) Validate() []error {
	var errs []error
	switch c.Keep {
	case "", "all", "slow_or_failed":
	default:
		errs = append(errs, fmt.Errorf("tracing.keep: must be all or slow_or_failed, got %q", c.Keep))
	}
	if c.KeepRatio < 0 || c.KeepRatio > 1 {
		errs = append(errs, fmt.Errorf("tracing.keep_ratio: must be in [0,1], got %v", c.KeepRatio))
	}
	if n := len(c.Redact); n > MaxRedactPatterns {
		errs = append(errs, fmt.Errorf("tracing.redact: %d patterns, at most %d (each runs over every captured message)", n, MaxRedactPatterns))
	}
	for i, r := range c.Redact {
		if len(r) > MaxRedactPatternBytes {
			errs = append(errs, fmt.Errorf("tracing.redact[%d]: %d bytes, at most %d", i, len(r), MaxRedactPatternBytes))
			continue
		}
		if _, err := regexp.Compile(r); err != nil {
			errs = append(errs, fmt.Errorf("tracing.redact: %v", err))
		}
	}
	if c.MaxContentBytes < 0 {
		errs = append(errs, fmt.Errorf("tracing.max_content_bytes: must not be negative"))
	}
	return errs
}
