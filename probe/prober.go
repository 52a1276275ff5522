package probe

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/openloop"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Options wires a Prober.
type Options struct {
	Config Config
	// Upstream is the engine; Sidecar the sidecar's own proxy listener,
	// for probes with target "sidecar". ProbeHeader is the value the
	// sidecar's proxy recognises as its own probes (proxy.Options).
	Upstream, Sidecar *url.URL
	ProbeHeader       string
	// Via is the sidecar's pseudonym in the Via header
	// (proxy.Options.Via), on every probe sent. "": none.
	Via string
	// Pipeline receives canary requests like live ones (SLO verdict,
	// metrics, records) and the records of probes not sent. Nil keeps
	// nothing.
	Pipeline *pipeline.Pipeline
	Registry prometheus.Registerer
	// Transport carries probes; nil means proxy.NewTransport().
	Transport http.RoundTripper
	Logger    *slog.Logger
	// Getenv reads api_key_env; nil means os.Getenv.
	Getenv func(string) string
	// Synthetic, when not empty, is shown on /probes as a warning: what
	// on the page is made up (the built-in simulator's numbers). ""
	// shows none.
	Synthetic string
}

// Prober runs the configured probes. Create it with New, run it with Run.
type Prober struct {
	opts  Options
	cfg   Config
	defs  []*defState
	log   *slog.Logger
	rng   *rand.Rand
	rngMu sync.Mutex
	// idpfx and seq make every probe record's id, sent or not: one
	// scheme, as live records' (a random prefix and a sequence number).
	idpfx string
	seq   atomic.Uint64

	success, duration, consecutive *prometheus.GaugeVec
	scheduled                      *prometheus.CounterVec
	results, quality, notSent      *prometheus.CounterVec
	lag                            *prometheus.HistogramVec
}

type defState struct {
	def     Def
	checker *checker
	// px carries the probe's requests: one proxy per target (and engine
	// kind), shared by the probes that name it; nil if it could not be
	// built (logged at each run).
	px       *proxy.Proxy
	pxErr    error
	mu       sync.Mutex
	inflight int
	fails    int // consecutive failures
	recent   []Result
	failures []Result
}

// Result is one probe's result, as /probes shows it.
type Result struct {
	Probe        string    `json:"probe"`
	Scheduled    time.Time `json:"scheduled"`
	Sent         time.Time `json:"sent,omitzero"`
	LagMS        float64   `json:"schedule_lag_ms"`
	Result       string    `json:"result"` // success, failed, not_sent
	Outcome      string    `json:"outcome"`
	HTTPStatus   int       `json:"http_status"`
	ErrorType    string    `json:"error_type,omitempty"`
	Check        string    `json:"failed_check,omitempty"`
	Failure      string    `json:"failure,omitempty"`
	Detail       string    `json:"detail,omitempty"` // the failing response's error text, bounded
	TTFTMS       *float64  `json:"ttft_ms"`
	E2EMS        *float64  `json:"e2e_ms"`
	OutputTokens *int64    `json:"output_tokens"` // nil (null) when unknown, as in records
	RecordID     string    `json:"record_id,omitempty"`
	Prompt       string    `json:"prompt,omitempty"` // only with record_prompt
	// Upstream is the record's connection phases (its upstream object);
	// nil when the probe never reached the transport (not sent).
	Upstream *record.Upstream `json:"upstream,omitempty"`
}

// Results of a probe.
const (
	ResultSuccess = "success"
	ResultFailed  = "failed"
	ResultNotSent = "not_sent"
)

