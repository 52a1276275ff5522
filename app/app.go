// Package app wires the sidecar together: configuration, the built-in
// simulated engine when no upstream is given, the end-of-request
// pipeline and its stages, the proxy, the canary probes and the admin
// endpoints. New builds; Run runs; Close releases. cmd/sidecar's main
// only calls Main.
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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/cause"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/egress"
	"github.com/tokentap/tokentap/engine"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/gpu"
	"github.com/tokentap/tokentap/internal/safe"
	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/live"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/probe"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/simengine"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/upstream"
)

// Env is what the sidecar needs from the process.
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
	// Hangup receives a value for every SIGHUP: the records file is
	// reopened (logrotate's create mode). Nil: never.
	Hangup <-chan os.Signal
	// Force is closed on a second SIGTERM or SIGINT during shutdown: the
	// streams still running are cut at once (still recorded, flushed).
	// Nil: never.
	Force <-chan struct{}
}

// Addrs are the bound addresses.
type Addrs struct {
	Proxy, Admin string
	Egress       string // the egress proxy's listener; "" when egress is off
	Upstream     string
	Simulated    bool
}

// Run loads the configuration from args and the environment, builds the
// sidecar and runs it until ctx is done, then shuts down gracefully.
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
		return &usage.Error{Err: err}
	}
	if cfg.Check {
		return printConfig(env.Stdout, cfg)
	}
	s, err := New(ctx, cfg, env)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Run(ctx)
}

// printConfig prints the effective configuration (--config.check), with
// any password in the upstream URL and the tenant hash's secret hidden.
func printConfig(w io.Writer, cfg config.Config) error {
	cfg.Upstream = config.Redacted(cfg.Upstream)
	if cfg.Tenant.HashKey != "" {
		cfg.Tenant.HashKey = "xxxxx"
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "# effective configuration (defaults, file %q, TOKENTAP_* environment, flags)\n%s", cfg.File, b)
	fmt.Fprintf(w, "configuration OK\n")
	return nil
}

// Sidecar is a built sidecar: every component constructed, every
// listener bound, nothing serving yet. Create it with New, run it with
// Run, release it with Close.
type Sidecar struct {
	cfg     config.Config
	env     Env
	log     *slog.Logger
	addrs   Addrs
	cleanup []func() // run in reverse by Close

	// stages are what the replay builds alike (NewStages): metrics,
	// OpenTelemetry, tenants, the structure checker, the records file.
	stages   *Stages
	metrics  *exporter.Metrics
	up       *upstream.Upstream // health, engine kind, models: every poll of the engine
	records  *record.File       // stages.Records
	capture  *capture.Capture   // nil when capture.file is not set
	sampler  *gpu.Sampler
	engine   *engine.Scraper // nil when engine.enabled is off
	proxy    *proxy.Proxy
	ends     proxy.Ends // the proxy's end-of-request stages still running
	prober   *probe.Prober
	nprobes  int
	proxySrv *http.Server
	adminSrv *http.Server
	pln, aln net.Listener
	egress   *egress.Proxy     // nil when egress.listen is not set
	peeks    *proxy.PeekBudget // every request-body peek's, the egress proxy's too
	eln      net.Listener
	// synthetic says what the pages flag as made up (applyDemo); "" in
	// front of a real engine.
	synthetic string
	trend     *slo.Trend
	// via is this process's pseudonym in the Via header
	// (proxy.Options.Via).
	via string
}

func (s *Sidecar) defer_(f func()) { s.cleanup = append(s.cleanup, f) }

// Close releases everything New acquired, in reverse order. It is safe
// to call more than once.
func (s *Sidecar) Close() {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.cleanup = nil
}

