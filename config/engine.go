package config

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Engine is the engine section: the scraper of the upstream engine's own
// Prometheus metrics (docs/engine-signals.md).
//
// Every zero field takes its default in WithDefaults: the zero value is
// EngineDefaults (scrape, every 5s, within 2s; detect the path and the
// kind; no passthrough).
type Engine struct {
	// Enabled is auto (the default: scrape, say once when the engine has
	// no metrics), on (the same, said as an error) or off.
	Enabled string `yaml:"enabled"`
	// Interval between scrapes; 0 means 5s. It bounds how precisely a
	// preemption can be tied to a request (docs/engine-signals.md).
	Interval time.Duration `yaml:"interval"`
	// Path of the engine's metrics endpoint; empty detects it: /metrics,
	// then /prometheus/metrics (trtllm-serve), then Ollama's /api/ps.
	Path string `yaml:"path"`
	// Timeout bounds one scrape; 0 means 2s (and never more than Interval).
	Timeout time.Duration `yaml:"timeout"`
	// Kind names the engine: vllm, sglang, tgi, llamacpp, trtllm, dynamo,
	// ollama or simulator; empty or auto detects it from the metric names.
	Kind string `yaml:"kind"`
	// Passthrough re-exports the engine's own metric families, as last
	// scraped, on the sidecar's /metrics.
	Passthrough bool `yaml:"passthrough"`
	// MaxRunning is the engine's max running sequences, as it was
	// started with (vLLM --max-num-seqs, SGLang --max-running-requests,
	// OLLAMA_NUM_PARALLEL, the simulator's max_batch): the requests in
	// flight at a request's arrival at or above it put a slow first
	// token down to the queue (docs/measurement.md §6b). 0: unknown, the
	// engine's waiting gauge alone says so.
	MaxRunning int `yaml:"max_running"`
}

// EngineKinds are the values Kind accepts besides "" and "auto"
// (stream.EngineKinds).
var EngineKinds = stream.EngineKinds

// EngineDefaults returns the engine section before any file, env or flag.
func EngineDefaults() Engine {
	return Engine{Enabled: "auto", Interval: 5 * time.Second, Timeout: 2 * time.Second}
}

// WithDefaults fills the zero fields.
func (c Engine) WithDefaults() Engine {
	d := EngineDefaults()
	if c.Enabled == "" {
		c.Enabled = d.Enabled
	}
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.Timeout <= 0 {
		c.Timeout = d.Timeout
	}
	c.Timeout = min(c.Timeout, c.Interval)
	if c.Kind == "auto" {
		c.Kind = ""
	}
	return c
}

func (c *Engine) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Enabled, "engine", c.Enabled, "scrape the engine's own Prometheus metrics: auto, on or off")
	fs.DurationVar(&c.Interval, "engine.interval", c.Interval, "engine metrics scrape interval")
	fs.StringVar(&c.Path, "engine.path", c.Path, "engine metrics path (empty: /metrics, /prometheus/metrics, then Ollama's /api/ps)")
	fs.DurationVar(&c.Timeout, "engine.timeout", c.Timeout, "bound on one engine metrics scrape")
	fs.StringVar(&c.Kind, "engine.kind", c.Kind, "engine kind: "+strings.Join(EngineKinds, ", ")+" (empty or auto: detected from the metric names)")
	fs.BoolVar(&c.Passthrough, "engine.passthrough", c.Passthrough, "also re-export the engine's own metric families untouched")
	fs.IntVar(&c.MaxRunning, "engine.max-running", c.MaxRunning, "the engine's max running sequences, for the queue cause of a slow first token (0: unknown)")
}

// Validate returns one error per problem, naming the field.
func (c Engine) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	switch c.Enabled {
	case "", "auto", "on", "off":
	default:
		bad("engine.enabled: must be auto, on or off, got %q", c.Enabled)
	}
	if c.Interval != 0 && c.Interval < 100*time.Millisecond {
		bad("engine.interval: must be at least 100ms, got %v", c.Interval)
	}
	if c.Timeout < 0 {
		bad("engine.timeout: must not be negative")
	}
	if c.MaxRunning < 0 {
		bad("engine.max_running: must not be negative, got %d", c.MaxRunning)
	}
	if c.Path != "" && !strings.HasPrefix(c.Path, "/") {
		bad("engine.path: must start with /, got %q", c.Path)
	}
	if c.Kind != "" && c.Kind != "auto" {
		known := false
		for _, k := range EngineKinds {
			known = known || k == c.Kind
		}
		if !known {
			bad("engine.kind: must be auto or one of %s, got %q", strings.Join(EngineKinds, ", "), c.Kind)
		}
	}
	return errs
}