// New validates nothing (config.Load did) and registers the metrics.
func New(opts Options) *Prober {
	if opts.Transport == nil {
		opts.Transport = proxy.NewTransport()
	}
	if opts.Pipeline == nil {
		opts.Pipeline = pipeline.New(pipeline.Options{})
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	var b [4]byte
	_, _ = crand.Read(b[:])
	p := &Prober{opts: opts, cfg: opts.Config, log: opts.Logger, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)),
		idpfx: hex.EncodeToString(b[:])}
	l := []string{"probe"}
	p.success = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "probe_success", Help: "1 if the last probe succeeded (outcome success and every quality check passed), else 0; as blackbox_exporter's."}, l)
	p.duration = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "probe_duration_seconds", Help: "End-to-end latency of the last probe sent."}, l)
	p.consecutive = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_probe_consecutive_failures", Help: "Failed or not-sent probes in a row, per probe."}, l)
	p.scheduled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_probe_scheduled_total", Help: "Probes that reached their scheduled instant. Every one ends in exactly one tokentap_probe_results_total result."}, l)
	p.results = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_probe_results_total", Help: "Finished probes by result: success, failed (outcome not success or a quality check failed), not_sent."}, []string{"probe", "result"})
	p.quality = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_probe_quality_failures_total", Help: "Probes whose request succeeded but whose answer failed a quality check, by check."}, []string{"probe", "check"})
	p.notSent = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_probe_not_sent_total", Help: "Probes that could not be sent at their scheduled instant, by reason (concurrency_cap, shutdown): recorded, never dropped."}, []string{"probe", "reason"})
	p.lag = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokentap_probe_schedule_lag_seconds", Help: "sent − scheduled for every probe sent.",
		Buckets: []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}}, l)
	if opts.Registry != nil {
		opts.Registry.MustRegister(p.success, p.duration, p.consecutive, p.scheduled, p.results, p.quality, p.notSent, p.lag)
	}
	proxies := map[string]*defState{} // target and engine → the first probe with that proxy
	for _, d := range p.cfg.Probes {
		s := &defState{def: d, checker: newChecker(d.Expect)}
		target, eng := p.target(&d), stream.LookupAPI(d.API).Engine
		key := eng + " " + target.String()
		if o, ok := proxies[key]; ok {
			s.px, s.pxErr = o.px, o.pxErr
		} else {
			s.px, s.pxErr = proxy.New(proxy.Options{Upstream: target, Transport: opts.Transport, Pipeline: opts.Pipeline,
				InjectUsage: true, Traffic: "canary", Engine: eng, NextID: p.nextID, Via: opts.Via})
			proxies[key] = s
		}
		p.defs = append(p.defs, s)
		for _, r := range []string{ResultSuccess, ResultFailed, ResultNotSent} {
			p.results.WithLabelValues(d.Name, r)
		}
		p.scheduled.WithLabelValues(d.Name)
		p.notSent.WithLabelValues(d.Name, "concurrency_cap")
	}
	return p
}

// Run fires every probe on its schedule until ctx is done, then waits
// for the probes in flight (their context is cancelled with ctx).
func (p *Prober) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range p.defs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.schedule(ctx, s, &wg)
		}()
	}
	wg.Wait()
}

// next returns the instant after t in d's schedule. The schedule depends
// on nothing but the clock: it is open-loop.
func (p *Prober) next(d *Def, t time.Time) time.Time {
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	gap := d.Interval
	switch d.Schedule {
	case "poisson":
		gap = time.Duration(p.rng.ExpFloat64() * float64(d.Interval))
	default:
		if d.Jitter > 0 {
			gap = time.Duration(float64(gap) * (1 + d.Jitter*(2*p.rng.Float64()-1)))
		}
	}
	return t.Add(max(gap, time.Millisecond))
}

func (p *Prober) schedule(ctx context.Context, s *defState, wg *sync.WaitGroup) {
	at, pending := openloop.Run(ctx, time.Now(),
		func(t time.Time) (time.Time, bool) { return p.next(&s.def, t), true },
		func(at time.Time) { p.fire(ctx, s, at, wg) })
	if pending {
		// The instant that was due next cannot be sent: say so.
		p.scheduled.WithLabelValues(s.def.Name).Inc()
		p.skip(s, at, "shutdown")
	}
}

func (p *Prober) fire(ctx context.Context, s *defState, at time.Time, wg *sync.WaitGroup) {
	p.scheduled.WithLabelValues(s.def.Name).Inc()
	s.mu.Lock()
	if s.inflight >= s.def.MaxConcurrent {
		s.mu.Unlock()
		p.skip(s, at, "concurrency_cap")
		return
	}
	s.inflight++
	s.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { s.mu.Lock(); s.inflight--; s.mu.Unlock() }()
		p.run(ctx, s, at)
	}()
}

// skip records a probe that could not be sent: a record with outcome
// not_sent, a result, and the counters.
func (p *Prober) skip(s *defState, at time.Time, reason string) {
	d := &s.def
	r := record.New(0)
	r.ID = p.nextID()
	r.Arrive, r.Traffic, r.API, r.Model, r.Stream = at, "canary", stream.Name(d.API), d.Model, *d.Stream
	r.Outcome, r.ErrorType, r.TokenSource = record.NotSent, reason, "none"
	r.Probe = &record.ProbeInfo{Name: d.Name, Scheduled: at, Result: ResultNotSent, Failure: "not sent: " + reason}
	p.opts.Pipeline.Record(r)
	p.notSent.WithLabelValues(d.Name, reason).Inc()
	p.finish(s, Result{Probe: d.Name, Scheduled: at, Result: ResultNotSent, Outcome: ResultNotSent, Failure: "not sent: " + reason, RecordID: r.ID})
}

