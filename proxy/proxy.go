// Package proxy is the sidecar's data path: a reverse proxy, built on
// net/http/httputil.ReverseProxy, that forwards every byte between a client
// and an inference engine unchanged while a tap on the response body times
// every protocol event and fills one record.Record per request.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Options configures a Proxy.
type Options struct {
	// Upstream is the engine's base URL. Required.
	Upstream *url.URL
	// Transport carries requests to the upstream. Nil means a transport
	// tuned for one upstream (see NewTransport).
	Transport http.RoundTripper
	// EventLoop relays streamed answers on the event loop (evloop.go): a
	// streamed request to an http:// upstream over HTTP/1.1 from a TCP
	// client goes over a connection of the relay's transport
	// (directTransport, kept alive between answers), and its answer's
	// body is read with read(2) and written with write(2) on Go's
	// poller, not by net/http, at less CPU per token event
	// (docs/performance.md). The server must keep its connections in its
	// requests' context (ConnContext). False (the zero value) keeps
	// every request on net/http's path, as does a system other than
	// Linux. A Transport of the caller's carries every request: the
	// loop applies with the proxy's own (Transport nil).
	EventLoop bool
	// Pipeline is told about every request at arrival and, with its
	// finished record, at the end. Nil means a pipeline with no stage:
	// nothing is observed or kept.
	Pipeline *pipeline.Pipeline
	// Clock times everything. Nil means the system clock.
	Clock record.Clock
	// Logger logs proxy errors. Nil discards them.
	Logger *slog.Logger
	// InjectUsage asks the engine for the usage chunk when a streaming
	// client did not, and removes that chunk from the client's stream, so
	// that output token counts are exact. False leaves requests untouched.
	InjectUsage bool
	// PeekBytes bounds the request body read before forwarding to find
	// model, stream and max_tokens. Zero means 1 MiB. A larger body is
	// streamed and read best-effort, and its usage is not injected.
	PeekBytes int
	// PeekBudget bounds the bytes every peek holds at once, shared by
	// the proxies given the same one (PeekBudget). Nil: no shared bound;
	// each peek still grows only with the bytes its client sent.
	PeekBudget *PeekBudget
	// MaxParseBytes bounds a non-streaming response body kept for parsing
	// usage. Zero means 4 MiB. A larger body is forwarded, not parsed.
	MaxParseBytes int
	// Timeout bounds a whole request, stream included (a request's Hook
	// may set its own); when it fires the
	// request's outcome is "timeout". A request that switches protocols
	// (a WebSocket) is bounded only until its 101: the session that
	// follows is the client's, as long as either side keeps it. Zero
	// means no timeout.
	Timeout time.Duration
	// BodyReadTimeout cuts a client whose request body sends nothing for
	// that long (408, recorded as an http_4xx error); it never applies
	// once the body is read. Zero means no bound, and no BodyMinRate.
	BodyReadTimeout time.Duration
	// BodyMinRate, bytes per second, cuts a client whose request body
	// falls behind it after its first BodyReadTimeout (408, as an idle
	// body; idleBody): a body trickled a byte at a time, which the idle
	// bound alone never cuts. Zero means no minimum rate.
	BodyMinRate int64
	// Traffic labels the records and metrics. Empty means "live".
	Traffic string
	// NextID, if set, gives each record its id: the canary prober shares
	// one sequence across the proxies it builds (one per target). Nil:
	// this proxy's random prefix and sequence number.
	NextID func() string
	// Engine is the engine's kind when it is known in advance (EngineTGI,
	// EngineLlamaCpp, ...; see SetEngine): two routes mean different
	// things on different engines (classify). "" means unknown.
	Engine string
	// ProbeHeader, when set, marks requests that carry it with this exact
	// value as the sidecar's own probes passing through: the header is
	// removed and the request is forwarded without being recorded (the
	// probe records it itself), so canary traffic never mixes into live
	// series.
	ProbeHeader string
	// Target and TargetRule label an egress proxy's records: the hosted
	// API's host and the intercept allow-list entry it matched
	// (record.Target, record.TargetRule; package egress). "" for the
	// reverse proxy.
	Target, TargetRule string
	// Ends, if set, runs each request's end-of-request stages (the
	// pipeline's End: SLO verdicts, spans, metrics, sinks) on a goroutine
	// of their own, after the handler has returned, so that the client's
	// response completes first; they are counted in Ends, and shutdown
	// waits for them with Ends.Wait. Several proxies may share one. Nil
	// runs them before ServeHTTP returns (the canary probe reads its
	// check's result then).
	Ends *Ends
	// Tenants, if set, identifies each request's tenant from its headers
	// once, at arrival (record.Record.Tenant; the pipeline bounds it at
	// the end). Nil: no tenant.
	Tenants Tenants
	// Structure, if set, checks the structure of the answers to requests
	// that declare tools or a JSON output (docs/slo.md, "Structure"):
	// record.Record.Structure. The check runs with the end stages, after
	// the client's response is complete. Nil checks nothing and keeps
	// nothing.
	Structure Structure
	// Via is this sidecar's pseudonym in the Via header
	// ("tokentap-<instance id>", one per process, shared by its
	// proxies): every forwarded request carries it, and a request that
	// arrives with it is a loop, answered 508 and recorded as
	// error/loop_detected (loop.go). "" adds no Via and detects nothing.
	Via string
}

// Tenants identifies a request's tenant (tenant.Resolver): a declared
// name, a keyed hash of its header or API key, or "_none"; never the
// value read.
type Tenants interface {
	Identify(r *http.Request, api string) string
}

