package replay

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokentap/tokentap/app"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/internal/safe"
	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// Env is what the replay needs from the process.
type Env struct {
	Getenv         func(string) string
	Stdout, Stderr io.Writer
	// Transport, if set, carries the requests (tests).
	Transport http.RoundTripper
	// Open, if set, opens the trace in place of the --trace file (tests:
	// a trace generated as it is read).
	Open func() (*workload.Reader, io.Closer, error)
	// Report, if set, receives the report before it is printed.
	Report func(*Report)
}

// MaxRates bounds --rates (each step is a load bucket of the rate knee).
const MaxRates = config.MaxLoadBuckets

// flags are the replay's command line (docs/capture.md, "Replay").
type flags struct {
	trace, target, configFile, api, model string
	timeScale, rate                       float64
	rates                                 string
	duration, timeout                     time.Duration
	maxInFlight, blockSize                int
	seed                                  uint64
	ignoreEOS, stream                     bool
	records, adminListen, apiKeyEnv       string
}

// ParseRates reads --rates: comma-separated multipliers, each above 0,
// increasing, at most MaxRates.
func ParseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || v > 1e6 {
			return nil, fmt.Errorf("--rates: %q is not a multiplier above 0", f)
		}
		if len(out) > 0 && v <= out[len(out)-1] {
			return nil, fmt.Errorf("--rates: %g after %g: the rates must increase", v, out[len(out)-1])
		}
		out = append(out, v)
	}
	if len(out) > MaxRates {
		return nil, fmt.Errorf("--rates: at most %d steps, got %d", MaxRates, len(out))
	}
	return out, nil
}

// parse reads the flags and checks them, naming every problem.
func parse(args []string, stderr io.Writer) (flags, Options, error) {
	f := flags{}
	fs := flag.NewFlagSet("tokentap replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.trace, "trace", "", "the trace to replay: a tokentap capture or a Mooncake trace, JSON lines (required)")
	fs.StringVar(&f.target, "target", "", "the engine's base URL, e.g. http://127.0.0.1:8000 (required)")
	fs.StringVar(&f.configFile, "config", "", "the sidecar's YAML configuration: its slo and capacity sections judge the replay (TOKENTAP_CONFIG)")
	fs.StringVar(&f.api, "api", stream.NameChat, "the API of lines that name none: "+strings.Join(config.ProbeAPIs(), ", "))
	fs.StringVar(&f.model, "model", "", "the model every request asks for; empty: each line's own (tokentap captures)")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "multiplies the trace's gaps (0.5: twice as fast)")
	fs.Float64Var(&f.rate, "rate", 1, "multiplies the arrival rate (2: twice the trace's rate)")
	fs.StringVar(&f.rates, "rates", "", "a stepped series of rate multipliers, e.g. 1,1.5,2,3: the trace is replayed once per rate and the knee reported in arrival rate")
	fs.DurationVar(&f.duration, "duration", 0, "bounds each step's schedule (0: the whole trace)")
	fs.IntVar(&f.maxInFlight, "max-in-flight", 256, "requests in flight at most; a request due beyond it is not sent (recorded, counted)")
	fs.IntVar(&f.blockSize, "block-size", DefaultBlockSize, "tokens per hash id")
	fs.Uint64Var(&f.seed, "seed", 0, "keys the prompt text: replays given the same seed send the same text for the same hash id (a trace split over several load generators); 0: drawn at random")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", true, "ask engines that can (vLLM, SGLang, llama.cpp) for exactly output_length tokens")
	fs.BoolVar(&f.stream, "stream", true, "stream the requests of lines that do not say (public traces)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "bounds one request (0: none)")
	fs.StringVar(&f.records, "records", "", "write every replayed request's record to this JSONL file (docs/records.md)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "serve /metrics here while the replay runs (off when empty)")
	fs.StringVar(&f.apiKeyEnv, "api-key-env", "", "the environment variable holding the target's API key (sent in each API's own key header: a bearer token, x-api-key, x-goog-api-key)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: tokentap replay --trace FILE --target URL [flags]\n\nReplays a workload trace open-loop on its timestamps, measured as live traffic is (docs/capture.md#replay).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return f, Options{}, err
	}
	var problems []error
	bad := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }
	if fs.NArg() > 0 {
		bad("unexpected arguments: %q", fs.Args())
	}
	o := Options{Trace: f.trace, API: f.api, Model: f.model, Stream: f.stream, IgnoreEOS: f.ignoreEOS, TimeScale: f.timeScale,
		Duration: f.duration, MaxInFlight: f.maxInFlight, BlockSize: f.blockSize, Seed: f.seed, Timeout: f.timeout, Rates: []float64{f.rate}}
	if f.trace == "" {
		bad("--trace is required")
	}
	if u, err := url.Parse(f.target); f.target == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("--target: want the engine's http(s) base URL, got %q", f.target)
	} else {
		o.Target = u
	}
	if !slices.Contains(config.ProbeAPIs(), f.api) {
		bad("--api must be one of %s, got %q", strings.Join(config.ProbeAPIs(), ", "), f.api)
	}
	if !(f.timeScale > 0) {
		bad("--time-scale must be above 0, got %g", f.timeScale)
	}
	if !(f.rate > 0) {
		bad("--rate must be above 0, got %g", f.rate)
	}
	if f.rates != "" {
		set := false
		fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == "rate" })
		if set {
			bad("--rate and --rates: give one")
		}
		rs, err := ParseRates(f.rates)
		if err != nil {
			problems = append(problems, err)
		}
		o.Rates = rs
	}
	if f.duration < 0 {
		bad("--duration must not be negative")
	}
	if f.maxInFlight < 1 {
		bad("--max-in-flight must be at least 1, got %d", f.maxInFlight)
	}
	if f.blockSize < 1 {
		bad("--block-size must be at least 1, got %d", f.blockSize)
	}
	if f.timeout < 0 {
		bad("--timeout must not be negative")
	}
	return f, o, errors.Join(problems...)
}