// nextID returns the next probe record's id: the prober's random prefix
// and its sequence number, for probes sent and not sent alike.
func (p *Prober) nextID() string {
	return p.idpfx + "-" + strconv.FormatUint(p.seq.Add(1), 10)
}

func (p *Prober) finish(s *defState, res Result) {
	name := s.def.Name
	p.results.WithLabelValues(name, res.Result).Inc()
	s.mu.Lock()
	if res.Result == ResultSuccess {
		s.fails = 0
	} else {
		s.fails++
	}
	fails := s.fails
	s.recent = appendBounded(s.recent, res, p.cfg.History)
	if res.Result != ResultSuccess {
		s.failures = appendBounded(s.failures, res, p.cfg.History)
	}
	s.mu.Unlock()
	p.consecutive.WithLabelValues(name).Set(float64(fails))
	if res.Result != ResultNotSent {
		if res.Result == ResultSuccess {
			p.success.WithLabelValues(name).Set(1)
		} else {
			p.success.WithLabelValues(name).Set(0)
		}
	}
}

func appendBounded(l []Result, r Result, n int) []Result {
	if len(l) >= n {
		copy(l, l[1:])
		l = l[:n-1]
	}
	return append(l, r)
}

// capture is the ResponseWriter a probe's response is written to: the
// bytes are kept (bounded) for the quality check.
type capture struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.h }
func (c *capture) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}
func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = 200
	}
	if c.body.Len() < 1<<20 {
		c.body.Write(b)
	}
	return len(b), nil
}
func (c *capture) Flush() {}

// target is where d's requests go: the engine, d's own URL, or the
// sidecar's proxy listener.
func (p *Prober) target(d *Def) *url.URL {
	target := p.opts.Upstream
	if d.URL != "" {
		target, _ = url.Parse(d.URL) // validated by config
	}
	if d.Target == "sidecar" && p.opts.Sidecar != nil {
		target = p.opts.Sidecar
	}
	return target
}

// run sends one probe through its target's in-process proxy (built once,
// in New): the same tap, record, SLO judge and exporter as live traffic,
// labelled traffic="canary"; the probe's name, quality check and timeout
// ride on the request (proxy.Hook).
func (p *Prober) run(ctx context.Context, s *defState, scheduled time.Time) {
	d := &s.def
	if s.pxErr != nil {
		p.log.Error("probe", "probe", d.Name, "err", s.pxErr)
		return
	}
	path, body := request(d)
	cw := &capture{h: http.Header{}}
	obs := &observer{p: p, s: s, scheduled: scheduled, cw: cw}
	ctx = proxy.WithHook(ctx, &proxy.Hook{Probe: d.Name, Check: obs.check, Timeout: d.Timeout})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	a := stream.LookupAPI(d.API)
	for _, h := range a.ProbeHeaders {
		req.Header.Set(h[0], h[1])
	}
	for k, v := range d.Headers {
		req.Header.Set(k, v)
	}
	if key := p.apiKey(d); key != "" {
		req.Header.Set(a.KeyHeader(key)) // the API's own key header and scheme
	}
	if d.Target == "sidecar" {
		req.Header.Set(proxy.ProbeHeaderName, p.opts.ProbeHeader)
	}
	obs.sent = time.Now()
	p.lag.WithLabelValues(d.Name).Observe(obs.sent.Sub(scheduled).Seconds())
	s.px.ServeHTTP(cw, req)
}

func (p *Prober) apiKey(d *Def) string {
	switch {
	case d.APIKeyFile != "":
		b, err := os.ReadFile(d.APIKeyFile)
		if err != nil {
			p.log.Warn("probe: cannot read api_key_file", "probe", d.Name, "err", err) // the path, never the key
			return ""
		}
		return strings.TrimSpace(string(b))
	case d.APIKeyEnv != "":
		return p.opts.Getenv(d.APIKeyEnv)
	}
	return ""
}

// observer follows one probe: when the request ends (the pipeline's
// canary stage) it runs the quality check on the captured answer and
// annotates the record before the SLO verdict, the metrics and the
// records see it.
type observer struct {
	p         *Prober
	s         *defState
	scheduled time.Time
	sent      time.Time
	cw        *capture
}