// New builds the sidecar from a valid configuration, the data path from
// its end back to its start, each part handed the next: the stages the
// replay builds alike (NewStages: metrics, spans, tenants, the structure
// checker, the records file), the upstream, the pipeline (newPipeline),
// the proxy and its listeners (newProxy), the canary probes that feed the
// same pipeline (newProber), the admin endpoints (newAdmin). On error,
// everything built so far is released.
func New(ctx context.Context, cfg config.Config, env Env) (_ *Sidecar, err error) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	// The first run's demo SLO and price (docs/live.md), before anything
	// reads the SLO or cost sections.
	synthetic := applyDemo(&cfg)
	s := &Sidecar{cfg: cfg, synthetic: synthetic, env: env, log: slog.New(safe.Handler(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: level})))}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	log := s.log

	// The stages every measuring command builds alike (NewStages):
	// metrics (Prometheus always, OTLP and traces when OTEL_* asks),
	// tenants, the structure checker, the records sink.
	judge := slo.NewJudge(cfg.SLO)
	s.stages, err = NewStages(ctx, cfg, cfg.Records, StageEnv{Getenv: env.Getenv, Stdout: env.Stdout, Logger: log})
	if err != nil {
		var ue *usage.Error
		if errors.As(err, &ue) {
			fmt.Fprintf(env.Stderr, "sidecar: %v\n", err)
		}
		return nil, err
	}
	s.defer_(s.stages.Close)
	metrics := s.stages.Metrics
	s.metrics, s.records = metrics, s.stages.Records

	// The upstream: the engine, or the built-in simulator.
	s.addrs.Upstream = cfg.Upstream
	if cfg.Upstream == "" {
		if err := s.startSimulator(); err != nil {
			return nil, err
		}
	}
	up, _ := url.Parse(s.addrs.Upstream)
	// This process's pseudonym in the Via header of everything it sends
	// upstream: a request that comes back with it is a loop, answered
	// 508 (proxy.Options.Via; docs/config.md, "Loops").
	s.via = "tokentap-" + randomHex(6)
	s.up = upstream.New(upstream.Options{URL: up, HealthPath: cfg.UpstreamHealthPath, Kind: cfg.Engine.Kind, Registry: metrics.Registry,
		SetUp: metrics.SetUpstreamUp, SetModels: metrics.Models().SetListed, Logger: log, Via: s.via})

	pipe, pg, err := s.newPipeline(ctx, judge)
	if err != nil {
		return nil, err
	}
	probeSecret := randomHex(16) // marks the canary's requests through the sidecar's own proxy
	if err = s.newProxy(pipe, up, probeSecret); err != nil {
		return nil, err
	}
	s.newProber(pipe, up, probeSecret)
	s.newAdmin(pg)
	return s, nil
}

// pages are what the admin port shows beside the metrics.
type pages struct {
	scorecard *slo.Scorecard
	live      *live.Page // nil when live.enabled is off
}

// newPipeline builds the end-of-request pipeline (package pipeline draws
// its stages): the stages' (NewStages) and the sidecar's own: the
// workload capture, energy, the engine's signals, the book, the
// scorecard and the trend, the live page.
func (s *Sidecar) newPipeline(ctx context.Context, judge *slo.Judge) (*pipeline.Pipeline, pages, error) {
	cfg, metrics, log, synthetic := s.cfg, s.metrics, s.log, s.synthetic
	// The workload capture (docs/capture.md): off unless capture.file
	// or the live reuse.
	if err := s.openCapture(metrics.Registry); err != nil {
		return nil, pages{}, err
	}

	var sinks []record.Sink // the records file is the stages' (Stages.Pipeline)

	// GPU energy: on when NVML works (or when asked), else off, said once.
	s.sampler = s.openEnergy(ctx, metrics)

	// The engine's own metrics, scraped beside what clients feel
	// (docs/engine-signals.md); the simulator is labelled as such.
	var signals pipeline.EngineSignals
	if cfg.Engine.Enabled != "off" {
		ecfg := cfg.Engine
		if s.addrs.Simulated && (ecfg.Kind == "" || ecfg.Kind == "auto") {
			ecfg.Kind = string(engine.Simulator)
		}
		s.engine = engine.New(engine.Options{Config: ecfg, Upstream: s.up.URL(), Client: s.up.Client(), Registry: metrics.Registry, Logger: log})
		signals = s.engine
	}

	// The end-of-request pipeline (package pipeline draws its stages).
	// /slo adds the scorecard (cost, energy, latency tail, the knee, the
	// breach forecast) to the book's rows; the declared prices are
	// exported for the cost rules (docs/cost.md).
	book := slo.NewBook(cfg.SLO, metrics.Registry)
	load := slo.NewLoadMeter(slo.NewLoadBuckets(cfg.Capacity))
	scorecard := slo.NewScorecard(book, load.Buckets(), cfg.Cost, s.sampler != nil, metrics.Registry)
	scorecard.SetSynthetic(synthetic)
	scorecard.SetForecast(cfg.Capacity)
	if s.capture != nil && cfg.Reuse.On(cfg.Capture.File != "") {
		scorecard.SetPrefixReuse(s.prefixReuse)
	}
	// The live page (docs/live.md): the last finished records, kept as
	// a sink, and the 15-minute trend, counted beside the scorecard.
	var waiting func() (float64, bool)
	if s.engine != nil {
		waiting = s.engine.Waiting
	}
	s.trend = newTrend(cfg, load, waiting)
	var livePage *live.Page
	if cfg.Live.Enabled {
		livePage = live.New(live.Options{Requests: cfg.Live.Requests, Trend: s.trend, StallThreshold: judge.Config().StallThreshold, Synthetic: synthetic,
			Registry: metrics.Registry})
		sinks = append(sinks, livePage)
	}
	prices := exporter.Prices{Currency: cfg.Cost.Currency, PerHour: cfg.Cost.Hourly(), EnergyPerKWh: cfg.Cost.EnergyPerKWh}
	metrics.RegisterPrices(prices, time.Now())
	if s.stages.OTel.Metrics != nil {
		if err := exporter.RegisterOTLPPrices(s.stages.OTel.Metrics, prices, time.Now()); err != nil {
			return nil, pages{}, err
		}
	}
	return pipeline.New(s.stages.Pipeline(pipeline.Options{
		Judge: judge, Engine: signals, Energy: s.sampler, Book: book, Load: load, Scorecard: tallies{scorecard, s.trend}, Sinks: sinks,
		Capture: s.capture, Causes: s.causes(judge),
	})), pages{scorecard: scorecard, live: livePage}, nil
}