// Proxy is an http.Handler. Create it with New.
type Proxy struct {
	opts  Options
	rp    *httputil.ReverseProxy
	clock record.Clock
	log   *slog.Logger
	seq   atomic.Uint64
	idpfx string
	// engine is the detected engine kind (SetEngine), read once per
	// request.
	engine atomic.Pointer[string]

	inflight inflight
	loopLog  atomic.Int64 // unix nanos before which no loop is logged
	loops    *evloops     // Options.EventLoop's; nil without it
}

// NewTransport returns the transport used when Options.Transport is nil:
// keep-alive connections to one upstream, no transparent compression (the
// client's Accept-Encoding is forwarded as it came, and nothing is asked
// for in its place), HTTP/1.1.
//
// Design note: each upstream connection holds a read and a write buffer
// for as long as it lives, one connection per stream in flight. They are
// 2 KiB here, not net/http's 4 KiB: a token event is a few hundred bytes,
// a read the copy loop asks for that is at least the buffer's size goes
// straight into the copy buffer (bufio.Reader.Read), and a request is
// written once per request. At 1,000 streams that is 4 MiB less
// (docs/performance.md).
func NewTransport() *http.Transport {
	return &http.Transport{
		ReadBufferSize:      transportBufSize,
		WriteBufferSize:     transportBufSize,
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// transportBufSize is the size of each upstream connection's read and
// write buffers (NewTransport).
const transportBufSize = 2 << 10

// New returns a proxy to opts.Upstream.
func New(opts Options) (*Proxy, error) {
	if opts.Upstream == nil || opts.Upstream.Host == "" {
		return nil, errors.New("proxy: an upstream URL with a host is required")
	}
	own := opts.Transport == nil
	if own {
		opts.Transport = NewTransport()
	}
	if opts.Pipeline == nil {
		opts.Pipeline = pipeline.New(pipeline.Options{})
	}
	if opts.Clock == nil {
		opts.Clock = record.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PeekBytes <= 0 {
		opts.PeekBytes = 1 << 20
	}
	if opts.MaxParseBytes <= 0 {
		opts.MaxParseBytes = 4 << 20
	}
	if opts.Traffic == "" {
		opts.Traffic = "live"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	p := &Proxy{opts: opts, clock: opts.Clock, log: opts.Logger, idpfx: hex.EncodeToString(b[:])}
	p.SetEngine(opts.Engine)
	up := opts.Upstream
	basic := basicAuth(up)
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up) // the URL's user and password are not copied: basic
			pr.Out.Host = up.Host
			p.addVia(pr.In, pr.Out.Header)
			if basic != "" && len(pr.Out.Header["Authorization"]) == 0 {
				pr.Out.Header["Authorization"] = []string{basic}
			}
			// Our client span's context replaces the client's traceparent
			// (which is its parent's), so the engine's spans join under it.
			p.opts.Pipeline.Inject(pr.Out.Context(), pr.Out.Header)
		},
		Transport:      opts.Transport,
		FlushInterval:  -1, // flush after every write, whatever the content type
		BufferPool:     copyBuffers{},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		ErrorLog:       slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
	}
	if opts.EventLoop && own {
		p.loops = &evloops{}
		p.rp.Transport = &directTransport{next: opts.Transport, dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}}
	}
	return p, nil
}

// basicAuth is the Authorization header value for the credentials in the
// upstream URL (http://user:pass@host), or "" when it has none. Proxied
// requests carry it unless the client sent an Authorization of its own,
// as the sidecar's own calls to the engine (health, models, metrics) do.
func basicAuth(u *url.URL) string {
	if u.User == nil {
		return ""
	}
	pw, _ := u.User.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
}

// SetEngine tells the proxy which engine it is in front of (the kind app
// detects at startup; "" for unknown). Safe to call while serving.
func (p *Proxy) SetEngine(kind string) { p.engine.Store(&kind) }

func (p *Proxy) engineKind() string {
	if k := p.engine.Load(); k != nil {
		return *k
	}
	return ""
}

// ProbeHeaderName carries Options.ProbeHeader on the sidecar's own probes.
const ProbeHeaderName = "X-Tokentap-Probe"

// MaxHeaderBytes bounds a proxied request's line and headers together,
// for the servers in front of a Proxy (http.Server.MaxHeaderBytes;
// net/http allows 4 KiB more and answers 431 past that, an over-long URI
// included): 64 KiB, far above what an LLM client sends, so that a
// client cannot push a megabyte of headers (or 10,000 of them) through
// to the upstream (docs/config.md).
const MaxHeaderBytes = 64 << 10

type stateKey struct{}

// reqState is one request in flight. It is used by one goroutine at a
// time (the handler's), except phases, whose hooks the transport calls
// on its own goroutines (phases.go).
type reqState struct {
	rec       *record.Record
	obs       *pipeline.Request
	clock     record.Clock
	clientCtx context.Context
	ctx       context.Context
	info      requestInfo
	injected  bool
	tap       *tap
	page      bool // an answer status to a generation request came with a web page (text/html)
	handled   bool // the error handler answered
	finished  bool
	// answered: a status line has been written to the client (or
	// ReverseProxy is about to write the upstream's), so a later failure
	// can only cut the connection. internal: the request panicked
	// (settle); its outcome is error, type internal.
	answered, internal bool
	// staged: the end stages have the record (it is no longer written).
	staged bool
	// arrive is when the request arrived (the record's Arrive, also when
	// no record could be made).
	arrive time.Time
	body   *idleBody // the client's body under BodyReadTimeout, or nil
	// phases follows the upstream request through httptrace: the record's
	// connection phases, when it was written, and the upstream connection
	// of a request that asks to switch protocols (for its half-close).
	phases phases
	// upgrade is the spliced upstream connection once the upstream
	// switched protocols (a 101); nil otherwise.
	upgrade *upstreamConn
	// cut ends the upstream request's context (with a cause); cancel, if
	// not nil, releases the request timeout's.
	cut    context.CancelCauseFunc
	cancel context.CancelFunc
	// hook is the request's Hook over the proxy's options (hook).
	hook Hook
	// switchTimer is the timeout of a request that asks to switch
	// protocols, stopped when the upstream switches; nil otherwise.
	switchTimer *time.Timer
	// direct: an event loop may carry the answer (directable), over a
	// connection of the request's own (directTransport); w and client
	// are what the loop writes to (offload).
	direct bool
	w      http.ResponseWriter
	client clientConn
}

