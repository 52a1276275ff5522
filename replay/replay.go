// Package replay is tokentap replay: it sends a workload trace (a
// tokentap capture, or a public Mooncake trace) open-loop on its
// timestamps to an engine, through the sidecar's own proxy and
// end-of-request pipeline, so that every replayed request is measured as
// live traffic is (records, metrics and spans with traffic "replay"),
// and prints one report: per SLO its attainment with the Wilson bound
// and verdict, goodput, the latency quantiles, the knee by load bucket
// and, for a stepped series of rates, in arrival rate; the schedule lag;
// production beside replay when the trace carries its latencies
// (docs/capture.md, "Replay").
package replay

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/openloop"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// Traffic is the traffic label of replayed requests.
const Traffic = "replay"

// Reasons a scheduled request was not sent.
const (
	NotSentConcurrencyCap = "concurrency_cap"
	NotSentShutdown       = "shutdown"
)

// Options configure a Runner. The zero value of each field is described
// on it; Target and a trace (Trace or Open) are required.
type Options struct {
	// Trace is the trace's path; Open, if set, opens it instead (once
	// per step: each step replays it from its start).
	Trace string
	Open  func() (*workload.Reader, io.Closer, error)
	// Target is the engine's base URL.
	Target *url.URL
	// API is the API of the lines that name none (or one the replay
	// cannot speak); "" means chat.
	API string
	// Model replaces every line's model; "" sends each line's own.
	Model string
	// Stream streams the lines that do not say (public traces).
	Stream bool
	// IgnoreEOS adds the API's ignore-EOS option where it has one, so
	// that each answer has output_length tokens.
	IgnoreEOS bool
	// TimeScale multiplies the trace's gaps; 0 means 1.
	TimeScale float64
	// Rates are the arrival-rate multipliers, one step each, increasing;
	// empty means one step at 1.
	Rates []float64
	// Duration bounds each step's schedule; 0 replays the whole trace.
	Duration time.Duration
	// MaxInFlight bounds the requests in flight; a request due when it
	// is reached is not sent (recorded, counted). 0 means 256.
	MaxInFlight int
	// BlockSize is the tokens one hash id stands for; 0 means 512.
	BlockSize int
	// Seed keys the synthesised prompt text: replays given the same seed
	// send the same text for the same hash id, each step of Rates its
	// own (docs/capture.md, "Several load generators"). 0 draws one at
	// random (Report.Seed says which).
	Seed uint64
	// Timeout bounds one request; 0 means none.
	Timeout time.Duration
	// APIKey is sent with every request in its API's own key header and
	// scheme (stream.API.KeyHeader: a bearer token, Anthropic's
	// x-api-key, Gemini's x-goog-api-key); "" sends none. Never logged.
	APIKey string
	// SLO and Capacity are the sidecar's declarations (its --config).
	// An SLO scoped to live traffic judges replayed requests too.
	SLO      config.SLO
	Capacity config.Capacity
	// Transport carries requests; nil means proxy.NewTransport().
	Transport http.RoundTripper
	// Stages are the pipeline's other stages (metrics, spans, tenants,
	// sinks), as app wires them for the sidecar (app.NewStages); Judge
	// and Load are the Runner's own.
	Stages pipeline.Options
	// Tenants and Structure are the proxy's tenant resolver and answer
	// checker (proxy.Options), as app wires them for the sidecar; nil:
	// none.
	Tenants   proxy.Tenants
	Structure proxy.Structure
	// Registry gets the replay's own metrics; nil registers none.
	Registry prometheus.Registerer
	// NoSpin sleeps until each instant instead of yielding in a loop
	// for its last 2 ms (openloop.Schedule): for a fake clock
	// (testing/synctest), where a loop that never blocks stops time.
	NoSpin bool
}

// Runner replays a trace. Create it with New, run it with Run.
type Runner struct {
	opts    Options
	api     *stream.API
	names   []string
	targets []float64
	pipe    *pipeline.Pipeline
	buckets slo.LoadBuckets
	index   map[string]int // load bucket label → index
	idpfx   string
	seq     atomic.Uint64
	// proxies carry the requests: one per engine kind the lines' APIs
	// imply (stream.API.Engine; "" for most), built when first needed,
	// by prepare alone (the scheduler's goroutine).
	proxies map[string]proxied

	lag       prometheus.Histogram
	scheduled prometheus.Counter
	notSent   *prometheus.CounterVec

	mu       sync.Mutex
	inflight int
	// byLoad: per SLO, offered, qualified and qualified tokens per load
	// bucket, over every step.
	byLoad [][3][]int64
}