// newProxy builds the proxy in front of up, its listener (under the
// connection limit it shares with the egress listener) and, when
// configured, the egress proxy, and binds the admin listener.
func (s *Sidecar) newProxy(pipe *pipeline.Pipeline, up *url.URL, probeSecret string) (err error) {
	cfg, metrics, log := s.cfg, s.metrics, s.log
	s.peeks = newPeekBudget(cfg.PeekBudget, metrics.Registry) // shared with the egress proxy
	s.proxy, err = proxy.New(proxy.Options{
		ProbeHeader:     probeSecret,
		Upstream:        up,
		Pipeline:        pipe,
		Logger:          log,
		InjectUsage:     cfg.InjectUsage,
		EventLoop:       cfg.EventLoop,
		PeekBytes:       cfg.PeekBytes,
		PeekBudget:      s.peeks,
		Timeout:         cfg.Timeout,
		BodyReadTimeout: cfg.BodyReadTimeout,
		BodyMinRate:     cfg.BodyMinRate,
		Ends:            &s.ends,
		Structure:       s.stages.ProxyStructure(),
		Tenants:         s.stages.ProxyTenants(),
		Via:             s.via,
	})
	if err != nil {
		return err
	}
	metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokentap_event_loop_streams_total",
		Help: "Streamed answers relayed on the event loop (event_loop); the others took net/http's path."},
		func() float64 { return float64(s.proxy.LoopStreams()) }))
	if s.pln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.defer_(func() { s.pln.Close() })
	maxConns, perStream := cfg.MaxConnections, streamDescriptors(cfg.EventLoop)
	if maxConns == 0 {
		maxConns = defaultMaxConnections(cfg.AdminMaxConnections, perStream)
	} else if need := uint64(perStream*maxConns + cfg.AdminMaxConnections + descriptorReserve); need > descriptorLimit() {
		log.Warn("max_connections and admin_max_connections need more descriptors than the process may open; past the limit new clients wait in the accept queue (raise ulimit -n, or leave max_connections at 0)",
			"max_connections", maxConns, "admin_max_connections", cfg.AdminMaxConnections, "need", need, "rlimit_nofile", descriptorLimit())
	}
	limit := newConnLimit(maxConns, metrics.Registry, proxyLimitSeries) // shared with the egress listener
	s.pln = limit.listener(s.pln)
	if err = s.newEgress(pipe, probeSecret, limit); err != nil {
		return err
	}
	if s.aln, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return fmt.Errorf("admin_listen: %w", err)
	}
	s.defer_(func() { s.aln.Close() })
	s.aln = newConnLimit(cfg.AdminMaxConnections, metrics.Registry, adminLimitSeries).listener(s.aln)
	s.addrs.Proxy, s.addrs.Admin = s.pln.Addr().String(), s.aln.Addr().String()

	return nil
}