// ServeHTTP proxies one request.
//
// Design note: the set-up of a request (prepare, begin) and its end run
// on a goroutine of their own (onOwnStack), not on the connection's. A
// goroutine's stack doubles when a call goes deeper than it holds, and
// the garbage collector halves it again only when less than a quarter is
// in use. The set-up and the end go deep (encoding/json reading the body,
// the OTel SDK starting and ending spans: past 8 KiB with the handler's
// frames under them), while a stream, for its whole life, keeps 5-6 KiB
// of the connection goroutine's stack in use (net/http's server loop,
// ReverseProxy's copy loop, the tap, the upstream read). Run on that
// goroutine, the deep calls left every stream in flight, and every
// keep-alive connection after its first request, with a 16 KiB stack
// that never shrank; run apart, the connection's stack stays at 8 KiB.
// The cost is two goroutine starts per request, three with Options.Ends
// (the end stages run on a third, after the response).
// TestStackPerStream (app) holds the bound; docs/performance.md has the
// memory per stream.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 2 && r.Method == "PRI" { // an h2c preface read as HTTP/1
		refuseH2C(w)
		return
	}
	declineH2C(r)
	if p.opts.ProbeHeader != "" {
		if v := r.Header.Get(ProbeHeaderName); v != "" {
			r.Header.Del(ProbeHeaderName)
			if v == p.opts.ProbeHeader { // our own probe: it records itself
				p.rp.ServeHTTP(w, r)
				return
			}
		}
	}
	h := p.hook(r)
	if p.refuseLoop(w, r, h) {
		return
	}
	st := &reqState{clock: p.clock, arrive: p.clock.Now(), hook: h, w: w}
	defer p.settle(w, r, st) // also when ReverseProxy panics with http.ErrAbortHandler
	var out *http.Request
	onOwnStack(func() {
		if start, ok := p.prepare(st, w, r); ok {
			out = p.begin(st, r, &start)
		}
	})
	if out == nil {
		return // answered already: the client's body broke
	}
	p.rp.ServeHTTP(w, out)
}

// settle ends a request (end) when its handler returns or panics, and
// turns a panic into an answer, a record and a count (internalError):
// every request leaves with an answer and a record. It is ServeHTTP's
// deferred call, so that recover sees the handler's panic.
// http.ErrAbortHandler (ReverseProxy's, when writing to the client
// failed) is no internal error: it is raised again once the request is
// recorded, as is one after a status was written, so that net/http cuts
// the connection rather than end a cut answer cleanly.
func (p *Proxy) settle(w http.ResponseWriter, r *http.Request, st *reqState) {
	v := recover()
	abort := v == http.ErrAbortHandler
	if v != nil && !abort {
		abort = p.internalError(w, st, v, InternalRequest)
	}
	if !st.staged {
		if e := caught(func() { p.endAfter(r, st) }); e != nil {
			// The answer is what it was (the end comes after it): counted
			// and logged, never cut for the sidecar's bookkeeping.
			p.internalError(w, st, e, InternalEnd)
			if !st.staged { // the record never reached the stages: it still does
				if e := caught(func() { p.stageUnended(r, st) }); e != nil {
					p.log.Error("request panicked again", "id", st.rec.ID, "panic", e)
				}
			}
		}
	}
	if abort {
		panic(http.ErrAbortHandler)
	}
}

// The values of tokentap_internal_errors_total's where label
// (docs/metrics.md): where a panic the proxy recovered from was raised.
const (
	InternalRequest = "request" // preparing, forwarding or answering a request
	InternalEnd     = "end"     // settling its record or running its end stages
)

// caught runs fn and returns what it panicked with, nil if it did not.
func caught(fn func()) (v any) {
	defer func() { v = recover() }()
	fn()
	return nil
}

