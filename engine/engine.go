// Package engine reads the upstream engine's own Prometheus metrics and
// puts them beside what the client felt (docs/engine-signals.md).
//
// A Scraper fetches the engine's metrics endpoint every interval (within
// a timeout), parses the exposition with the Prometheus libraries
// (expfmt: the text format, OpenMetrics or protobuf, as the engine
// answers), detects the engine from its metric name prefixes, and
// exports normalised series on the sidecar's registry:
// tokentap_engine_requests_running, _requests_waiting,
// _kv_cache_usage_ratio (0-1), _preemptions_total (following the engine's
// counter across its resets) and what else maps cleanly, each labelled
// engine. Ollama, which has no /metrics, is read through /api/ps.
//
// It keeps the history of the preemption counter, the queue and the KV
// cache, so that the end-of-request pipeline can ask how many preemptions
// the engine made while a request ran, and what coincided with its
// stalls (Signals). The scrape interval bounds how precisely: see
// docs/engine-signals.md.
package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokentap/tokentap/config"
)

// Config is the engine section; it lives in package config (a leaf).
type Config = config.Engine

// MaxBody bounds one scrape's body.
const MaxBody = 16 << 20

// MaxLines bounds the lines of one scrape's text exposition (Prometheus
// or OpenMetrics; a protobuf body is bounded by MaxBody only): the parse
// into families costs about 500 bytes of heap a series (a 14 MB page of
// 240,000 one-line series held 111 MiB), so the byte bound alone is not
// one on memory. A vLLM or SGLang page is a few thousand lines.
const MaxLines = 50_000

// accept asks for the Prometheus text format first: its counter names
// carry _total as the engine wrote them, which passthrough keeps.
// OpenMetrics and protobuf are parsed too.
const accept = `text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.3,*/*;q=0.1`

// Scrape failure reasons: a bounded label.
const (
	ReasonOK        = "ok"
	ReasonAPIPS     = "api_ps" // Ollama: no /metrics, state read from /api/ps
	ReasonTimeout   = "timeout"
	ReasonConnect   = "connect"
	ReasonHTTP3xx   = "http_3xx" // a redirect: never followed (docs/measurement.md §3)
	ReasonHTTP4xx   = "http_4xx"
	ReasonHTTP5xx   = "http_5xx"
	ReasonParse     = "parse"
	ReasonTooLarge  = "too_large"
	ReasonNoMetrics = "no_metrics" // no metrics endpoint and no /api/ps
	ReasonStopped   = "not_started"
)

var failureReasons = []string{ReasonTimeout, ReasonConnect, ReasonHTTP3xx, ReasonHTTP4xx, ReasonHTTP5xx, ReasonParse, ReasonTooLarge, ReasonNoMetrics}

// Options configure a Scraper.
type Options struct {
	Config   Config
	Upstream *url.URL
	// Registry receives the tokentap_engine_* series; nil: none.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Client does the scrapes; nil: a client of its own.
	Client *http.Client
}

// Scraper scrapes one engine. Its methods are safe for concurrent use.
type Scraper struct {
	cfg    Config
	base   *url.URL
	client *http.Client
	log    *slog.Logger
	fixed  Kind

	failures *prometheus.CounterVec

	mu       sync.Mutex
	kind     Kind
	path     string // the endpoint found; "" while detecting
	snap     *Snapshot
	reason   string
	duration float64
	follow   map[string]*follower
	prefix   prefixRatio
	hist     history
	said     string // the last state logged
	unknown  bool   // said that the names were not recognised
	pass     []*dto.MetricFamily
}

// New returns a scraper of the upstream's engine and registers its
// series. It scrapes nothing until Run or Scrape.
func New(o Options) *Scraper {
	cfg := o.Config.WithDefaults()
	s := &Scraper{cfg: cfg, base: o.Upstream, client: o.Client, log: o.Logger, fixed: Kind(cfg.Kind),
		reason: ReasonStopped, follow: map[string]*follower{}}
	if s.client == nil {
		s.client = &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			MaxIdleConns: 2, IdleConnTimeout: 2 * cfg.Interval, ResponseHeaderTimeout: cfg.Timeout},
			// A redirect is not followed: its target is not the engine.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.kind = s.fixed
	s.failures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_engine_scrape_failures_total",
		Help: "Scrapes of the engine's metrics that failed, by reason (timeout, connect, http_3xx, http_4xx, http_5xx, parse, too_large, no_metrics)."}, []string{"reason"})
	for _, r := range failureReasons {
		s.failures.WithLabelValues(r)
	}
	if o.Registry != nil {
		o.Registry.MustRegister(s.failures, &collector{s: s})
		if cfg.Passthrough {
			o.Registry.MustRegister(&passthrough{s: s})
		}
	}
	return s
}

// Interval is the scrape interval.
func (s *Scraper) Interval() time.Duration { return s.cfg.Interval }