// JudgedAsLive returns cfg with "replay" added to the traffic scope of
// every SLO that judges live traffic: a replay stands in for it.
func JudgedAsLive(cfg config.SLO) config.SLO {
	cfg = cfg.WithDefaults()
	obj := make([]config.Objective, len(cfg.Objectives))
	copy(obj, cfg.Objectives)
	for i := range obj {
		for _, t := range obj[i].Scope.Traffic {
			if t == "live" {
				obj[i].Scope.Traffic = append(append([]string{}, obj[i].Scope.Traffic...), Traffic)
				break
			}
		}
	}
	cfg.Objectives = obj
	return cfg
}

// New builds a Runner; opts must be valid (Main validates the flags).
func New(opts Options) *Runner {
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if len(opts.Rates) == 0 {
		opts.Rates = []float64{1}
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	if opts.BlockSize <= 0 {
		opts.BlockSize = DefaultBlockSize
	}
	if opts.Transport == nil {
		opts.Transport = proxy.NewTransport()
	}
	if opts.Open == nil {
		path := opts.Trace
		opts.Open = func() (*workload.Reader, io.Closer, error) { return workload.Open(path, 0) }
	}
	for opts.Seed == 0 { // 0 means "draw one"
		var b [8]byte
		_, _ = crand.Read(b[:])
		opts.Seed = binary.LittleEndian.Uint64(b[:])
	}
	r := &Runner{opts: opts, api: stream.LookupAPI(opts.API), proxies: map[string]proxied{}}
	if r.api == nil || r.api.Probe == nil {
		r.api = stream.APIChat
	}
	cfg := JudgedAsLive(opts.SLO)
	for _, o := range cfg.Objectives {
		r.names = append(r.names, o.Name)
		r.targets = append(r.targets, o.Target)
	}
	r.buckets = slo.NewLoadBuckets(opts.Capacity)
	r.index = map[string]int{}
	for i := range r.buckets.Len() {
		r.index[r.buckets.Label(i)] = i
	}
	r.byLoad = make([][3][]int64, len(r.names))
	for i := range r.byLoad {
		for k := range 3 {
			r.byLoad[i][k] = make([]int64, r.buckets.Len())
		}
	}
	st := opts.Stages
	st.Judge, st.Load = slo.NewJudge(cfg), slo.NewLoadMeter(r.buckets)
	r.pipe = pipeline.New(st)
	var b [4]byte
	_, _ = crand.Read(b[:])
	r.idpfx = "replay-" + hex.EncodeToString(b[:])
	r.lag = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tokentap_replay_schedule_lag_seconds", Help: "sent − scheduled for every replayed request sent (docs/capture.md#replay).",
		Buckets: []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}})
	r.scheduled = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_replay_scheduled_total", Help: "Replayed requests that reached their scheduled instant: each was sent, or counted in tokentap_replay_not_sent_total."})
	r.notSent = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_replay_not_sent_total", Help: "Replayed requests not sent at their instant, by reason (concurrency_cap, shutdown): recorded, never dropped."}, []string{"reason"})
	r.notSent.WithLabelValues(NotSentConcurrencyCap)
	r.notSent.WithLabelValues(NotSentShutdown)
	if opts.Registry != nil {
		opts.Registry.MustRegister(r.lag, r.scheduled, r.notSent)
	}
	return r
}

// spin is how long before each instant the scheduler stops sleeping and
// yields in a loop (openloop.Schedule): two of the runtime's
// millisecond-late timer wake-ups.
const spin = 2 * time.Millisecond

// lead is how long after a step begins its first request is due: time
// to prepare it.
const lead = 5 * time.Millisecond

// ErrEmptyTrace is a trace with no request line.
var ErrEmptyTrace = errors.New("the trace has no request")

