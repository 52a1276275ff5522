package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/structure"
	"github.com/tokentap/tokentap/tenant"
	"github.com/tokentap/tokentap/tracing"
)

// Stages are the parts of the data path that every command measuring
// requests builds from its configuration the same way: the sidecar (New)
// and the replay (package replay). NewStages builds them; Close releases
// them. What only the sidecar has (the live page, the book and scorecard,
// energy, the engine's signals, the workload capture, the listeners) New
// adds on top.
type Stages struct {
	// Metrics are the Prometheus metrics, every series declared.
	Metrics *exporter.Metrics
	// OTel are the OpenTelemetry providers the OTEL_* environment asks
	// for (each nil when not asked).
	OTel *tracing.Providers
	// OTLP exports the metrics over OTLP; nil unless OTEL_* asks.
	OTLP *exporter.OTLP
	// Tracer makes the request spans; nil unless OTEL_* asks for traces.
	Tracer *tracing.Tracer
	// Tenants identifies and bounds tenants; nil when tenants are off.
	Tenants *tenant.Resolver
	// Structure checks answers' structure; nil when no SLO requires it.
	Structure *structure.Checker
	// Records is the records file (or stream); nil when there is none.
	Records *record.File

	cleanup []func() // run in reverse by Close
}

// StageEnv is what NewStages needs from the process.
type StageEnv struct {
	// Getenv reads the OTEL_* environment.
	Getenv func(string) string
	// Stdout receives the records when the records path is "-".
	Stdout io.Writer
	// Logger logs the stages' warnings (the tenants' ephemeral secret,
	// content capture on) and their failures. Nil discards them.
	Logger *slog.Logger
}

// NewStages builds the stages cfg asks for, with records written to the
// records path ("-": env.Stdout; "": none). Bad configuration the loader
// could not see (a tenant secret file, the OTEL_* environment, a records
// file that cannot be opened) is a *usage.Error: exit status 2. On error, everything built so far is released.
func NewStages(ctx context.Context, cfg config.Config, records string, env StageEnv) (_ *Stages, err error) {
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stages{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// Tenants (docs/config.md, tenant): off unless configured.
	if s.Tenants, err = tenant.New(cfg.Tenant); err != nil {
		return nil, &usage.Error{Err: err}
	}
	if s.Tenants.Ephemeral() {
		log.Warn("tenants: no tenant.hash_key_file or hash_key: undeclared tenants are hashed with a random secret of this process; their labels change on restart and differ between replicas")
	}
	judged := slo.NewJudge(cfg.SLO).Config()
	mcfg := s.metricsConfig(cfg, judged)
	s.Metrics = exporter.New(mcfg)
	if s.OTel, err = tracing.Setup(ctx, cfg.Tracing, env.Getenv, s.Metrics.Registry, log); err != nil {
		return nil, &usage.Error{Err: fmt.Errorf("OpenTelemetry setup (OTEL_* environment): %w", err)}
	}
	s.defer_(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.OTel.Shutdown(sctx); err != nil { // flushes spans and metrics
			log.Warn("flushing OpenTelemetry data", "err", err)
		}
	})
	if s.OTel.Metrics != nil {
		if s.OTLP, err = exporter.NewOTLP(s.OTel.Metrics, mcfg); err != nil {
			return nil, err
		}
	}
	if s.OTel.Traces != nil {
		topts := tracing.Options{Provider: s.OTel.Traces, ProviderName: cfg.Tracing.ProviderName, StallThreshold: judged.StallThreshold}
		if cfg.Tracing.CaptureContent {
			c := &tracing.ContentCapture{MaxBytes: cfg.Tracing.MaxContentBytes, Redact: tracing.DefaultRedactions()}
			for _, r := range cfg.Tracing.Redact {
				c.Redact = append(c.Redact, regexp.MustCompile(r)) // validated by config
			}
			topts.Capture = c
			log.Warn("content capture is ON: prompts and completions go into spans (redacted, truncated); pre-production use")
		}
		s.Tracer = tracing.New(topts)
		log.Info("tracing on", "keep", cfg.Tracing.Keep)
	}
	if cfg.SLO.StructureChecks() { // one checker: one schema cache for every proxy
		s.Structure = &structure.Checker{DefaultDraft: cfg.Structure.DefaultDraft, Limits: structure.Limits{
			MaxSchemaBytes: cfg.Structure.MaxSchemaBytes, MaxSchemaDepth: cfg.Structure.MaxSchemaDepth,
			MaxSchemaKeywords: cfg.Structure.MaxSchemaKeywords, MaxCompile: cfg.Structure.MaxCompile}}
	}
	// Stdout, a pipe or a FIFO never block the start, SIGHUP or SIGTERM
	// (docs/records-file.md, "Pipes and stdout").
	switch records {
	case "":
	case "-":
		s.Records = record.NewStream(env.Stdout, record.FileOptions{Logger: log})
	default:
		if s.Records, err = record.OpenFile(records, record.FileOptions{Logger: log}); err != nil {
			return nil, &usage.Error{Err: fmt.Errorf("records: %w", err)}
		}
	}
	if s.Records != nil {
		s.defer_(func() { closeRecords(s.Records, records, log, recordsCloseBound) })
		exportFileStats(s.Metrics.Registry, s.Records)
	}
	return s, nil
}