// Run scrapes now and every interval until ctx is done.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.Scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scrape scrapes once, within the timeout, and records the result.
func (s *Scraper) Scrape(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	start := time.Now()
	res := s.fetch(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.duration = time.Since(start).Seconds()
	if res.reason != ReasonOK && res.reason != ReasonAPIPS {
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) && res.reason != ReasonTimeout {
			return // shutting down: not a failure of the engine
		}
		s.failures.WithLabelValues(res.reason).Inc()
		s.reason, s.snap = res.reason, nil
		s.say(res)
		return
	}
	if s.fixed == Unknown && res.kind == Unknown {
		res.kind = Detect(res.fams)
		if res.kind == Unknown && !s.unknown {
			s.unknown = true
			s.log.Warn("engine metrics: the names match no known engine (vllm:, sglang:, tgi_, llamacpp:, trtllm_, dynamo_); set engine.kind to map them",
				"url", s.url(res.path))
		}
	}
	kind := s.fixed
	if kind == Unknown {
		kind = res.kind
	}
	s.kind, s.reason = kind, res.reason
	if s.cfg.Path == "" {
		s.path = res.path
	}
	snap := res.snap
	if snap == nil {
		snap = Normalise(kind, res.fams)
	}
	s.snap = snap
	for _, c := range []string{sPreemptions, sRejected, sAborted} {
		if v, ok := snap.Values[c]; ok {
			f := s.follow[c]
			if f == nil {
				f = &follower{}
				s.follow[c] = f
			}
			f.observe(v)
		}
	}
	s.prefix.observe(snap)
	smp := sample{t: res.at, preempt: math.NaN(), running: math.NaN(), waiting: math.NaN(), kv: math.NaN()}
	if f := s.follow[sPreemptions]; f != nil && f.seen {
		if _, ok := snap.Values[sPreemptions]; ok {
			smp.preempt = f.total
		}
	}
	for p, series := range map[*float64]string{&smp.running: sRunning, &smp.waiting: sWaiting, &smp.kv: sKVUsage} {
		if v, ok := snap.Values[series]; ok {
			*p = v
		}
	}
	s.hist.add(smp)
	if s.cfg.Passthrough {
		s.pass = passable(res.fams, s.log)
	}
	s.say(res)
}

// say logs a change of state, once: the engine reached or lost.
func (s *Scraper) say(res result) {
	state := res.reason
	if state == s.said {
		return
	}
	prev := s.said
	s.said = state
	switch state {
	case ReasonOK:
		s.log.Info("engine metrics scraped", "engine", s.kind.Label(), "url", s.url(res.path), "interval", s.cfg.Interval)
	case ReasonAPIPS:
		s.log.Info("engine has no Prometheus metrics; reading loaded models and VRAM from /api/ps (Ollama)", "url", s.url(res.path))
	default:
		lvl := slog.LevelWarn
		switch {
		case s.cfg.Enabled == "on":
			lvl = slog.LevelError
		case state == ReasonNoMetrics && prev == "":
			lvl = slog.LevelInfo
		}
		msg := "engine metrics unavailable; tokentap_engine_up is 0 until they come back"
		if state == ReasonNoMetrics {
			msg = "the engine exposes no metrics (no /metrics, /prometheus/metrics or /api/ps): engine signals are off; set engine.path, or engine.enabled: off to stop trying"
		}
		s.log.Log(context.Background(), lvl, msg, "reason", state, "err", res.err, "upstream", s.base.Redacted())
	}
}

func (s *Scraper) url(path string) string { return s.base.JoinPath(path).Redacted() }

// result is what one fetch found.
type result struct {
	reason string
	err    error
	path   string
	at     time.Time // when the engine answered: the sample's instant
	fams   map[string]*dto.MetricFamily
	kind   Kind
	snap   *Snapshot // set when the fetch normalised already (Ollama)
}

// fetch tries the configured path, the path found before, or each
// candidate in turn.
func (s *Scraper) fetch(ctx context.Context) result {
	s.mu.Lock()
	paths := []string{s.cfg.Path}
	detecting := false
	switch {
	case s.cfg.Path != "":
	case s.path != "":
		paths = []string{s.path}
	default:
		paths, detecting = []string{"/metrics", "/prometheus/metrics", "/api/ps"}, true
	}
	s.mu.Unlock()
	var last result
	for _, p := range paths {
		r := s.get(ctx, p)
		absent := r.reason == ReasonHTTP4xx || r.reason == ReasonHTTP3xx
		if absent && detecting {
			last = r
			continue
		}
		if absent && s.cfg.Path == "" {
			s.mu.Lock()
			s.path = "" // the endpoint went away: detect again next time
			s.mu.Unlock()
		}
		return r
	}
	last.reason = ReasonNoMetrics
	return last
}