// Run replays the trace once per rate, one step after the other (each
// waits for the last's requests to end), and returns what every step
// measured. It stops at the first bad line (a *workload.LineError, the
// report holding what was sent before it) or when ctx is done.
func (r *Runner) Run(ctx context.Context) (*Report, error) {
	var steps []*tally
	var err error
	for i, rate := range r.opts.Rates {
		if ctx.Err() != nil {
			break
		}
		var t *tally
		t, err = r.step(ctx, rate, i)
		if t != nil {
			steps = append(steps, t)
		}
		if err != nil {
			break
		}
	}
	return r.report(steps), err
}

// step replays the trace once at rate, as step i of the run.
func (r *Runner) step(ctx context.Context, rate float64, i int) (*tally, error) {
	rd, closer, err := r.opts.Open()
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	b := &builder{api: r.api, model: r.opts.Model, stream: r.opts.Stream, ignoreEOS: r.opts.IgnoreEOS,
		prompts: newPrompts(r.opts.BlockSize, stepSalt(r.opts.Seed, i))}
	t := newTally(rate, len(r.names))
	first, err := rd.Next()
	if err == io.EOF {
		return t, ErrEmptyTrace
	}
	if err != nil {
		return t, err
	}
	cur, err := b.build(first)
	if err != nil {
		return t, r.lineError(first, err)
	}
	base := first.Timestamp
	start := time.Now().Add(lead) // the first request is prepared before its instant too
	scale := float64(time.Millisecond) * r.opts.TimeScale / rate
	sched := func(ts int64) time.Time { return start.Add(time.Duration(float64(ts-base) * scale)) }
	r.prepare(ctx, t, &cur, start)
	var stepErr error
	var wg sync.WaitGroup
	next := func(time.Time) (time.Time, bool) {
		req, err := rd.Next()
		if err == io.EOF {
			return time.Time{}, false
		}
		if err == nil {
			at := sched(req.Timestamp)
			if r.opts.Duration > 0 && at.Sub(start) >= r.opts.Duration {
				t.stoppedBy = "duration"
				return time.Time{}, false
			}
			if cur, err = b.build(req); err == nil {
				r.prepare(ctx, t, &cur, at)
				return at, true
			}
			err = r.lineError(req, err)
		}
		stepErr, t.stoppedBy = err, "error"
		return time.Time{}, false
	}
	fire := func(at time.Time) { r.fire(ctx, t, cur, at, &wg) }
	sch := openloop.Schedule{Spin: spin}
	if r.opts.NoSpin {
		sch.Spin = 0
	}
	at, pending := sch.Run(ctx, start, next, fire)
	if pending {
		t.stoppedBy = "shutdown"
		r.mu.Lock()
		r.count(t, cur)
		r.mu.Unlock()
		r.skip(t, cur, at, NotSentShutdown)
	}
	wg.Wait()
	t.scheduledSpan = time.Duration(float64(t.traceLast-t.traceFirst) * scale)
	return t, stepErr
}

// lineError is a line the replay cannot send, named as the reader names
// bad lines.
func (r *Runner) lineError(req workload.Request, err error) error {
	name := r.opts.Trace
	if name == "" {
		name = "trace"
	}
	return &workload.LineError{File: name, Line: req.Line, Err: err}
}

// count counts a request at its instant; r.mu is held.
func (r *Runner) count(t *tally, c call) {
	r.scheduled.Inc()
	t.scheduled++
	if t.firstLine == 0 {
		t.firstLine, t.traceFirst = c.req.Line, c.req.Timestamp
	}
	t.lastLine, t.traceLast = c.req.Line, c.req.Timestamp
	t.prod(c.req.Tokentap, r.names)
}

// fire sends c, due at at, unless the cap is reached or the run is
// over: then it is recorded as not sent.
func (r *Runner) fire(ctx context.Context, t *tally, c call, at time.Time, wg *sync.WaitGroup) {
	r.mu.Lock()
	r.count(t, c)
	reason := ""
	switch {
	case ctx.Err() != nil:
		reason = NotSentShutdown
	case r.inflight >= r.opts.MaxInFlight:
		reason = NotSentConcurrencyCap
	default:
		r.inflight++
		t.sent++
	}
	r.mu.Unlock()
	if reason != "" {
		r.skip(t, c, at, reason)
		return
	}
	wg.Go(func() { r.send(t, c, at) })
}

func (r *Runner) nextID() string { return r.idpfx + "-" + strconv.FormatUint(r.seq.Add(1), 10) }