// newProber builds the canary prober: its probes send through the same
// pipeline, the built-in simulator's default one when none is declared.
func (s *Sidecar) newProber(pipe *pipeline.Pipeline, up *url.URL, probeSecret string) {
	cfg := s.cfg
	probes := cfg.Probes
	if s.addrs.Simulated && len(probes.Probes) == 0 {
		probes.Probes = []probe.Def{DefaultSimProbe()}
	}
	probes = probes.WithDefaults(cfg.Simulator.Model)
	s.nprobes = len(probes.Probes)
	sidecarURL, _ := url.Parse("http://" + s.addrs.Proxy)
	s.prober = probe.New(probe.Options{Config: probes, Upstream: up, Sidecar: sidecarURL, ProbeHeader: probeSecret, Via: s.via,
		Pipeline: pipe, Registry: s.metrics.Registry, Logger: s.log, Getenv: s.env.Getenv, Synthetic: s.synthetic})

}

// newAdmin builds the admin endpoints and both servers.
func (s *Sidecar) newAdmin(p pages) {
	cfg, metrics, log, synthetic := s.cfg, s.metrics, s.log, s.synthetic
	// Admin endpoints.
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}))
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	admin.Handle("GET /readyz", s.up.Readiness(s.prober))
	admin.Handle("GET /slo", p.scorecard)
	admin.Handle("GET /probes", s.prober)
	eps := []endpoint{
		{"/metrics", "Prometheus metrics (OpenMetrics): docs/metrics.md"},
		{"/healthz", "liveness: the sidecar answers"},
		{"/readyz", "readiness: the engine answers, and the canary probes pass"},
		{"/slo", "SLO attainment and scorecard over this instance's window (?format=json): docs/slo.md"},
		{"/probes", "the canary probes' last results (?format=json): docs/probe.md"},
	}
	if p.live != nil {
		admin.Handle("GET /live", p.live)
		admin.Handle("GET /live/", p.live)
		eps = append(eps,
			endpoint{"/live", "live view: the last requests' token strips, the last 15 minutes, the canary: docs/live.md"},
			endpoint{"/live/data", "the live view's data (JSON; ?n=, ?since=): docs/live.md"})
	}
	admin.Handle("GET /{$}", serveIndex(eps, synthetic))
	admin.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })

	// Timeouts (design note): a request's headers must arrive within 30 s,
	// a keep-alive connection idle between requests is closed after
	// IdleTimeout, and a request body idle for BodyReadTimeout is cut
	// (proxy.Options). There is no write timeout and no whole-request read
	// timeout: a response streams for as long as the engine sends. A
	// request line and headers over proxy.MaxHeaderBytes get a 431.
	// Their ErrorLog counts and logs failed accepts (serverErrors).
	serverErrs := newServerErrors(log, metrics.Registry, "proxy", "admin")
	s.proxySrv = &http.Server{Handler: s.proxy, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: proxy.MaxHeaderBytes, ErrorLog: serverErrs.logger("proxy")}
	if cfg.EventLoop {
		s.proxySrv.ConnContext = proxy.ConnContext
	}
	s.adminSrv = &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: serverErrs.logger("admin")}
}

// startSimulator starts the built-in engine on a loopback port; Close
// stops it.
func (s *Sidecar) startSimulator() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	eng := simengine.NewEngine(s.cfg.Simulator)
	simCtx, simStop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(simCtx); close(done) }()
	srv := &http.Server{Handler: simengine.NewServer(eng), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	s.defer_(func() { srv.Close(); simStop(); <-done })
	s.addrs.Upstream, s.addrs.Simulated = "http://"+ln.Addr().String(), true
	s.log.Warn("NO --upstream GIVEN: running in front of the BUILT-IN SIMULATED ENGINE; every number is synthetic",
		"simulator", s.addrs.Upstream, "model", eng.Config().Model)
	return nil
}