// Main runs tokentap replay with args (after "replay"): it checks the
// flags and the configuration, checks that the target answers, replays
// and prints the report on env.Stdout. Bad input (a *usage.Error) is
// explained on env.Stderr; the caller prints any other error.
func Main(ctx context.Context, args []string, env Env) error {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	f, opts, err := parse(args, env.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	var cfgArgs []string
	if f.configFile != "" {
		cfgArgs = []string{"--config", f.configFile}
	}
	cfg, cerr := config.Load(cfgArgs, env.Getenv, io.Discard)
	if cerr != nil {
		err = errors.Join(err, fmt.Errorf("--config: %w", cerr))
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "tokentap replay: invalid flags or configuration:\n")
		for _, e := range flatten(err) {
			fmt.Fprintf(env.Stderr, "  - %v\n", e)
		}
		return &usage.Error{Err: err}
	}
	log := slog.New(safe.Handler(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	opts.SLO, opts.Capacity, opts.Transport, opts.Open = cfg.SLO, cfg.Capacity, env.Transport, env.Open
	if f.apiKeyEnv != "" {
		key := env.Getenv(f.apiKeyEnv)
		if key == "" {
			return &usage.Error{Err: fmt.Errorf("--api-key-env: %s is empty", f.apiKeyEnv)}
		}
		opts.APIKey = key
	}
	if env.Open == nil {
		if _, err := os.Stat(f.trace); err != nil {
			return &usage.Error{Err: fmt.Errorf("--trace: %w", err)}
		}
	}
	if err := reachable(ctx, opts.Target, env.Transport); err != nil {
		return err
	}

	// The pipeline's stages, built as the sidecar builds them
	// (app.NewStages): metrics, OTLP and spans when OTEL_* asks, the
	// tenants, the structure checker, the records file.
	if f.records == "-" {
		return &usage.Error{Err: errors.New("--records: not stdout, which carries the report; name a file")}
	}
	stages, err := app.NewStages(ctx, cfg, f.records, app.StageEnv{Getenv: env.Getenv, Logger: log})
	if err != nil {
		var ue *usage.Error
		if errors.As(err, &ue) {
			fmt.Fprintf(env.Stderr, "tokentap replay: %v\n", err)
		}
		return err
	}
	defer stages.Close()
	metrics := stages.Metrics
	opts.Stages = stages.Pipeline(pipeline.Options{})
	opts.Tenants, opts.Structure = stages.ProxyTenants(), stages.ProxyStructure()
	opts.Registry = metrics.Registry
	if f.adminListen != "" {
		ln, err := net.Listen("tcp", f.adminListen)
		if err != nil {
			return &usage.Error{Err: fmt.Errorf("--admin-listen: %w", err)}
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
	}

	rep, runErr := New(opts).Run(ctx)
	if env.Report != nil {
		env.Report(rep)
	}
	rep.Print(env.Stdout)
	var le *workload.LineError
	switch {
	case errors.As(runErr, &le), errors.Is(runErr, ErrEmptyTrace):
		fmt.Fprintf(env.Stderr, "tokentap replay: bad trace: %v\n", runErr)
		return &usage.Error{Err: runErr}
	case runErr != nil:
		return runErr
	}
	var sent, answered int64
	for _, s := range rep.Steps {
		sent, answered = sent+s.Sent, answered+s.Answered
	}
	if sent > 0 && answered == 0 {
		return fmt.Errorf("no request of %d was answered by %s (the report says how they failed)", sent, config.Redacted(opts.Target.String()))
	}
	return nil
}

// reachable checks that the target accepts a connection (a GET of its
// base URL, any answer will do, a redirect too, which is not followed:
// its target is not the one named), so that an unreachable target is
// said at once, not as every request's failure.
func reachable(ctx context.Context, target *url.URL, rt http.RoundTripper) error {
	c := &http.Client{Transport: rt, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("target %s unreachable: %w", config.Redacted(target.String()), errors.Unwrap(err))
	}
	resp.Body.Close()
	return nil
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}