// internalError handles a panic v raised while serving a request: it is
// logged at error with its stack and counted (Pipeline.InternalError),
// the request is marked so that its record says error, type internal,
// and, when no status was written yet, the client is answered 502 as a
// ReverseProxy answers an upstream failure. It reports whether a status
// had been written already: the connection must then be cut.
func (p *Proxy) internalError(w http.ResponseWriter, st *reqState, v any, where string) (abort bool) {
	id := ""
	if st.rec != nil {
		id = st.rec.ID
	}
	v, stack := panicOf(v)
	p.log.Error("request panicked", "id", id, "where", where, "panic", v, "stack", string(stack))
	p.opts.Pipeline.InternalError(where)
	st.internal = true
	if st.answered {
		return true
	}
	st.answered = true
	const status = http.StatusBadGateway
	if st.rec != nil && !st.staged {
		st.rec.HTTPStatus = status
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"tokentap_%s","code":%d}}`+"\n",
		"tokentap: internal error", record.ErrInternal, status)
	return false
}

// endAfter ends a request whatever stage its set-up reached: one that
// began (begin) ends as always (end); one set up but not begun, or not
// even prepared (it panicked there), still gets its record and end
// stages (stageUnended).
func (p *Proxy) endAfter(r *http.Request, st *reqState) {
	if st.ctx != nil {
		p.end(st)
		return
	}
	p.stageUnended(r, st)
}

// stageUnended settles the record of a request that panicked before its
// end stages had it, and hands it to them: the record made so far, or a
// new one when prepare had made none; the pipeline's request begun now
// when it had not been (a stage's Begin that panics again leaves the
// record to the sinks alone).
func (p *Proxy) stageUnended(r *http.Request, st *reqState) {
	rec := st.rec
	if rec == nil {
		rec = record.New(0)
		rec.Arrive, rec.ID, rec.Traffic = st.arrive, p.nextID(), p.opts.Traffic
		if st.info.API != nil { // nil: it panicked before its route was classified
			rec.API = st.info.API.Name
		}
		rec.Target, rec.TargetRule = p.opts.Target, p.opts.TargetRule
		st.rec = rec
	}
	rec.Outcome, rec.ErrorType = record.Error, record.ErrInternal
	if rec.Terminal.IsZero() {
		rec.Terminal = p.clock.Now()
	}
	st.finished = true
	if st.obs == nil {
		if v := caught(func() {
			_, st.obs = p.opts.Pipeline.Begin(r.Context(), rec, pipeline.Start{
				Key:          record.Key{API: rec.API, Model: rec.Model, Traffic: p.opts.Traffic, Probe: st.hook.Probe},
				PromptTokens: -1, Check: st.hook.Check})
		}); v != nil {
			p.log.Error("request panicked again", "id", rec.ID, "panic", v)
			st.staged = true
			p.opts.Pipeline.Record(rec)
			return
		}
	}
	st.staged = true
	p.endStages(st.obs, rec, nil, nil)
}

// onOwnStack runs fn on a new goroutine and waits for it; a panic in fn
// is raised again in the caller, as a *panicked that keeps the stack it
// was raised on. See ServeHTTP's design note.
func onOwnStack(fn func()) {
	var caught *panicked
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				caught = &panicked{v: v, stack: debug.Stack()}
			}
		}()
		fn()
	}()
	<-done
	if caught != nil {
		panic(caught)
	}
}

// panicOf returns a recovered panic's value and the stack it was raised
// on: a panic carried across goroutines (onOwnStack) or raised again by
// the end stages once the record went through them (pipeline.StagePanic)
// keeps its own; for any other, the stack is taken here.
func panicOf(v any) (any, []byte) {
	var stack []byte
	if o, ok := v.(*panicked); ok {
		v, stack = o.v, o.stack
	}
	if s, ok := v.(pipeline.StagePanic); ok {
		v, stack = s.Value, s.Stack
	}
	if stack == nil {
		stack = debug.Stack()
	}
	return v, stack
}

// panicked is a panic raised on another goroutine (onOwnStack): its
// value and the stack it was raised on, for the log.
type panicked struct {
	v     any
	stack []byte
}

// prepare reads what the proxy needs of a request's body, injects the
// usage request, and fills st: its record, and the pipeline's start. ok
// false means it answered the client itself and the request is over.
func (p *Proxy) prepare(st *reqState, w http.ResponseWriter, r *http.Request) (start pipeline.Start, ok bool) {
	arrive := st.arrive
	api := classify(r, p.engineKind())
	info := requestInfo{API: api}
	st.info.API = api
	var idle *idleBody
	if p.opts.BodyReadTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		idle = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), d: p.opts.BodyReadTimeout, rate: p.opts.BodyMinRate}
		r.Body = idle
	}
	var (
		whole     []byte
		rewritten *splicedBody
	)
	if api != stream.APIOther {
		in, peeked, body, err := peek(r.Body, api, r.URL.Path, p.opts.PeekBytes, r.ContentLength, p.opts.Structure != nil, p.opts.PeekBudget)
		whole = peeked
		if err != nil {
			// The client's body broke while we read it: nothing can be forwarded.
			rec := record.New(0)
			rec.Arrive, rec.ID, rec.Traffic, rec.API = arrive, p.nextID(), p.opts.Traffic, api.Name
			rec.Target, rec.TargetRule = p.opts.Target, p.opts.TargetRule
			st.rec = rec
			rec.Tenant = p.tenant(r, api.Name)
			_, q := p.opts.Pipeline.Begin(r.Context(), rec, pipeline.Start{Key: record.Key{API: api.Name, Traffic: p.opts.Traffic, Probe: st.hook.Probe},
				PromptTokens: -1, Check: st.hook.Check})
			rec.Outcome, rec.ErrorType, rec.Terminal = record.Cancelled, record.ErrCancelled, p.clock.Now()
			// A body that went idle past the bound also ends the request's
			// context (net/http cancels it on any read error): answer 408.
			// A client that went away (or shut its side) mid-body is
			// cancelled, and answered 502 as a ReverseProxy answers a
			// body it could not forward: never net/http's empty 200.
			status := http.StatusBadGateway
			switch {
			case idle.TimedOut():
				status = http.StatusRequestTimeout
			case r.Context().Err() == nil:
				status = http.StatusBadRequest
			}
			if status != http.StatusBadGateway {
				rec.Outcome, rec.ErrorType = record.Error, record.ErrHTTP4xx
			}
			rec.HTTPStatus, st.answered = status, true
			http.Error(w, "tokentap: reading request body: "+err.Error(), status)
			st.obs, st.finished, st.staged = q, true, true
			p.endStages(q, rec, nil, nil)
			return pipeline.Start{}, false
		}
		info, r.Body = in, body
		// The engine is asked for an uncompressed answer when usage is
		// injected; a client that refuses one gets no injection (tap.go,
		// refusesIdentity).
		if p.opts.InjectUsage && injectable(api) && in.Whole && in.Stream && !in.IncludeUsage && !refusesIdentity(r.Header) {
			if nb, err := withUsage(whole, api.Request.Usage); err == nil {
				rewritten = nb
			}
		}
	}
	// Room for the token events, from the client's max_tokens: a claim,
	// bounded before any arithmetic (max_tokens+1 overflowed at 2^63-1).
	hint := 64
	if info.MaxTokens > 0 {
		hint = int(min(info.MaxTokens, record.MaxHint-1)) + 1
	}
	rec := record.New(hint)
	rec.Arrive, rec.ID, rec.Traffic = arrive, p.nextID(), p.opts.Traffic
	rec.Target, rec.TargetRule = p.opts.Target, p.opts.TargetRule
	rec.API, rec.Stream, rec.MaxTokens, rec.RequestRead = info.API.Name, info.Stream, info.MaxTokens, info.Read
	rec.SetModel(info.Model)
	st.rec, st.info = rec, info
	rec.Tenant = p.tenant(r, info.API.Name)
	st.clientCtx, st.body = r.Context(), idle
	start = pipeline.Start{
		Key:      record.Key{API: info.API.Name, Model: rec.Model, Traffic: p.opts.Traffic, Probe: st.hook.Probe},
		HTTP:     r,
		Upstream: p.opts.Upstream,
		Params:   pipeline.Params{MaxTokens: info.MaxTokens, Temperature: info.Temperature, TopP: info.TopP, Seed: info.Seed},
		// The prompt's size in tokens, estimated from the body (4 bytes a
		// token) until usage says; only its prefill weight depends on it.
		PromptTokens: max(r.ContentLength, 0) / 4,
		Check:        st.hook.Check,
		// Its size in bytes, for the slow causes' long prompts: the body
		// read, or the size its header declared when it was not read
		// whole (then at least the peek).
		PromptBytes: max(r.ContentLength, int64(len(whole)), int64(len(info.Prefix))),
	}
	if info.API == stream.APIOther {
		start.PromptTokens = -1 // not understood: no energy share
		start.PromptBytes = 0   // nor a sequence the slow causes track
	}
	if p.opts.Pipeline.Capturing() {
		start.Body = whole
	}
	if p.opts.Pipeline.CapturingWorkload() {
		start.Prompt, start.PromptPartial = whole, !info.Whole
		if whole == nil {
			start.Prompt = info.Prefix
		}
	}
	st.info.Prefix = nil // held by the capture alone, when on
	if rewritten != nil {
		st.injected = true
		rec.UsageInjected = true
		r.Body = rewritten
		r.ContentLength = rewritten.n
		r.Header.Set("Content-Length", strconv.FormatInt(rewritten.n, 10))
		r.Header.Set("Accept-Encoding", "identity") // so that the engine answers uncompressed
	}
	return start, true
}

// tenant is the identity of r's tenant (Options.Tenants), "" with none.
func (p *Proxy) tenant(r *http.Request, api stream.Name) string {
	if p.opts.Tenants == nil {
		return ""
	}
	return p.opts.Tenants.Identify(r, string(api))
}

// begin starts the request's pipeline and its contexts, and returns the
// request to forward.
func (p *Proxy) begin(st *reqState, r *http.Request, start *pipeline.Start) *http.Request {
	ctx, obs := p.opts.Pipeline.Begin(r.Context(), st.rec, *start)
	st.obs = obs
	if st.injected {
		st.obs.UsageInjected()
	}
	ctx = context.WithValue(ctx, stateKey{}, st)
	switching := upgradeType(r.Header) != ""
	switch {
	case st.hook.Timeout > 0 && switching:
		// Bounded until the 101 (upgrade stops the timer), not for the
		// session's life; the cause is the deadline's, as below.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		st.cancel = func() { cancel(nil) }
		st.switchTimer = time.AfterFunc(st.hook.Timeout, func() { cancel(context.DeadlineExceeded) })
	case st.hook.Timeout > 0:
		ctx, st.cancel = context.WithTimeout(ctx, st.hook.Timeout)
	}
	if p.loops != nil {
		st.client = clientSocket(r)
		st.direct = p.directable(st, r, switching)
	}
	st.phases.wroteTo = obs.Sent
	ctx = st.phases.install(ctx, p.clock, switching)
	ctx, st.cut = context.WithCancelCause(ctx)
	st.ctx = ctx
	p.inflight.add(st, st.cut)
	return r.WithContext(ctx)
}

// end ends a request whose response is over, in this order: its record
// settled (finish), its contexts released, the pipeline's end stages
// started (endStages), then its place among those in flight given up,
// so that whoever Waits for the proxy finds the stages already counted
// in Options.Ends. All but the stages are done when end returns; see
// ServeHTTP's design note for why on another goroutine. The body's peek
// goes back to Options.PeekBudget then, or, when a structure check is
// to run, once it has (the declared schemas it reads are in that body).
func (p *Proxy) end(st *reqState) {
	onOwnStack(func() {
		defer p.inflight.remove(st) // after the stages are counted (Wait); also on a panic
		var check func()
		captured := func() (captured []byte) {
			defer func() { p.release(st, check == nil) }() // also when finish panics
			captured, check = p.finish(st)
			return captured
		}()
		if check != nil { // it reads the declared schemas in the peeked body: the peek goes back after it
			c, held := check, st.info.held
			check = func() { defer p.opts.PeekBudget.give(held); c() }
		}
		st.staged = true
		p.endStages(st.obs, st.rec, captured, check)
	})
}

// release gives back a request's peek budget (unless budget is false: a
// structure check still reads the body) and releases its contexts (end
// takes it out of those in flight after its stages).
func (p *Proxy) release(st *reqState, budget bool) {
	if budget {
		p.opts.PeekBudget.give(st.info.held)
	}
	st.cut(nil)
	if st.switchTimer != nil {
		st.switchTimer.Stop()
	}
	if st.cancel != nil {
		st.cancel()
	}
}

// endStages runs the structure check (check, if not nil), then the
// pipeline's end stages on a settled record: on a goroutine of their
// own, counted in Options.Ends, when it is set (the client's response
// completes meanwhile: net/http ends it when the handler returns);
// before it returns otherwise. A panic in a stage on its own goroutine
// is logged, as net/http logs a handler's.
func (p *Proxy) endStages(q *pipeline.Request, rec *record.Record, captured []byte, check func()) {
	e := p.opts.Ends
	if e == nil {
		p.runCheck(rec, check)
		q.End(rec, captured)
		return
	}
	e.add()
	go func() {
		defer e.done()
		defer func() {
			if v := recover(); v != nil {
				v, stack := panicOf(v)
				p.log.Error("end of request panicked", "id", rec.ID, "where", InternalEnd, "panic", v, "stack", string(stack))
				p.opts.Pipeline.InternalError(InternalEnd)
			}
		}()
		p.runCheck(rec, check)
		q.End(rec, captured)
	}()
}

// runCheck runs a structure check (nil: none). A panic in it is logged
// at error and counted under where="end", and the end stages still run
// after it, on the record as the check left it: a Structure that panics
// never costs the record (structure.Checker recovers its own panics and
// writes unchecked, check_panicked; this guards any other).
func (p *Proxy) runCheck(rec *record.Record, check func()) {
	if check == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			v, stack := panicOf(v)
			p.log.Error("structure check panicked", "id", rec.ID, "where", InternalEnd, "panic", v, "stack", string(stack))
			p.opts.Pipeline.InternalError(InternalEnd)
		}
	}()
	check()
}

func (p *Proxy) nextID() string {
	if p.opts.NextID != nil {
		return p.opts.NextID()
	}
	return p.idpfx + "-" + strconv.FormatUint(p.seq.Add(1), 10)
}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	st, _ := resp.Request.Context().Value(stateKey{}).(*reqState)
	if st == nil {
		return nil
	}
	st.rec.Headers = p.clock.Now()
	st.rec.HTTPStatus = resp.StatusCode
	if resp.StatusCode == http.StatusSwitchingProtocols {
		err := p.upgrade(st, resp)
		st.answered = err == nil // ReverseProxy switches the client's connection next
		return err
	}
	kind := bodyOpaque
	api := st.info.API
	format := formatOf(api)
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	enc := resp.Header.Get("Content-Encoding")
	// A status that carries no answer (a redirect, a 204): its body is
	// forwarded, never parsed or timed, whatever its Content-Type says.
	answer := noAnswer(resp.StatusCode, api.Name) == ""
	// A web page is no API's answer: a login page of a gateway in front
	// of the engine, a web server's page at a wrong address
	// (docs/measurement.md §3, html_body).
	st.page = answer && resp.StatusCode < 300 && api != stream.APIOther && (ct == "text/html" || ct == "application/xhtml+xml")
	if answer && api != stream.APIOther && (enc == "" || enc == "identity") {
		switch ct {
		case "text/event-stream":
			kind = bodySSE
			// llama.cpp serves /api/chat in the OpenAI format
			// (tools/server/server.cpp: an Ollama-compatible route to
			// post_chat_completions); Ollama itself streams NDJSON.
			format = format.SSE()
		case "application/x-ndjson":
			kind = bodyNDJSON
		case "application/json":
			kind = bodyJSON
		}
	} else if answer && api != stream.APIOther {
		st.obs.TapFailed("content_encoding")
		st.rec.TapFailed = "content_encoding"
	}
	if st.info.Read != "" && kind != bodyOpaque && resp.StatusCode < 300 {
		// The request's stream member may not have been read (a body
		// longer than the peek with "stream" after "messages", as the
		// Vercel AI SDK writes it; or a body that is not one JSON
		// object): the answer says whether it streams.
		st.rec.Stream = kind.streamed()
	}
	strip := st.injected && kind == bodySSE && resp.StatusCode < 300
	if strip {
		// The usage chunk will be cut out: the engine's length no longer
		// holds (an unflushed small answer from net/http, or a buffering
		// gateway, carries one).
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	st.tap = newTap(resp.Body, st, kind, format, strip, p.opts.MaxParseBytes)
	if resp.StatusCode < 300 && kind != bodyOpaque && p.opts.Structure != nil {
		st.tap.col = p.opts.Structure.Collector(&st.info.Declared)
	}
	if h := api.HeadersFrom(p.engineKind()); h != nil && resp.StatusCode < 300 && answer {
		engineHeaders(h, resp.Header, st.rec, st.tap)
	}
	st.tap.capture = p.opts.Pipeline.Capturing()
	resp.Body = st.tap
	st.answered = true // ReverseProxy writes the response's status next
	if st.direct {
		if db, ok := offloadable(resp, st.tap.body, kind); ok {
			return p.loopRelay(st, resp, db) // an event loop relays the body, or nil
		}
	}
	return nil
}

func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if err == errRelayed { // no error: relay answered, and the request settles
		return
	}
	st, _ := r.Context().Value(stateKey{}).(*reqState)
	status, etype, outcome := http.StatusBadGateway, record.ErrUpstreamConnect, record.Error
	switch {
	case st != nil && st.upgrade != nil:
		// The switch was taken (a 101 with the protocol asked for), so
		// ReverseProxy had the client's connection: writing the 101 to the
		// client failed. Nothing more can be written to it.
		status, etype, outcome = 0, record.ErrCancelled, record.Cancelled
	case st != nil && st.shutDown():
		status, etype = http.StatusServiceUnavailable, record.ErrShutdown
	case st != nil && st.body.TimedOut():
		status, etype = http.StatusRequestTimeout, record.ErrHTTP4xx
	case st != nil && st.clientCtx.Err() != nil:
		// The client went away, or shut its write side (SHUT_WR: net/http
		// cannot tell them apart and cancels the request), before the
		// upstream answered: cancelled, and answered 502 as a ReverseProxy
		// answers, never with net/http's empty 200 (docs/measurement.md §3).
		status, etype, outcome = http.StatusBadGateway, record.ErrCancelled, record.Cancelled
	case errors.Is(err, context.DeadlineExceeded) || st != nil && st.timedOut():
		status, etype, outcome = http.StatusGatewayTimeout, record.ErrTimeout, record.Timeout
	case upstreamTLS(err):
		etype = record.ErrUpstreamTLS
	case st != nil && st.phases.reached():
		// The request was written, or an answer began: the engine was
		// reached, and the connection broke (or the answer was not one it
		// could give, as a 101 nobody asked for) before the response
		// headers, as when an engine dies with requests queued.
		etype = record.ErrUpstreamReset
	}
	p.log.Warn("upstream request failed", "err", err, "outcome", outcome)
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"tokentap_%s","code":%d}}`+"\n",
			"tokentap: upstream "+http.StatusText(status)+": "+err.Error(), etype, status)
	}
	if st != nil {
		st.handled = true
		st.answered = st.answered || status != 0
		st.rec.HTTPStatus = status
		st.rec.Outcome, st.rec.ErrorType = outcome, etype
		st.rec.Terminal = p.clock.Now()
	}
}