// openEnergy opens the energy source the configuration asks for (auto:
// NVML, then the node's DCGM exporter when its URL is configured or
// derivable) and returns the sampler, or nil when energy is off (said
// once, with why, and counted in tokentap_gpu_source_errors_total).
func (s *Sidecar) openEnergy(ctx context.Context, metrics *exporter.Metrics) *gpu.Sampler {
	cfg, log := s.cfg.Energy, s.log
	state, reason := gpu.StateOff, "disabled"
	defer func() { gpu.ExportState(metrics.Registry, state, reason) }()
	if cfg.Enabled == "off" || cfg.Source == "off" {
		return nil
	}
	faults := gpu.NewFaults(metrics.Registry, log)
	sel, none := gpu.Selection(cfg.Devices, s.env.Getenv)
	var why []any
	if cfg.Source != "dcgm" {
		open := s.env.OpenGPU
		if open == nil {
			open = gpu.Open
		}
		src, err := open(sel, none)
		switch {
		case err != nil:
			reason = gpu.Reason(err)
			why = append(why, "nvml", err)
		case len(src.Devices()) == 0:
			src.Close()
			reason = "no_devices"
			why = append(why, "nvml", fmt.Sprintf("no selected GPU (selection %v)", sel))
		default:
			state, reason = gpu.StateOn, "nvml"
			return s.startEnergy(src, cfg, metrics, reason)
		}
	}
	if cfg.Source != "nvml" {
		t, ok := gpu.ResolveDCGM(cfg.DCGM, sel, s.env.Getenv)
		if ok || cfg.Source == "dcgm" {
			src, err := gpu.OpenDCGM(ctx, t, cfg.Interval, faults)
			switch {
			case err != nil:
				reason = "dcgm_unavailable"
				why = append(why, "dcgm", err)
			case len(src.Devices()) == 0:
				src.Close()
				reason = "no_devices"
				why = append(why, "dcgm", fmt.Sprintf("no GPU of pod %s/%s (or of selection %v) at %s", t.Namespace, t.Pod, sel, t.URL))
			default:
				state, reason = gpu.StateOn, "dcgm"
				return s.startEnergy(src, cfg, metrics, reason)
			}
		} else {
			why = append(why, "dcgm", "no exporter URL (energy.dcgm.url, TOKENTAP_DCGM_URL or NODE_IP)")
		}
	}
	lvl := slog.LevelInfo
	if cfg.Enabled == "on" || cfg.Source == "nvml" || cfg.Source == "dcgm" {
		lvl = slog.LevelError
	}
	log.Log(ctx, lvl, "energy off: no GPU energy source works; everything else runs", append([]any{"reason", reason}, why...)...)
	faults.Count("energy_off")
	return nil
}

// startEnergy makes the sampler of an opened source.
func (s *Sidecar) startEnergy(src gpu.Source, cfg config.Energy, metrics *exporter.Metrics, via string) *gpu.Sampler {
	s.defer_(func() { src.Close() })
	s.log.Info("energy on", "source", via, "gpus", len(src.Devices()), "interval", cfg.Interval)
	return gpu.NewSampler(src, cfg, metrics.Registry)
}

