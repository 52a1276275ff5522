// Package upstream is what the sidecar knows about the engine behind it,
// and the one place that asks the engine for it: its health endpoint
// (found when not configured; /readyz and tokentap_upstream_up), what
// engine it is (engine.Identify; the proxy's route classification and
// tokentap_upstream_info) and the models it serves (the model-label
// bound). Every request goes through one http.Client (Client), which
// puts the upstream URL's credentials on each; the engine metrics
// scraper uses it too. One poll loop (Run) asks on a schedule, and a GET
// that several polls need in the same round is made once
// (docs/design.md, "Packages and their direction").
package upstream

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure an Upstream.
type Options struct {
	// URL is the engine's base URL. Credentials in it (user:password@)
	// go on every request of Client as basic auth, and nowhere else.
	URL *url.URL
	// HealthPath is the path the health check asks (GET, 2xx = up); ""
	// or HealthAuto finds it (autoHealthPaths).
	HealthPath string
	// Kind is the configured engine kind (engine.kind), used as it is;
	// "" or "auto" detects it.
	Kind string
	// Registry receives tokentap_upstream_info; nil: not exported.
	Registry prometheus.Registerer
	// SetUp is told the result of every health check made (not of
	// those answered from the last second's); nil: nobody.
	SetUp func(up bool)
	// SetModels is told the engine's model names each time they are
	// read; nil: nobody.
	SetModels func(names []string)
	// Logger; nil: discard.
	Logger *slog.Logger
	// Transport carries every request; nil: a transport of its own that
	// ignores HTTP_PROXY, as the proxy's does.
	Transport http.RoundTripper
	// Via, when set, is the sidecar's pseudonym in the Via header
	// (proxy.Options.Via): every request of Client carries it, so that
	// an upstream that leads back to the sidecar answers the poll 508
	// at once instead of forwarding it again. "": no Via.
	Via string
}

// Upstream asks one engine. Create it with New; its methods are safe for
// concurrent use.
type Upstream struct {
	base      url.URL // without credentials
	client    *http.Client
	log       *slog.Logger
	fixed     string // the configured engine kind; "" detects
	setUp     func(bool)
	setModels func([]string)
	info      *prometheus.GaugeVec
	health    health
}

// New returns an Upstream of o.URL and registers its series. It asks
// nothing until Run, or a health check through Readiness.
func New(o Options) *Upstream {
	u := &Upstream{base: *o.URL, log: o.Logger, setUp: o.SetUp, setModels: o.SetModels}
	u.base.User = nil
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	if o.Kind != "auto" {
		u.fixed = o.Kind
	}
	rt := o.Transport
	if rt == nil {
		rt = &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: 5 * time.Second, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}
	}
	if o.URL.User != nil {
		pw, _ := o.URL.User.Password()
		rt = &basicAuth{next: rt, host: o.URL.Host,
			auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(o.URL.User.Username()+":"+pw))}
	}
	if o.Via != "" {
		rt = &viaHeader{next: rt, via: "1.1 " + o.Via}
	}
	// A redirect is never followed: its target is not the engine, and a
	// health check answered by another host says nothing of this one. The
	// 3xx itself is the answer (not ready; docs/measurement.md §3).
	u.client = &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	u.health.path = o.HealthPath
	if u.health.path == "" || u.health.path == HealthAuto {
		u.health.auto, u.health.path = true, ""
	}
	u.info = newInfo(o.Registry)
	return u
}

// Client is the one client for the engine: the polls' and the engine
// metrics scraper's. It adds the URL's credentials to every request to
// the engine's host that has no Authorization header.
func (u *Upstream) Client() *http.Client { return u.client }

// URL is the engine's base URL without its credentials (Client adds
// them).
func (u *Upstream) URL() *url.URL {
	c := u.base
	return &c
}

// basicAuth puts the upstream URL's credentials on requests to its host
// (not on a redirect elsewhere).
type basicAuth struct {
	next http.RoundTripper
	host string
	auth string
}

func (b *basicAuth) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == b.host && req.Header.Get("Authorization") == "" {
		req = req.Clone(req.Context()) // a RoundTripper must not modify its request
		req.Header.Set("Authorization", b.auth)
	}
	return b.next.RoundTrip(req)
}

// viaHeader adds the sidecar's hop to every request (Options.Via).
type viaHeader struct {
	next http.RoundTripper
	via  string
}