// skip records a request that was not sent: a record with outcome
// not_sent (to the sinks alone, as a canary probe's), and the counts.
func (r *Runner) skip(t *tally, c call, at time.Time, reason string) {
	rec := record.New(0)
	rec.ID = r.nextID()
	rec.Arrive, rec.Traffic, rec.API, rec.Stream = at, Traffic, c.api.Name, c.stream
	rec.SetModel(c.model)
	rec.Outcome, rec.ErrorType, rec.TokenSource = record.NotSent, reason, "none"
	rec.Replay = &record.ReplayInfo{Line: c.req.Line, Scheduled: at, Rate: t.rate, NotSent: reason}
	r.pipe.Record(rec)
	r.notSent.WithLabelValues(reason).Inc()
	r.mu.Lock()
	t.notSent[reason]++
	r.mu.Unlock()
}

// discard is the response writer of a replayed request: the answer is
// measured by the proxy's tap and thrown away.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) Flush()                      {}

// proxied is a proxy of the Runner's, or why it could not be built.
type proxied struct {
	px  *proxy.Proxy
	err error
}

// proxy is the in-process proxy for requests of api, built at its first
// use: the same tap, record, SLO verdict, metrics, spans and sinks as
// live traffic, labelled traffic="replay". Called by prepare alone.
func (r *Runner) proxy(api *stream.API) proxied {
	if p, ok := r.proxies[api.Engine]; ok {
		return p
	}
	var p proxied
	p.px, p.err = proxy.New(proxy.Options{Upstream: r.opts.Target, Transport: r.opts.Transport, Pipeline: r.pipe, InjectUsage: true,
		Timeout: r.opts.Timeout, Traffic: Traffic, Engine: api.Engine, NextID: r.nextID,
		Tenants: r.opts.Tenants, Structure: r.opts.Structure})
	r.proxies[api.Engine] = p
	return p
}

// prepare makes c's HTTP request before its instant at, so that nothing
// but the send is left for the instant; its line, schedule and rate ride
// on it to its record (proxy.Hook).
func (r *Runner) prepare(ctx context.Context, t *tally, c *call, at time.Time) {
	line, rate := c.req.Line, t.rate // not c: the scheduler reuses it
	out := &sendState{}
	c.out = out
	p := r.proxy(c.api)
	c.px, out.err = p.px, p.err
	ctx = proxy.WithHook(ctx, &proxy.Hook{Check: func(x *record.Record) {
		x.Replay = &record.ReplayInfo{Line: line, Scheduled: at, Rate: rate}
		out.rec = x
	}})
	c.hreq, _ = http.NewRequestWithContext(ctx, http.MethodPost, c.path, bytes.NewReader(c.body))
	c.hreq.Header.Set("Content-Type", "application/json")
	for _, h := range c.api.ProbeHeaders {
		c.hreq.Header.Set(h[0], h[1])
	}
	if r.opts.APIKey != "" {
		c.hreq.Header.Set(c.api.KeyHeader(r.opts.APIKey))
	}
}

// sendState is what a request's send leaves: its finished record, or
// why it could not be sent.
type sendState struct {
	rec *record.Record
	err error
}

// send sends a prepared request and counts its record.
func (r *Runner) send(t *tally, c call, at time.Time) {
	var sent time.Time
	if c.out.err == nil {
		sent = time.Now()
		r.lag.Observe(sent.Sub(at).Seconds())
		c.px.ServeHTTP(&discard{h: http.Header{}}, c.hreq) // the end stages have run when it returns
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight--
	if sent.IsZero() || c.out.rec == nil {
		t.failed["error/not_recorded"]++
		return
	}
	t.lag.add(sent.Sub(at))
	if t.first.IsZero() || sent.Before(t.first) {
		t.first = sent
	}
	t.done(c.out.rec, c.want, r.names, r.bucketIndex, r.perLoad)
}

func (r *Runner) bucketIndex(label string) int {
	if i, ok := r.index[label]; ok {
		return i
	}
	return -1
}

// perLoad counts a verdict in its load bucket; r.mu is held.
func (r *Runner) perLoad(s, b int, qualified bool, tokens int64) {
	r.byLoad[s][0][b]++
	if qualified {
		r.byLoad[s][1][b]++
		r.byLoad[s][2][b] += tokens
	}
}