// Run serves until ctx is done or a server fails, then shuts down: the
// probes stop first, in-flight streams get the grace period, the energy
// sampler attributes its last interval (publishing the records it held).
func (s *Sidecar) Run(ctx context.Context) error {
	log, cfg := s.log, s.cfg
	errc := make(chan error, 3)
	go func() { errc <- s.proxySrv.Serve(s.pln) }()
	go func() { errc <- s.adminSrv.Serve(s.aln) }()
	s.serveEgress(errc)
	if s.cfg.DemoOn() {
		log.Warn("FIRST-RUN DEMO: a demo SLO, a demo price and a demo load run against the built-in simulator; all flagged synthetic (--demo=off turns it off)",
			"rate", demoRate(cfg.Demo), "live", "http://"+s.addrs.Admin+"/live")
	}
	log.Info("tokentap is up", "proxy", "http://"+s.addrs.Proxy, "upstream", config.Redacted(s.addrs.Upstream),
		"metrics", "http://"+s.addrs.Admin+"/metrics", "inject_usage", cfg.InjectUsage)
	samplerCtx, stopSampler := context.WithCancel(context.Background())
	samplerDone := make(chan struct{})
	if s.sampler != nil {
		go func() { s.sampler.Run(samplerCtx); close(samplerDone) }()
	} else {
		close(samplerDone)
	}
	engineCtx, stopEngine := context.WithCancel(context.Background())
	defer stopEngine()
	engineDone := make(chan struct{})
	if s.engine != nil {
		go func() { s.engine.Run(engineCtx); close(engineDone) }()
	} else {
		close(engineDone)
	}
	upDone := make(chan struct{})
	go func() { s.up.Run(engineCtx, s.proxy.SetEngine); close(upDone) }()
	probeCtx, stopProbes := context.WithCancel(context.Background())
	probesDone := make(chan struct{})
	go func() { s.prober.Run(probeCtx); close(probesDone) }()
	trendDone := make(chan struct{})
	go func() { s.trend.Run(engineCtx); close(trendDone) }()
	demoDone := make(chan struct{})
	if s.cfg.DemoOn() {
		go func() {
			demoLoad(probeCtx, s.addrs.Proxy, cfg.Simulator.Model, demoRate(cfg.Demo), cfg.Simulator.Seed)
			close(demoDone)
		}()
	} else {
		close(demoDone)
	}
	if s.nprobes > 0 {
		log.Info("canary probes running", "probes", s.nprobes)
	}
	if s.env.Ready != nil {
		s.env.Ready(s.addrs)
	}

	hup := &hangups{log: log, clock: time.Now, path: cfg.Records}
	hupCapture := &hangups{log: log, clock: time.Now, path: cfg.Capture.File, what: "capture file"}
	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-errc:
			runErr = err
			break wait
		case <-s.env.Hangup:
			if s.records != nil {
				hup.reopened(s.records.Reopen()) // every time; logged at most once a second
			}
			if s.capture != nil && cfg.Capture.File != "" {
				hupCapture.reopened(s.capture.Reopen())
			}
		}
	}
	stopProbes() // probes and the demo load stop first: a probe due now is recorded as not_sent
	<-probesDone
	<-demoDone
	log.Info("shutting down: no new requests; in-flight streams may finish", "grace", cfg.ShutdownGrace)
	s.up.ShutDown()
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer scancel()
	go func() {
		select {
		case <-s.env.Force:
			log.Warn("second signal: cutting the remaining streams now")
			scancel()
		case <-sctx.Done():
		}
	}()
	cut := 0
	egressCut := s.shutdownEgress(sctx)
	err := s.proxySrv.Shutdown(sctx)
	if err == nil {
		err = s.proxy.Wait(sctx) // switched protocols (WebSockets), which Shutdown does not wait for
	}
	if err != nil {
		// The grace is over: cut what still runs, record it as
		// error/shutdown, and let the handlers publish their records.
		cut = s.proxy.Cut()
		log.Warn("grace period over; cutting the remaining streams", "streams", cut)
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.proxySrv.Shutdown(dctx); err != nil {
			s.proxySrv.Close()
		}
		s.proxy.Wait(dctx) // the cut sessions' handlers end and record them
		dcancel()
	}
	cut += <-egressCut
	// The end stages of the last requests run after their responses
	// (proxy.Options.Ends): their records are published before the
	// sampler, the engine scraper and the sinks stop.
	ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := s.ends.Wait(ectx); err != nil {
		log.Warn("shutdown: the end of some requests did not finish; their records may be lost", "err", err)
	}
	ecancel()
	stopEngine() // after the last streams: their records had the engine's history
	<-engineDone
	<-trendDone
	<-upDone
	stopSampler() // the last interval is attributed and held records published
	<-samplerDone
	s.closeRecords(recordsCloseBound)
	s.closeCapture(10 * time.Second)
	s.adminSrv.Close()
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	if runErr == nil && cut > 0 {
		runErr = fmt.Errorf("shutdown: %d streams were still running after the %v grace period; they were cut and recorded as error/shutdown", cut, cfg.ShutdownGrace)
	}
	return runErr
}

// closeRecords drains, fsyncs and closes the records file (once).
func (s *Sidecar) closeRecords(within time.Duration) {
	if s.records != nil {
		closeRecords(s.records, s.cfg.Records, s.log, within)
	}
}