// upstreamTLS reports whether err is the upstream's TLS failing: its
// certificate did not verify (unknown authority, wrong host, expired),
// its handshake was refused, or it does not speak TLS.
func upstreamTLS(err error) bool {
	var (
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		header tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &header)
}

// finish decides the outcome and settles the record for the pipeline's
// end stages; it returns the response body kept for content capture, or
// nil, and the structure check to run with the end stages, or nil.
// docs/measurement.md §3: every request that arrived gets exactly one
// outcome.
func (p *Proxy) finish(st *reqState) ([]byte, func()) {
	if st.finished {
		return nil, nil
	}
	st.finished = true
	rec := st.rec
	rec.Upstream, rec.UpstreamSent = st.phases.settle()
	t := st.tap
	if t != nil && !t.closed {
		_ = t.Close() // ReverseProxy closes the body; this is belt and braces
	}
	now := p.clock.Now()
	switch {
	case st.internal:
		// it panicked (settle): the answer, if any, was cut or a 502
		rec.Outcome, rec.ErrorType = record.Error, record.ErrInternal
		if rec.Terminal.IsZero() {
			rec.Terminal = now
		}
	case st.handled:
		// the error handler decided
	case st.upgrade != nil:
		p.upgradeOutcome(st, now)
	case t == nil:
		// ReverseProxy returned without a response and without calling the
		// error handler: the client went away before the upstream answered.
		rec.Outcome, rec.ErrorType, rec.Terminal = record.Cancelled, record.ErrCancelled, now
	default:
		p.outcome(st, t, now)
	}
	p.tokens(st)
	check := p.structureCheck(st)
	if t != nil {
		return t.captured, check
	}
	return nil, check
}