func (o *observer) check(r *record.Record) {
	d := &o.s.def
	res := Result{Probe: d.Name, Scheduled: o.scheduled, Sent: o.sent, LagMS: msf(o.sent.Sub(o.scheduled)),
		Outcome: string(r.Outcome), HTTPStatus: r.HTTPStatus, ErrorType: r.ErrorType, RecordID: r.ID}
	if r.OutputTokens >= 0 {
		n := r.OutputTokens
		res.OutputTokens = &n
	}
	if v, ok := r.TTFT(); ok {
		f := msf(v)
		res.TTFTMS = &f
	}
	if r.Upstream.Asked {
		up := r.Upstream
		res.Upstream = &up
	}
	if v, ok := r.E2E(); ok {
		f := msf(v)
		res.E2EMS = &f
		o.p.duration.WithLabelValues(d.Name).Set(v.Seconds())
	}
	if r.Outcome == record.Success {
		text := stream.AnswerTextOf(stream.FormatOfAPI(stream.Name(d.API)), o.cw.body.Bytes(), r.Stream)
		res.Check, res.Failure = o.s.checker.check(text, r.FinishReason, r.OutputTokens)
		if res.Check != "" {
			o.p.quality.WithLabelValues(d.Name, res.Check).Inc()
		}
	} else {
		res.Failure = fmt.Sprintf("outcome %s (%s), HTTP %d", r.Outcome, r.ErrorType, r.HTTPStatus)
		if r.ErrorType == record.ErrHTTP3xx {
			res.Failure = fmt.Sprintf("redirect not followed: HTTP %d to %s (outcome %s)", r.HTTPStatus, location(o.cw.h.Get("Location")), r.Outcome)
		}
		res.Detail = errorDetail(o.cw.body.Bytes())
	}
	res.Result = ResultSuccess
	if r.Outcome != record.Success || res.Check != "" {
		res.Result = ResultFailed
	}
	if d.RecordPrompt {
		res.Prompt = d.Prompt
	}
	r.Probe = &record.ProbeInfo{Name: d.Name, Scheduled: o.scheduled, Result: res.Result, Check: res.Check, Failure: res.Failure}
	o.p.finish(o.s, res)
}

// location is a redirect's Location as a probe's failure names it: its
// scheme, host and path, without credentials, query or fragment (a signed
// URL's token), quoted, its first 200 bytes. A probe never follows a redirect: a
// 3xx carries no answer (docs/measurement.md §3).
func location(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		return "no Location"
	case err != nil:
		return "an unparseable Location"
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	s := u.String()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strconv.Quote(s) // a cut rune or a control byte is escaped
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// errorDetail finds the error message of a failed response, bounded: an
// error event's or an error body's "message".
func errorDetail(body []byte) string {
	var msg string
	try := func(data []byte) {
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &e) != nil || len(e.Error) == 0 {
			return
		}
		var obj struct{ Message string }
		if json.Unmarshal(e.Error, &obj) == nil && obj.Message != "" {
			msg = obj.Message
		} else {
			var s string
			if json.Unmarshal(e.Error, &s) == nil {
				msg = s
			}
		}
	}
	try(body)
	if msg == "" {
		var f stream.Framer
		f.Feed(body, func(e *stream.Event) { try(e.Data) })
	}
	if len(msg) > 256 {
		msg = msg[:256]
	}
	return msg
}

// Ready reports false when ReadyAfterFailures is set and some probe has
// failed that many times in a row.
func (p *Prober) Ready() (bool, string) {
	if p == nil || p.cfg.ReadyAfterFailures <= 0 {
		return true, ""
	}
	for _, s := range p.defs {
		s.mu.Lock()
		f := s.fails
		s.mu.Unlock()
		if f >= p.cfg.ReadyAfterFailures {
			return false, fmt.Sprintf("probe %s failed %d times in a row", s.def.Name, f)
		}
	}
	return true, ""
}

// History returns each probe's recent results and kept failures.
func (p *Prober) History() map[string]struct{ Recent, Failures []Result } {
	out := map[string]struct{ Recent, Failures []Result }{}
	for _, s := range p.defs {
		s.mu.Lock()
		out[s.def.Name] = struct{ Recent, Failures []Result }{append([]Result{}, s.recent...), append([]Result{}, s.failures...)}
		s.mu.Unlock()
	}
	return out
}