func (v *viaHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context()) // a RoundTripper must not modify its request
	req.Header.Add("Via", v.via)
	return v.next.RoundTrip(req)
}

func (u *Upstream) url(path string) string { return u.base.JoinPath(path).String() }

// How often, and within what, each poll asks.
const (
	healthEvery   = 5 * time.Second // tokentap_upstream_up stays current when nothing asks /readyz
	healthTimeout = 2 * time.Second
	healthCache   = time.Second // /readyz answers from the last check this recent
	detectTimeout = 2 * time.Second
	detectRetry   = 2 * time.Second  // while the engine answers nothing,
	detectPatient = time.Minute      // for the first minute,
	detectLate    = 30 * time.Second // then this
	modelsEvery   = time.Minute
	modelsTimeout = 5 * time.Second
)

// Bounds on what a GET reads of a body: a health check's reason quotes
// its start; a JSON answer (detection, the model list) past the bound
// fails to decode.
const (
	healthBody = 64 << 10
	jsonBody   = 1 << 20
)

// answer is one GET's outcome.
type answer struct {
	err    error
	status int
	line   string // "404 Not Found"
	body   []byte // at most limit bytes
	limit  int    // how much was read at most
	whole  bool   // body is the whole body
}

func (u *Upstream) get(ctx context.Context, path string, timeout time.Duration, limit int) answer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url(path), nil)
	if err != nil {
		return answer{err: err}
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	a := answer{status: resp.StatusCode, line: resp.Status, body: b, limit: limit, whole: err == nil && len(b) <= limit}
	if len(b) > limit {
		a.body = b[:limit]
	}
	return a
}

// round is one pass of the poll loop (or one /readyz check): an answer
// one poll got is given to the next poll that asks the same path within
// the round, when it read enough of the body.
type round struct {
	u   *Upstream
	ctx context.Context
	got map[string]answer
}

func (u *Upstream) round(ctx context.Context) *round {
	return &round{u: u, ctx: ctx, got: map[string]answer{}}
}

func (r *round) get(path string, timeout time.Duration, limit int) answer {
	if a, ok := r.got[path]; ok && (a.whole || a.limit >= limit) {
		if len(a.body) > limit {
			a.body, a.whole = a.body[:limit], false
		}
		return a
	}
	a := r.u.get(r.ctx, path, timeout, limit)
	if a.err == nil {
		r.got[path] = a
	}
	return a
}

// poll is one thing the loop asks on a schedule: run does it and returns
// when it is due next, or the zero time when it is done for good.
type poll struct {
	due time.Time
	run func(r *round, now time.Time) (next time.Time)
}

// Run polls the engine until ctx is done. Each round runs every poll
// that is due, health check first: the health check every 5 s (so that
// tokentap_upstream_up is current when nothing asks /readyz), engine
// detection until the engine answers (every 2 s, every 30 s after the
// first minute; never when Options.Kind is set), the model list at once
// and every minute. setEngine (nil: nobody) is told the engine's kind
// once it is known.
func (u *Upstream) Run(ctx context.Context, setEngine func(kind string)) {
	if setEngine == nil {
		setEngine = func(string) {}
	}
	u.announce()
	start := time.Now()
	polls := []*poll{{run: func(r *round, now time.Time) time.Time {
		u.check(r)
		return now.Add(healthEvery)
	}}}
	if !u.fixKind(setEngine) {
		polls = append(polls, &poll{run: func(r *round, _ time.Time) time.Time {
			if u.detect(r, setEngine) {
				return time.Time{}
			}
			if time.Since(start) > detectPatient {
				return time.Now().Add(detectLate)
			}
			return time.Now().Add(detectRetry)
		}})
	}
	polls = append(polls, &poll{run: func(r *round, now time.Time) time.Time {
		u.refreshModels(r)
		return now.Add(modelsEvery)
	}})
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		now := time.Now()
		r := u.round(ctx)
		var next time.Time
		live := polls[:0]
		for _, p := range polls {
			if !p.due.After(now) {
				if p.due = p.run(r, now); p.due.IsZero() {
					continue
				}
			}
			live = append(live, p)
			if next.IsZero() || p.due.Before(next) {
				next = p.due
			}
		}
		polls = live
		timer.Reset(time.Until(next))
	}
}