func (p *Proxy) outcome(st *reqState, t *tap, now time.Time) {
	rec := st.rec
	terminalAt := func(at time.Time) {
		if rec.Terminal.IsZero() {
			rec.Terminal = at
		}
	}
	cutOutcome, cutType, cut := st.cutBy()
	status := rec.HTTPStatus
	none := noAnswer(status, rec.API)
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		rec.Outcome, rec.ErrorType = record.Rejected, record.ErrRejected
	case status >= 400 && (t.eof || t.done || t.streamErr):
		// An HTTP error status is classified by its class; the engine's
		// own code, when its error body has one, is in ErrorCode.
		rec.Outcome, rec.ErrorType = record.Error, record.ErrHTTP4xx
		if status >= 500 {
			rec.ErrorType = record.ErrHTTP5xx
		}
	case none != "" && t.eof:
		rec.Outcome, rec.ErrorType = record.NoAnswer, none
	case t.eof && rec.FirstByte.IsZero() && rec.API != stream.NameOther && status < 300:
		// An answer status with no byte of body: nothing was answered.
		rec.Outcome, rec.ErrorType = record.NoAnswer, record.ErrEmptyBody
	case t.eof && st.page:
		rec.Outcome, rec.ErrorType = record.NoAnswer, record.ErrHTMLBody
	case t.eof && t.empty && status < 300:
		// A whole JSON answer that names none: no output, no finish
		// reason, no usage, no end; also the Responses API's queued
		// background response, answered later, elsewhere.
		rec.Outcome, rec.ErrorType = record.NoAnswer, record.ErrEmptyAnswer
	case t.streamErr:
		rec.Outcome, rec.ErrorType = record.Error, record.ErrStreamError
		if t.rejection {
			rec.Outcome, rec.ErrorType = record.Rejected, record.ErrRejected
		}
	case t.done:
		rec.Outcome = record.Success
	case t.eof:
		// A clean EOF ends a non-streaming body; it ends a stream
		// successfully only after a finish reason (of every choice, for
		// n > 1): a stream cut short with neither the end marker nor a
		// finish reason is a truncated generation (docs/measurement.md §3).
		switch {
		case !t.kind.streamed() || t.allFinished():
			rec.Outcome = record.Success
		// A stream that ended cleanly without a finish reason because
		// the sidecar or the client ended it (an upstream may close
		// gracefully when its connection is shut) is not a truncation.
		case cut:
			rec.Outcome, rec.ErrorType = cutOutcome, cutType
		default:
			rec.Outcome, rec.ErrorType = record.Error, record.ErrIncomplete
		}
	case cut:
		rec.Outcome, rec.ErrorType = cutOutcome, cutType
	case t.readErr != nil:
		rec.Outcome, rec.ErrorType = record.Error, record.ErrUpstreamReset
	default:
		// The body was neither finished nor broken: ReverseProxy stopped
		// copying because writing to the client failed.
		rec.Outcome, rec.ErrorType = record.Cancelled, record.ErrCancelled
	}
	if rec.Outcome == record.Success && rec.Malformed {
		rec.Outcome, rec.ErrorType = record.Error, record.ErrMalformed
	}
	if rec.Outcome == record.Success && rec.TapFailed != "" && t.kind != bodyOpaque {
		rec.ErrorType = "" // fail open: still a success for the client
	}
	switch {
	case !t.readErrAt.IsZero() && (t.eof || t.readErr != nil) && rec.Outcome != record.Cancelled:
		terminalAt(t.readErrAt)
	default:
		terminalAt(now)
	}
}