// openCapture starts the workload capture when capture.file is set or
// the live reuse is on (config.Reuse.On), and exports its counters
// (docs/metrics.md, "Capture", "Prefix reuse").
func (s *Sidecar) openCapture(reg prometheus.Registerer) error {
	c := s.cfg.Capture
	reuse := s.cfg.Reuse.On(c.File != "")
	if c.File == "" && !reuse {
		return nil
	}
	secret, err := captureSecret(c)
	if err != nil {
		return err
	}
	o := capture.Options{Path: c.File, Secret: secret, BlockTokens: c.BlockSize, BytesPerToken: c.BytesPerToken,
		SessionHeader: c.SessionHeader, NoMeta: c.Meta == "none", Queue: c.Queue, Hold: c.Hold, MaxIDs: c.MaxIDs, Settle: c.Settle, Logger: s.log,
		Fleet: c.IDs == "fleet", Replica: c.ReplicaName(s.env.Getenv, os.Hostname)}
	if reuse {
		ro := s.cfg.Reuse.Options()
		o.Reuse = &ro
	}
	s.capture, err = capture.Open(o)
	if err != nil {
		return err
	}
	s.defer_(func() { s.closeCapture(5 * time.Second) })
	if reuse {
		registerReuse(reg, s.capture)
		s.log.Info("live prefix reuse on", "window", o.Reuse.Window, "cache_blocks", o.Reuse.Sizes, "max_ids", o.Reuse.MaxIDs)
	}
	if c.File == "" {
		return nil
	}
	st := func(name, help string, v func(capture.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(s.capture.Stats()) })
	}
	reg.MustRegister(
		st("tokentap_capture_lines_written_total", "Workload capture lines written whole to the capture file.", func(x capture.Stats) float64 { return float64(x.Written) }),
		st("tokentap_capture_write_errors_total", "Failed writes to the capture file (full disk, I/O error, deleted file).", func(x capture.Stats) float64 { return float64(x.WriteErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokentap_capture_dropped_total", Help: "Finished live requests whose capture line was not written, by reason: file (queue full, write failed, file deleted, after shutdown) or late (a later arrival was written already).", ConstLabels: prometheus.Labels{"reason": "file"}},
			func() float64 { return float64(s.capture.Stats().FileDropped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokentap_capture_dropped_total", Help: "Finished live requests whose capture line was not written, by reason: file (queue full, write failed, file deleted, after shutdown) or late (a later arrival was written already).", ConstLabels: prometheus.Labels{"reason": "late"}},
			func() float64 { return float64(s.capture.Stats().Late) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_capture_held", Help: "Finished requests whose capture line waits for an earlier arrival to finish."},
			func() float64 { return float64(s.capture.Stats().Held) }),
		st("tokentap_capture_id_table_turns_total", "Times a generation of the capture's block-id table was full and the older one forgotten (sharing with lines before is then lost).", func(x capture.Stats) float64 { return float64(x.TableTurns) }),
	)
	s.log.Info("workload capture on", "file", c.File, "secret_file", c.Secret())
	return nil
}

// closeCapture writes the held lines, drains and closes the capture
// file (once).
func (s *Sidecar) closeCapture(within time.Duration) {
	if s.capture == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := s.capture.Close(ctx); err != nil {
		s.log.Error("closing the capture file", "path", s.cfg.Capture.File, "err", err)
	}
}

// newPeekBudget makes the request-body peeks' budget and exports it
// (docs/metrics.md, "Connections and limits").
func newPeekBudget(max int64, reg prometheus.Registerer) *proxy.PeekBudget {
	b := proxy.NewPeekBudget(max)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_peek_budget_bytes",
			Help: "The --peek-budget in force: the bytes all request-body peeks may hold at once."},
			func() float64 { return float64(b.Max()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_peek_held_bytes",
			Help: "Bytes the request-body peeks of the requests in flight hold now (their buffers, grown with the bytes received)."},
			func() float64 { return float64(b.Held()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokentap_peek_budget_full_total",
			Help: "Requests whose body was forwarded unread, or read only in part, because the peek budget was full (request_read: budget)."},
			func() float64 { return float64(b.Full()) }),
	)
	return b
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
// no probe is declared: a shape-controlled chat request (ignore_eos)
// whose answer must have exactly max_tokens tokens and finish cut at
// that limit (the chat API's cut finish reason, "length").
func DefaultSimProbe() probe.Def {
	return probe.Def{Name: "sim-canary", Interval: 5 * time.Second, MaxTokens: 8, IgnoreEOS: true,
		Prompt: "tokentap canary: say eight words.",
		Expect: probe.Expect{FinishReason: stream.APIChat.Response.Cut[0], OutputTokensMin: 8, OutputTokensMax: 8}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// causes is the slow causes' attributor (docs/measurement.md §6b): the
// judge's thresholds, the engine's scrapes when on, the declared
// capacity (the built-in simulator's max_batch unless declared).
func (s *Sidecar) causes(judge *slo.Judge) *cause.Attributor {
	o := cause.Options{SLO: judge.Config(), MaxRunning: s.cfg.Engine.MaxRunning}
	if o.MaxRunning == 0 && s.addrs.Simulated {
		o.MaxRunning = s.cfg.Simulator.WithDefaults().MaxBatch
	}
	if s.engine != nil {
		o.Engine = s.engine
	}
	return cause.New(o)
}