// metricsConfig is the exporter's configuration: the declared models,
// SLOs, tenants and load buckets, every series made before it is used.
func (s *Stages) metricsConfig(cfg config.Config, judged slo.Config) exporter.Config {
	var sloNames, tenantNames []string
	for _, o := range judged.Objectives {
		sloNames = append(sloNames, o.Name)
	}
	for _, d := range cfg.Tenant.Tenants {
		tenantNames = append(tenantNames, d.Name)
	}
	return exporter.Config{MaxModels: cfg.MaxModels, Models: cfg.Models, SLOs: sloNames, Tenants: tenantNames,
		LoadBuckets: slo.NewLoadBuckets(cfg.Capacity).Labels(), ProviderName: cfg.Tracing.ProviderName}
}

// Pipeline is o with the stages filled in: the metrics (live, models,
// Prometheus, OTLP), the tenants, the spans, and the records file first
// among the sinks.
func (s *Stages) Pipeline(o pipeline.Options) pipeline.Options {
	o.Live, o.Models, o.Prometheus, o.OTLP, o.Tracer = s.Metrics, s.Metrics.Models(), s.Metrics, s.OTLP, s.Tracer
	if s.Tenants != nil {
		o.Tenants = s.Tenants
	}
	if s.Records != nil {
		o.Sinks = append([]record.Sink{s.Records}, o.Sinks...)
	}
	return o
}

// ProxyTenants is the tenant resolver for the proxies: nil (no interface
// holding a nil pointer) when tenants are off.
func (s *Stages) ProxyTenants() proxy.Tenants {
	if s.Tenants == nil {
		return nil
	}
	return s.Tenants
}

// ProxyStructure is the structure checker for the proxies: nil (no
// interface holding a nil pointer) when no SLO requires the checks.
func (s *Stages) ProxyStructure() proxy.Structure {
	if s.Structure == nil {
		return nil
	}
	return s.Structure
}

func (s *Stages) defer_(f func()) { s.cleanup = append(s.cleanup, f) }

// Close flushes and releases the stages, in reverse order: the records
// file drained and closed, then the OpenTelemetry data flushed. It is
// safe to call more than once.
func (s *Stages) Close() {
	for i := len(s.cleanup) - 1; i >= 0; i-- {
		s.cleanup[i]()
	}
	s.cleanup = nil
}

// recordsCloseBound bounds the records file's close at shutdown: its
// queue drained into the file, or into a pipe whose reader reads; a
// reader that does not (or a FIFO with none) costs the exit at most
// this, and what is left is dropped and counted.
const recordsCloseBound = 10 * time.Second

// closeRecords drains, fsyncs and closes the records file f (written at
// path); closing again does nothing.
func closeRecords(f *record.File, path string, log *slog.Logger, within time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := f.Close(ctx); err != nil {
		log.Error("closing the records file", "path", path, "err", err)
	}
}

// exportFileStats exports the records file's counters.
func exportFileStats(reg prometheus.Registerer, f *record.File) {
	c := func(name, help string, v func(record.FileStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(f.Stats())) })
	}
	reg.MustRegister(
		c("tokentap_records_written_total", "Records written whole to the records file.", func(s record.FileStats) uint64 { return s.Written }),
		c("tokentap_records_write_errors_total", "Failed writes to the records file (full disk, I/O error), and batches that went, or would have gone, to a deleted file; each is logged, rate-limited, and the partial line removed.", func(s record.FileStats) uint64 { return s.WriteErrors }),
		c("tokentap_records_dropped_total", "Records not written: their write failed, the in-memory queue was full (a slow disk, or a pipe's reader that stopped reading), the file was deleted (never counted as written), or they came after shutdown.", func(s record.FileStats) uint64 { return s.Dropped }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_records_queued", Help: "Records waiting in memory for the records writer (at most 4096): a full queue drops the next ones."},
			func() float64 { return float64(f.Stats().Queued) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokentap_records_wait_seconds_total", Help: "Seconds the records writer waited on a pipe, FIFO or stdout: in write(2) to a reader that did not read, and for a FIFO's reader to open it (0 for a regular file)."},
			func() float64 { return f.Stats().Waited.Seconds() }),
	)
}