// noAnswer returns the error type of a response status that carries no
// answer to a request of api, or "" when it may carry one (or is an
// error status, which the outcome rules classify). docs/measurement.md
// §3, "Which statuses are answers": on a generation route only 200, 201
// and 203 carry an answer; every 3xx (a redirect, which the sidecar never
// follows; a 304) carries none on any route; a final 1xx never reaches
// here (net/http reads past it, and a 101 is a protocol switch).
func noAnswer(status int, api stream.Name) string {
	switch {
	case status >= 300 && status < 400:
		return record.ErrHTTP3xx
	case status >= 400:
		return ""
	case api == stream.NameOther:
		return "" // any 2xx answers a route the tap does not parse (a 204 to a DELETE)
	case status == http.StatusOK || status == http.StatusCreated || status == http.StatusNonAuthoritativeInfo:
		return ""
	}
	return record.ErrNoAnswerStatus
}

// cutBy says who ended a request before its body was done, if anyone
// did: the sidecar's shutdown, else the client, else the deadline.
func (st *reqState) cutBy() (outcome record.Outcome, errorType string, cut bool) {
	switch {
	case st.shutDown():
		return record.Error, record.ErrShutdown, true
	case st.clientCtx.Err() != nil:
		return record.Cancelled, record.ErrCancelled, true
	case st.timedOut():
		return record.Timeout, record.ErrTimeout, true
	}
	return "", "", false
}