func (s *Scraper) get(ctx context.Context, path string) result {
	r := result{path: path}
	u := s.base.JoinPath(path)
	u.RawQuery = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		r.reason, r.err = ReasonConnect, err
		return r
	}
	req.Header.Set("Accept", accept)
	if path == "/api/ps" {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", "tokentap-engine-scraper")
	resp, err := s.client.Do(req)
	if err != nil {
		r.reason, r.err = ReasonConnect, err
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			r.reason = ReasonTimeout
		}
		return r
	}
	defer resp.Body.Close()
	r.at = time.Now()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		r.reason, r.err = ReasonHTTP5xx, fmt.Errorf("%s answered %s", path, resp.Status)
		switch {
		case resp.StatusCode < 400:
			r.reason = ReasonHTTP3xx
		case resp.StatusCode < 500:
			r.reason = ReasonHTTP4xx
		}
		return r
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	switch {
	case err != nil:
		r.reason, r.err = ReasonConnect, err
		if isTimeout(err) || errors.Is(err, context.DeadlineExceeded) {
			r.reason = ReasonTimeout
		}
		return r
	case len(body) > MaxBody:
		r.reason, r.err = ReasonTooLarge, fmt.Errorf("%s: body over %d bytes", path, MaxBody)
		return r
	case path != "/api/ps" && expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeProtoDelim && bytes.Count(body, []byte{'\n'}) > MaxLines:
		r.reason, r.err = ReasonTooLarge, fmt.Errorf("%s: body over %d lines", path, MaxLines)
		return r
	}
	if path == "/api/ps" {
		snap, err := parseOllamaPS(body)
		if err != nil {
			r.reason, r.err = ReasonHTTP4xx, err // not Ollama: treated as absent
			return r
		}
		r.reason, r.kind, r.snap = ReasonAPIPS, Ollama, snap
		return r
	}
	r.fams, err = Parse(body, resp.Header)
	if err != nil {
		r.reason, r.err = ReasonParse, err
		return r
	}
	r.reason = ReasonOK
	return r
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Parse decodes an exposition in the format its Content-Type header
// names: OpenMetrics 1.0 or 0.0.1, delimited protobuf, or (anything else)
// the Prometheus text format. Names are validated as UTF-8 (legacy names
// are a subset), so that one unusual name does not fail a whole scrape.
// OpenMetrics counter families are named as on the wire, with _total.
func Parse(body []byte, h http.Header) (map[string]*dto.MetricFamily, error) {
	f := expfmt.ResponseFormat(h)
	switch f.FormatType() {
	case expfmt.TypeOpenMetrics, expfmt.TypeProtoDelim:
		dec := expfmt.NewDecoder(bytes.NewReader(body), f.WithEscapingScheme(model.NoEscaping))
		fams := map[string]*dto.MetricFamily{}
		for {
			mf := &dto.MetricFamily{}
			err := dec.Decode(mf)
			if errors.Is(err, io.EOF) {
				return fams, nil
			}
			if err != nil {
				return nil, err
			}
			if f.FormatType() == expfmt.TypeOpenMetrics && mf.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(mf.GetName(), "_total") {
				mf.Name = new(mf.GetName() + "_total")
			}
			fams[mf.GetName()] = mf
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(body))
}

// parseOllamaPS reads Ollama's /api/ps: the models loaded and the VRAM
// they hold.
func parseOllamaPS(body []byte) (*Snapshot, error) {
	var ps struct {
		Models *[]struct {
			SizeVRAM float64 `json:"size_vram"`
		} `json:"models"`
	}
	if err := json.Unmarshal(body, &ps); err != nil || ps.Models == nil {
		return nil, fmt.Errorf("/api/ps: not Ollama's answer (no models list)")
	}
	vram := 0.0
	for _, m := range *ps.Models {
		vram += m.SizeVRAM
	}
	return &Snapshot{Kind: Ollama, Values: map[string]float64{sModelsLoaded: float64(len(*ps.Models)), sVRAMBytes: vram},
		Histograms: map[string]*Histogram{}}, nil
}

// follower follows an engine counter: its total is the engine's value
// when first seen plus every increase since; a decrease is the engine's
// restart, after which the new value is all increase.
type follower struct {
	last, total float64
	seen        bool
}

func (f *follower) observe(v float64) {
	switch {
	case !f.seen:
		f.total, f.seen = v, true
	case v >= f.last:
		f.total += v - f.last
	default:
		f.total += v
	}
	f.last = v
}

// prefixRatio derives the prefix-cache hit ratio from vLLM's hit and
// query counters over the last scrape interval (the ratio of the
// increases); with no query in the interval the previous ratio stays.
// Engines that export a ratio give it directly.
type prefixRatio struct {
	hits, queries float64
	seen          bool
	ratio         float64
	have          bool
}

func (p *prefixRatio) observe(s *Snapshot) {
	if v, ok := s.Values[sPrefixHitRatio]; ok {
		p.ratio, p.have = v, true
		return
	}
	h, ok1 := s.Values[sPrefixHits]
	q, ok2 := s.Values[sPrefixQueries]
	if !ok1 || !ok2 {
		return
	}
	if p.seen && q > p.queries && h >= p.hits {
		p.ratio, p.have = math.Min(1, (h-p.hits)/(q-p.queries)), true
	} else if !p.seen && q > 0 {
		p.ratio, p.have = math.Min(1, h/q), true
	}
	p.hits, p.queries, p.seen = h, q, true
}
