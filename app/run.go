// Package app wires the sidecar together: configuration, the proxy, the
// exporter, the records, the admin endpoints and, when no upstream is
// given, the built-in simulated engine. cmd/sidecar's main only calls Run.
package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/gpu"
	"github.com/tokentap/tokentap/probe"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/slo"
)

// UsageError is a bad flag, environment variable or config file: the
// process exits 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// ExitCode maps Run's error to the process exit code: 0, 2 for a usage
// error, 1 otherwise.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// Env is what Run needs from the process.
type Env struct {
	Getenv func(string) string
	Stdout io.Writer
	Stderr io.Writer
	// Ready, if set, is called once every listener is bound, with the
	// resolved addresses (tests use it with ":0" ports).
	Ready func(Addrs)
	// OpenGPU opens the GPU source; nil means gpu.Open (NVML). Tests
	// give go-nvml's mock servers here.
	OpenGPU func(selection []string, none bool) (gpu.Source, error)
}

// Addrs are the bound addresses.
type Addrs struct {
	Proxy, Admin string
	Upstream     string
	Simulated    bool
}

// Run runs the sidecar until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, args []string, env Env) error {
	cfg, err := config.Load(args, env.Getenv, env.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "sidecar: invalid configuration:\n")
		for _, e := range flattenJoin(err) {
			fmt.Fprintf(env.Stderr, "  - %v\n", e)
		}
		return &UsageError{err}
	}
	if cfg.Check {
		fmt.Fprintf(env.Stdout, "configuration OK\n")
		return nil
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: level}))

	metrics := exporter.New(exporter.Config{MaxModels: cfg.MaxModels, Models: cfg.Models})
	otel, err := exporter.SetupOTel(ctx, cfg.Tracing, env.Getenv, metrics.Registry)
	if err != nil {
		fmt.Fprintf(env.Stderr, "sidecar: OpenTelemetry setup (OTEL_* environment): %v\n", err)
		return &UsageError{err}
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := otel.Shutdown(sctx); err != nil { // flushes spans and metrics
			log.Warn("flushing OpenTelemetry data", "err", err)
		}
	}()
	var observers record.Fanout = record.Fanout{metrics}
	if otel.Metrics != nil {
		om, err := exporter.NewOTelMetrics(otel.Metrics)
		if err != nil {
			return err
		}
		observers = append(observers, om)
	}
	judge := slo.NewJudge(cfg.SLO, metrics.Registry, observers)
	var traceOpts proxy.TraceOptions
	if otel.Traces != nil {
		traceOpts = proxy.TraceOptions{Provider: otel.Traces, ProviderName: cfg.Tracing.ProviderName}
		if cfg.Tracing.CaptureContent {
			c := &proxy.ContentCapture{MaxBytes: cfg.Tracing.MaxContentBytes, Redact: proxy.DefaultRedactions}
			for _, r := range cfg.Tracing.Redact {
				c.Redact = append(c.Redact, regexp.MustCompile(r)) // validated by config
			}
			traceOpts.Capture = c
			log.Warn("content capture is ON: prompts and completions go into spans (redacted, truncated); pre-production use")
		}
		log.Info("tracing on", "keep", cfg.Tracing.Keep)
	}
	var sinks record.Sinks
	switch cfg.Records {
	case "":
	case "-":
		sinks = append(sinks, record.NewJSONL(env.Stdout))
	default:
		f, err := os.OpenFile(cfg.Records, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("records: %w", err)
		}
		defer f.Close()
		sinks = append(sinks, record.NewJSONL(f))
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addrs := Addrs{Upstream: cfg.Upstream}
	var background []func() // stopped after the proxy drains
	if cfg.Upstream == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("simulator: %w", err)
		}
		eng := simengine.NewEngine(cfg.Simulator)
		simCtx, simStop := context.WithCancel(context.Background())
		go eng.Run(simCtx)
		simSrv := &http.Server{Handler: simengine.NewServer(eng), ReadHeaderTimeout: 10 * time.Second}
		go simSrv.Serve(ln)
		background = append(background, func() { simSrv.Close(); simStop() })
		addrs.Upstream, addrs.Simulated = "http://"+ln.Addr().String(), true
		log.Warn("NO --upstream GIVEN: running in front of the BUILT-IN SIMULATED ENGINE; every number is synthetic",
			"simulator", addrs.Upstream, "model", eng.Config().Model)
	}
	// GPU energy: on when NVML works (or when asked), else off, said once.
	var sampler *gpu.Sampler
	var records record.Sink = sinks
	energyState, energyReason := gpu.StateOff, "disabled"
	if cfg.Energy.Enabled != "off" {
		sel, none := gpu.Selection(cfg.Energy.Devices, env.Getenv)
		open := env.OpenGPU
		if open == nil {
			open = gpu.Open
		}
		src, err := open(sel, none)
		switch {
		case err != nil:
			energyReason = gpu.Reason(err)
			lvl := slog.LevelInfo
			if cfg.Energy.Enabled == "on" {
				lvl = slog.LevelError
			}
			log.Log(ctx, lvl, "energy off: GPU energy needs NVML; everything else runs", "reason", err)
		case len(src.Devices()) == 0:
			src.Close()
			energyReason = "no_devices"
			log.Warn("energy off: NVML found no selected GPU", "selection", sel)
		default:
			energyState, energyReason = gpu.StateOn, "nvml"
			sampler = gpu.NewSampler(src, cfg.Energy, metrics.Registry, sinks, metrics.ModelLabel)
			records = sampler
			defer src.Close()
			log.Info("energy on", "gpus", len(src.Devices()), "interval", cfg.Energy.Interval)
		}
	}
	gpu.ExportState(metrics.Registry, energyState, energyReason)

	up, _ := url.Parse(addrs.Upstream)
	probeSecret := randomHex(16)
	px, err := proxy.New(proxy.Options{
		ProbeHeader:    probeSecret,
		Upstream:       up,
		Observer:       judge,
		Records:        records,
		Logger:         log,
		InjectUsage:    cfg.InjectUsage,
		PeekBytes:      cfg.PeekBytes,
		Timeout:        cfg.Timeout,
		Trace:          traceOpts,
		StallThreshold: judge.Config().StallThreshold,
	})
	if err != nil {
		return err
	}

	pln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	aln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		pln.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	addrs.Proxy, addrs.Admin = pln.Addr().String(), aln.Addr().String()

	probes := cfg.Probes
	if addrs.Simulated && len(probes.Probes) == 0 {
		probes.Probes = []probe.Def{DefaultSimProbe()}
	}
	probes = probes.WithDefaults(cfg.Simulator.Model)
	sidecarURL, _ := url.Parse("http://" + addrs.Proxy)
	prober := probe.New(probe.Options{Config: probes, Upstream: up, Sidecar: sidecarURL, ProbeHeader: probeSecret,
		Observer: judge, Records: records, Registry: metrics.Registry, Logger: log, Getenv: env.Getenv})

	ready := newReadiness(up, cfg.UpstreamHealthPath, metrics)
	ready.probes = prober
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	admin.Handle("GET /readyz", ready)
	admin.Handle("GET /slo", judge)
	admin.Handle("GET /probes", prober)

	proxySrv := &http.Server{Handler: px, ReadHeaderTimeout: 30 * time.Second}
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- proxySrv.Serve(pln) }()
	go func() { errc <- adminSrv.Serve(aln) }()
	log.Info("tokentap is up", "proxy", "http://"+addrs.Proxy, "upstream", addrs.Upstream,
		"metrics", "http://"+addrs.Admin+"/metrics", "inject_usage", cfg.InjectUsage)
	samplerCtx, stopSampler := context.WithCancel(context.Background())
	samplerDone := make(chan struct{})
	if sampler != nil {
		px.SetEnergy(sampler)
		go func() { sampler.Run(samplerCtx); close(samplerDone) }()
	} else {
		close(samplerDone)
	}
	probeCtx, stopProbes := context.WithCancel(context.Background())
	probesDone := make(chan struct{})
	go func() { prober.Run(probeCtx); close(probesDone) }()
	if len(probes.Probes) > 0 {
		log.Info("canary probes running", "probes", len(probes.Probes))
	}
	if env.Ready != nil {
		env.Ready(addrs)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		runErr = err
	}
	stopProbes() // probes stop first: a probe due now is recorded as not_sent
	<-probesDone
	log.Info("shutting down: no new requests; in-flight streams may finish", "grace", cfg.ShutdownGrace)
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer scancel()
	if err := proxySrv.Shutdown(sctx); err != nil {
		log.Warn("grace period over; closing the remaining streams", "err", err)
		proxySrv.Close()
	}
	stopSampler() // the last interval is attributed and held records written
	<-samplerDone
	adminSrv.Close()
	for _, stop := range background {
		stop()
	}
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

func flattenJoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenJoin(e)...)
		}
		return out
	}
	return []error{err}
}

// DefaultSimProbe is the probe that runs with the built-in simulator when
// no probe is declared: a shape-controlled request (ignore_eos) whose
// answer must have exactly max_tokens tokens and finish by length.
func DefaultSimProbe() probe.Def {
	return probe.Def{Name: "sim-canary", Interval: 5 * time.Second, MaxTokens: 8, IgnoreEOS: true,
		Prompt: "tokentap canary: say eight words.",
		Expect: probe.Expect{FinishReason: "length", OutputTokensMin: 8, OutputTokensMax: 8}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