// timedOut reports whether Options.Timeout ended the request (its
// context's cause: a deadline, or a switch's timer).
func (st *reqState) timedOut() bool {
	return st.ctx != nil && errors.Is(context.Cause(st.ctx), context.DeadlineExceeded)
}

// tokens settles the output token count from the best source
// (docs/measurement.md §2) and says which.
func (p *Proxy) tokens(st *reqState) {
	rec, t := st.rec, st.tap
	switch {
	case t != nil && t.sawUsage:
		rec.OutputTokens, rec.TokenSource = t.usageOut, "usage"
	case t != nil && t.hdrOut >= 0:
		rec.OutputTokens, rec.TokenSource = t.hdrOut, "usage"
	case t != nil && t.perEventAll && t.tokensFrom == stream.SourceTokenIDs && rec.TokenEvents() > 0:
		rec.OutputTokens, rec.TokenSource = t.idTokens, "token_ids"
	case t != nil && t.perEventAll && t.tokensFrom == stream.SourceLogprobs && rec.TokenEvents() > 0:
		rec.OutputTokens, rec.TokenSource = t.idTokens, "logprobs"
	case t != nil && t.kind.streamed() && rec.TapFailed == "" && t.oversized == 0:
		rec.OutputTokens, rec.TokenSource = int64(rec.TokenEvents()), "events"
	default:
		rec.OutputTokens, rec.TokenSource = -1, "none"
	}
}

// engineHeaders reads what an engine reports in response headers (the
// API's stream.EngineHeaders for the engine: TGI's x-queue-time...).
// Body usage, when there is some, wins over the header counts
// (proxy.tokens). Once per request, not per token.
func engineHeaders(eh *stream.EngineHeaders, h http.Header, rec *record.Record, t *tap) {
	for _, ht := range eh.Times {
		if v := h.Get(ht.Name); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 && n < 1<<40 {
				var e stream.EngineTimes
				e.Set(ht.Bit, time.Duration(n)*time.Millisecond)
				mergeEngine(&rec.Engine, e)
			}
		}
	}
	count := func(name string) int64 {
		if name == "" {
			return -1
		}
		if n, err := strconv.ParseInt(h.Get(name), 10, 64); err == nil && n >= 0 {
			return n
		}
		return -1
	}
	if n := count(eh.OutputTokens); n >= 0 {
		t.hdrOut = n
	}
	if n := count(eh.InputTokens); n >= 0 {
		rec.InputTokens = n
	}
}
