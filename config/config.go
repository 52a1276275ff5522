// Package config loads the sidecar's configuration: defaults, then a YAML
// file (--config), then environment variables (TOKENTAP_<FLAG>), then
// flags, each overriding the one before. Validation reports every problem
// at once.
package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration. The zero value is not useful; start
// from Defaults.
type Config struct {
	// Upstream is the engine's base URL (http or https). Empty runs the
	// built-in simulated engine and proxies to it.
	Upstream string `yaml:"upstream"`
	// Listen is the proxy's address.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz.
	AdminListen string `yaml:"admin_listen"`
	// Records is where finished-request records go as JSON lines: a file
	// path (appended to), "-" for stdout, or empty for nowhere.
	Records string `yaml:"records"`
	// InjectUsage asks the engine for usage on streams whose client did
	// not, and removes it from the client's stream (exact token counts).
	InjectUsage bool `yaml:"inject_usage"`
	// EventLoop relays streamed answers on the event loop rather than
	// net/http (proxy.Options.EventLoop): less CPU per token event. On
	// by default (Defaults); false keeps every stream on net/http's path.
	EventLoop bool `yaml:"event_loop"`
	// MaxModels bounds the model label; later names become "_other".
	MaxModels int `yaml:"max_models"`
	// Models always get their own label value; at most MaxDeclaredModels.
	Models []string `yaml:"models"`
	// PeekBytes bounds the request body read before forwarding.
	PeekBytes int `yaml:"peek_bytes"`
	// PeekBudget bounds the bytes all request-body peeks hold at once;
	// past it a body is forwarded unread (request_read: budget).
	PeekBudget int64 `yaml:"peek_budget"`
	// Timeout bounds a whole proxied request; 0 means none.
	Timeout time.Duration `yaml:"timeout"`
	// UpstreamHealthPath is what /readyz asks the upstream (GET, 2xx = up);
	// "auto" (the default) finds the engine's: /health, then /v1/models,
	// /api/version, / (the first route the engine has).
	UpstreamHealthPath string `yaml:"upstream_health_path"`
	// ShutdownGrace is how long in-flight streams may run on after SIGTERM.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// IdleTimeout closes a client's keep-alive connection that has been
	// idle between requests that long; 0 means never.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// BodyReadTimeout cuts a client whose request body sends nothing for
	// that long (408); 0 means never. It never applies to responses.
	BodyReadTimeout time.Duration `yaml:"body_read_timeout"`
	// BodyMinRate, bytes per second, cuts a request body that falls
	// behind it after its first BodyReadTimeout (408); 0 means no
	// minimum. It applies only with a BodyReadTimeout.
	BodyMinRate int64 `yaml:"body_min_rate"`
	// MaxConnections bounds the proxy's open client connections; past it
	// a new connection gets a 503 and is closed. 0 means sized to the
	// descriptor limit: (RLIMIT_NOFILE − 64 − AdminMaxConnections) / 2,
	// since each stream also holds a connection to the engine.
	MaxConnections int `yaml:"max_connections"`
	// AdminMaxConnections bounds the admin listener's open connections;
	// past it a new connection gets a 503 and is closed. They are
	// reserved out of the descriptor limit before MaxConnections' default.
	AdminMaxConnections int `yaml:"admin_max_connections"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// Simulator configures the built-in engine used when Upstream is empty.
	Simulator Simulator `yaml:"simulator"`
	// SLO declares the service level objectives, request classes and the
	// stall threshold (docs/slo.md).
	SLO SLO `yaml:"slo"`
	// Probes declares the canary probes (docs/probe.md). With the built-in
	// simulator and no probes declared, one default probe runs.
	Probes Probes `yaml:"probes"`
	// Energy configures GPU energy measurement (docs/energy.md).
	Energy Energy `yaml:"energy"`
	// Tracing configures OTel spans beyond the OTEL_* environment
	// (docs/tracing.md).
	Tracing Tracing `yaml:"tracing"`
	// Engine configures the scraper of the engine's own metrics
	// (docs/engine-signals.md).
	Engine Engine `yaml:"engine"`
	// Cost declares the replica's price, and optionally the energy
	// price (docs/cost.md).
	Cost Cost `yaml:"cost"`
	// Capacity sets the load buckets of the knee estimate (docs/cost.md).
	Capacity Capacity `yaml:"capacity"`
	// Egress is the forward HTTPS proxy that measures hosted APIs
	// (docs/egress.md); off unless egress.listen is set.
	Egress Egress `yaml:"egress"`
	// Live configures the admin port's live page (docs/live.md).
	Live Live `yaml:"live"`
	// Demo configures the first run's demonstration (docs/live.md).
	Demo Demo `yaml:"demo"`
	// Capture writes the workload trace (docs/capture.md); off unless
	// capture.file (--capture) is set.
	Capture Capture `yaml:"capture"`
	// Reuse counts the live prefix reuse from the capture's block ids
	// (docs/capture.md, "Live reuse"); on with the capture, or alone
	// with reuse.enabled: on.
	Reuse Reuse `yaml:"reuse"`
	// Tenant resolves who each request is for (docs/config.md, tenant);
	// off unless tenant.from is set.
	Tenant Tenant `yaml:"tenant"`
	// Structure bounds the structure checks' schemas and names the draft
	// of a schema that names none (docs/slo.md, "Structure"); read only
	// when an SLO requires structure.
	Structure Structure `yaml:"structure"`

	// Check, when set by --config.check, validates and exits.
	Check bool `yaml:"-"`
	// File is the config file that was read, if any.
	File string `yaml:"-"`
}

// MaxDeclaredModels bounds the models list: each name is a label value
// that max_models does not bound.
const MaxDeclaredModels = 100

// Defaults returns the configuration before any file, env or flag.
func Defaults() Config {
	return Config{
		Listen:             "127.0.0.1:8080",
		AdminListen:        "127.0.0.1:9464",
		InjectUsage:        true,
		EventLoop:          true,
		MaxModels:          20,
		PeekBytes:          1 << 20,
		PeekBudget:         64 << 20,
		Timeout:            10 * time.Minute,
		UpstreamHealthPath: "auto",
		ShutdownGrace:      30 * time.Second,
		IdleTimeout:        120 * time.Second,
		BodyReadTimeout:    30 * time.Second,
		BodyMinRate:        1024,
		LogLevel:           "info",
		Simulator:          SimulatorDefaults(),
		Engine:             EngineDefaults(),
		Egress:             EgressDefaults(),
		Live:               LiveDefaults(),
		Demo:               DemoDefaults(),

		AdminMaxConnections: 64, // reserved out of RLIMIT_NOFILE before MaxConnections' default
	}
}

// EnvName is the environment twin of a flag: --admin-listen is
// TOKENTAP_ADMIN_LISTEN, --sim.max-batch is TOKENTAP_SIM_MAX_BATCH.
func EnvName(flagName string) string {
	r := strings.NewReplacer("-", "_", ".", "_")
	return "TOKENTAP_" + strings.ToUpper(r.Replace(flagName))
}

// Load builds the configuration from args (without the program name) and
// the environment (getenv). It returns flag.ErrHelp for -h, and otherwise
// an error that names every problem found.
func Load(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	cfg := Defaults()
	file := configFile(args, getenv)
	var problems []error
	if file != "" {
		if err := cfg.readFile(file); err != nil {
			problems = append(problems, err)
		}
		cfg.File = file
	}
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.SetOutput(usage)
	cfg.bind(fs)
	fs.Usage = func() {
		fmt.Fprintf(usage, "Usage: sidecar [flags]\n\ntokentap sits in front of an OpenAI-compatible inference engine and measures every streamed token.\nEvery flag has an environment twin TOKENTAP_<FLAG> (dashes and dots as underscores).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		problems = append(problems, err)
	} else if fs.NArg() > 0 {
		problems = append(problems, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, n := range names {
		if set[n] || n == "config" {
			continue
		}
		if v := getenv(EnvName(n)); v != "" {
			if err := fs.Set(n, v); err != nil {
				problems = append(problems, fmt.Errorf("%s: %v", EnvName(n), err))
			}
		}
	}
	// Flags given on the command line were not touched above: they win.
	problems = append(problems, cfg.Validate()...)
	return cfg, errors.Join(problems...)
}

// configFile finds --config in args (before flags are parsed, since the
// file's values become the flags' defaults), or TOKENTAP_CONFIG.
func configFile(args []string, getenv func(string) string) string {
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, p := range []string{"--config", "-config"} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
	}
	return getenv("TOKENTAP_CONFIG")
}

// MaxFileBytes bounds the configuration file: a larger one is refused
// before it is parsed. A real configuration is a few kilobytes; 1 MiB
// leaves room for hundreds of SLOs and probes with comments, and keeps
// parsing it under about 50 MB and a fraction of a second.
const MaxFileBytes = 1 << 20

// MaxExpandedBytes bounds the configuration with every YAML alias
// expanded, counted as checkExpansion does: each node's scalar bytes plus
// one. Without aliases a document never exceeds its file's size by this
// count, so only aliases can reach it; a few kilobytes of anchors can
// otherwise stand for gigabytes ("billion laughs"), which decoding and
// --config.check's printing would then build.
const MaxExpandedBytes = 4 << 20

// readFile reads the configuration file at path, which must be a
// regular file (a symbolic link to one, as a Kubernetes ConfigMap
// mounts it, is one): a FIFO, a device or a directory is refused before
// it is read. Design note: opening a FIFO with no writer blocks in
// open(2), before any output and past SIGTERM; so the path is stat'ed
// first, opened without blocking (openConfig), and fstat'ed again once
// open, in case it was swapped in between.
func (c *Config) readFile(path string) error {
	if st, err := os.Stat(path); err != nil {
		return fmt.Errorf("config file: %w", err)
	} else if !st.Mode().IsRegular() {
		return notRegular(path, st.Mode())
	}
	f, err := openConfig(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return fmt.Errorf("config file: %w", err)
	} else if !st.Mode().IsRegular() {
		return notRegular(path, st.Mode())
	}
	// Read one byte past the limit, so that a larger file is refused
	// without reading it whole (one that grows after the stat).
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if len(b) > MaxFileBytes {
		return fmt.Errorf("config file %s: larger than the limit of %d bytes (1 MiB)", path, MaxFileBytes)
	}
	// First parse without decoding (aliases stay references) and measure
	// the document as decoding would expand it.
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if err := checkExpansion(&doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// notRegular is readFile's error for a path that is not a regular file.
func notRegular(path string, m os.FileMode) error {
	what := "not a regular file"
	switch {
	case m&os.ModeNamedPipe != 0:
		what = "a FIFO (named pipe)"
	case m&os.ModeCharDevice != 0:
		what = "a character device"
	case m&os.ModeDevice != 0:
		what = "a device"
	case m.IsDir():
		what = "a directory"
	case m&os.ModeSocket != 0:
		what = "a socket"
	}
	return fmt.Errorf("config file %s: is %s, not a regular file", path, what)
}

// checkExpansion refuses a document whose expanded size (aliases
// replaced by what they name) is over MaxExpandedBytes, or whose alias
// names a node that contains it. It visits each node once: the size of
// an anchored node is kept for the aliases that name it.
func checkExpansion(doc *yaml.Node) error {
	e := expansion{sizes: map[*yaml.Node]int64{}, open: map[*yaml.Node]bool{}}
	e.size(doc)
	return e.err
}

type expansion struct {
	sizes map[*yaml.Node]int64 // anchored nodes measured so far
	open  map[*yaml.Node]bool  // anchored nodes being measured
	err   error
}

// size returns n's expanded size (scalar bytes plus one per node), at
// most MaxExpandedBytes+1. The innermost node past the limit, or an
// alias inside the node it names, sets e.err.
func (e *expansion) size(n *yaml.Node) int64 {
	if e.err != nil || n == nil {
		return 0
	}
	if n.Kind == yaml.AliasNode {
		if e.open[n.Alias] {
			e.err = fmt.Errorf("line %d: alias *%s is inside the node it names", n.Line, n.Value)
			return 0
		}
		return e.size(n.Alias)
	}
	if n.Anchor != "" {
		if s, ok := e.sizes[n]; ok {
			return s
		}
		e.open[n] = true
		defer delete(e.open, n)
	}
	s := int64(1 + len(n.Value))
	for _, k := range n.Content {
		s = min(s+e.size(k), MaxExpandedBytes+1)
	}
	if n.Anchor != "" {
		e.sizes[n] = s
	}
	if s > MaxExpandedBytes && e.err == nil {
		e.err = fmt.Errorf("line %d: with its aliases expanded, this node is larger than the limit of %d bytes (4 MiB)", n.Line, MaxExpandedBytes)
	}
	return s
}

func (c *Config) bind(fs *flag.FlagSet) {
	fs.String("config", c.File, "YAML configuration file (TOKENTAP_CONFIG)")
	fs.BoolVar(&c.Check, "config.check", false, "validate the configuration, print it, and exit")
	fs.StringVar(&c.Upstream, "upstream", c.Upstream, "engine base URL, e.g. http://127.0.0.1:8000 (empty: run the built-in simulated engine)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "proxy listen address")
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "admin listen address: /metrics, /healthz, /readyz")
	fs.StringVar(&c.Records, "records", c.Records, "JSONL file of finished-request records (\"-\" = stdout, empty = none)")
	fs.BoolVar(&c.InjectUsage, "inject-usage", c.InjectUsage, "ask the engine for usage on streams whose client did not, and strip it from the client's stream")
	fs.BoolVar(&c.EventLoop, "event-loop", c.EventLoop, "relay streamed answers (HTTP/1.1, http:// upstream) with read(2) and write(2) on Go's poller rather than net/http: less CPU per token event")
	fs.IntVar(&c.MaxModels, "max-models", c.MaxModels, "distinct model label values before the rest become _other")
	fs.IntVar(&c.PeekBytes, "peek-bytes", c.PeekBytes, "request body bytes read before forwarding (model, stream, max_tokens)")
	fs.Int64Var(&c.PeekBudget, "peek-budget", c.PeekBudget, "request body bytes all peeks may hold at once; past it a body is forwarded unread")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on a whole proxied request, stream included (0 = none)")
	fs.StringVar(&c.UpstreamHealthPath, "upstream-health-path", c.UpstreamHealthPath, "path /readyz asks the upstream; auto finds it: /health, /v1/models, /api/version, /")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "how long in-flight streams may finish after SIGTERM; later ones are cut and recorded as error/shutdown")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "close client keep-alive connections idle this long between requests (0 = never)")
	fs.DurationVar(&c.BodyReadTimeout, "body-read-timeout", c.BodyReadTimeout, "cut a client whose request body sends nothing for this long, with a 408 (0 = never); never applies to responses")
	fs.Int64Var(&c.BodyMinRate, "body-min-rate", c.BodyMinRate, "cut a request body slower than this many bytes per second after its first --body-read-timeout, with a 408 (0 = no minimum)")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "open client connections before new ones get a 503 (0 = from the descriptor limit)")
	fs.IntVar(&c.AdminMaxConnections, "admin-max-connections", c.AdminMaxConnections, "open admin connections before new ones get a 503")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	if c.Energy.Enabled == "" {
		c.Energy.Enabled = "auto"
	}
	fs.StringVar(&c.Energy.Enabled, "energy", c.Energy.Enabled, "GPU energy through NVML: auto, on or off")
	fs.DurationVar(&c.Energy.Interval, "energy.interval", c.Energy.Interval, "NVML sampling interval (0 = 1s)")
	s := &c.Simulator
	fs.StringVar(&s.Model, "sim.model", s.Model, "simulator: model name it reports")
	fs.IntVar(&s.MaxBatch, "sim.max-batch", s.MaxBatch, "simulator: sequences decoded together")
	fs.IntVar(&s.MaxQueue, "sim.max-queue", s.MaxQueue, "simulator: waiting queue length before rejection")
	fs.IntVar(&s.RejectStatus, "sim.reject-status", s.RejectStatus, "simulator: HTTP status of a rejection (429 or 503)")
	fs.DurationVar(&s.PrefillBase, "sim.prefill-base", s.PrefillBase, "simulator: fixed prefill cost per admitted request")
	fs.DurationVar(&s.PrefillPerToken, "sim.prefill-per-token", s.PrefillPerToken, "simulator: prefill cost per prompt token")
	fs.DurationVar(&s.DecodeBase, "sim.decode-base", s.DecodeBase, "simulator: decode step time at batch size 0")
	fs.DurationVar(&s.DecodePerSeq, "sim.decode-per-seq", s.DecodePerSeq, "simulator: extra decode step time per running sequence")
	fs.Float64Var(&s.Jitter, "sim.jitter", s.Jitter, "simulator: relative step-time jitter")
	fs.Float64Var(&s.MultiTokenProb, "sim.multi-token-prob", s.MultiTokenProb, "simulator: probability an event is coalesced with the next token")
	fs.Float64Var(&s.StallProb, "sim.stall-prob", s.StallProb, "simulator: probability a step stalls")
	fs.DurationVar(&s.StallDuration, "sim.stall-duration", s.StallDuration, "simulator: length of a stall")
	fs.Float64Var(&s.ErrorProb, "sim.error-prob", s.ErrorProb, "simulator: probability a request fails mid-stream")
	fs.Float64Var(&s.EOSProb, "sim.eos-prob", s.EOSProb, "simulator: probability per token of a natural end")
	fs.IntVar(&s.MaxTokens, "sim.max-tokens", s.MaxTokens, "simulator: output length when the request sets no max_tokens")
	fs.Uint64Var(&s.Seed, "sim.seed", s.Seed, "simulator: random seed")
	fs.IntVar(&s.KVCapacityTokens, "sim.kv-capacity-tokens", s.KVCapacityTokens, "simulator: KV cache capacity in tokens; running sequences past it are preempted and recomputed")
	fs.IntVar(&s.PrefixCacheBlocks, "sim.prefix-cache-blocks", s.PrefixCacheBlocks, "simulator: prefix cache size in blocks, vLLM's automatic prefix caching with LRU eviction (0: off)")
	fs.IntVar(&s.PrefixCacheBlockTokens, "sim.prefix-cache-block-tokens", s.PrefixCacheBlockTokens, "simulator: tokens per prefix cache block (as the capture's block_size)")
	fs.IntVar(&s.PrefillChunkTokens, "sim.prefill-chunk-tokens", s.PrefillChunkTokens, "simulator: chunked prefill, prompt tokens prefilled per step (0: unchunked, a prompt's whole prefill in the step that admits it)")
	c.Engine.bind(fs)
	c.Cost.bind(fs)
	c.Egress.bind(fs)
	c.Live.bind(fs)
	c.Demo.bind(fs)
	c.Capture.bind(fs)
	c.Tenant.bind(fs)
}

// Validate returns one error per problem, each naming its setting.
func (c *Config) Validate() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		switch {
		case err != nil:
			bad("upstream: %v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("upstream: scheme must be http or https, got %q", u.Scheme)
		case u.Host == "":
			bad("upstream: %q has no host", c.Upstream)
		}
	}
	addr := func(name, v string) {
		if _, _, err := net.SplitHostPort(v); err != nil {
			bad("%s: %q is not host:port: %v", name, v, err)
		}
	}
	addr("listen", c.Listen)
	addr("admin_listen", c.AdminListen)
	if c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		bad("listen and admin_listen are both %q", c.Listen)
	}
	errs = append(errs, c.loops()...)
	if c.Records != "" && c.Records != "-" {
		if st, err := os.Stat(filepath.Dir(c.Records)); err != nil || !st.IsDir() {
			bad("records: directory of %q does not exist", c.Records)
		}
	}
	if c.MaxModels < 1 {
		bad("max_models: must be at least 1, got %d", c.MaxModels)
	}
	if len(c.Models) > MaxDeclaredModels {
		bad("models: at most %d, got %d (each is a label value of every model-labelled series)", MaxDeclaredModels, len(c.Models))
	}
	if c.PeekBytes < 1024 {
		bad("peek_bytes: must be at least 1024, got %d", c.PeekBytes)
	}
	if c.PeekBudget < int64(c.PeekBytes) {
		bad("peek_budget: must be at least peek_bytes (%d), got %d", c.PeekBytes, c.PeekBudget)
	}
	if c.Timeout < 0 {
		bad("timeout: must not be negative")
	}
	if c.ShutdownGrace < 0 {
		bad("shutdown_grace: must not be negative")
	}
	if c.IdleTimeout < 0 {
		bad("idle_timeout: must not be negative")
	}
	if c.BodyReadTimeout < 0 {
		bad("body_read_timeout: must not be negative")
	}
	if c.BodyMinRate < 0 {
		bad("body_min_rate: must not be negative")
	}
	if c.MaxConnections < 0 {
		bad("max_connections: must not be negative")
	}
	if c.AdminMaxConnections < 1 {
		bad("admin_max_connections: must be at least 1, got %d", c.AdminMaxConnections)
	}
	if c.UpstreamHealthPath != "auto" && !strings.HasPrefix(c.UpstreamHealthPath, "/") {
		bad("upstream_health_path: must be auto or start with /, got %q", c.UpstreamHealthPath)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level: must be debug, info, warn or error, got %q", c.LogLevel)
	}
	errs = append(errs, c.Simulator.Validate()...)
	errs = append(errs, c.SLO.WithDefaults().Validate()...)
	errs = append(errs, c.Probes.Validate()...)
	errs = append(errs, c.Structure.Validate()...)
	errs = append(errs, c.Energy.Validate()...)
	errs = append(errs, c.Tracing.Validate()...)
	errs = append(errs, c.Engine.Validate()...)
	errs = append(errs, c.Cost.Validate()...)
	errs = append(errs, c.Capacity.Validate()...)
	errs = append(errs, c.Live.Validate()...)
	errs = append(errs, c.Demo.Validate()...)
	errs = append(errs, c.Egress.Validate()...)
	errs = append(errs, c.Capture.validate(c.Reuse.On(c.Capture.File != ""))...)
	errs = append(errs, c.Reuse.Validate(c.Capture.File != "")...)
	errs = append(errs, c.Tenant.Validate()...)
	return errs
}

// Redacted returns a URL with its password replaced by "xxxxx", for logs
// and printed configuration; a string that is not a URL comes back as it
// was.
func Redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}
