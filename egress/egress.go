// Package egress is the sidecar's egress mode: a forward HTTP proxy
// (clients set HTTPS_PROXY to it) that measures hosted LLM APIs from the
// client's side, built on github.com/elazarl/goproxy.
//
// A CONNECT to a host on the intercept allow-list is hijacked from
// goproxy: the proxy answers 200, terminates the client's TLS with a
// short-lived certificate minted from a local CA (ca.go), and serves the
// decrypted connection with a net/http server (HTTP/1.1, and HTTP/2
// through ALPN) whose handler is a proxy.Proxy to https://host: the same
// tap, adapters, record, pipeline, metrics and spans as the reverse
// proxy, re-encrypted to the real host with normal verification. A
// CONNECT to a destination on the tunnel allow-list is goproxy's blind
// tunnel: bytes copied both ways, never decrypted. Plain-HTTP forward
// requests are measured when their host is on the list and forwarded by
// goproxy when it is on the tunnel allow-list. Every other destination
// is refused, and so is every internal address (loopback, link-local,
// private) unless allowed by name, and the sidecar's own listeners,
// checked on the address resolved, before it is dialled (guard.go).
// Proxy authentication is optional (auth.go). docs/egress.md has the
// trust and threat models.
package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
)

// Options configures a Proxy.
type Options struct {
	// Config is the egress section. Config.Intercept must be valid
	// (config.Egress.Validate).
	Config config.Egress
	// Pipeline publishes every measured request, as for the reverse
	// proxy. Nil means a pipeline with no stage.
	Pipeline *pipeline.Pipeline
	// Logger logs; nil discards.
	Logger *slog.Logger
	// Clock times the requests; nil means the system clock.
	Clock record.Clock
	// Registry receives the egress counters; nil registers nothing.
	Registry prometheus.Registerer

	// The reverse proxy's limits and timeouts (proxy.Options, app):
	// PeekBytes and PeekBudget (the peeks' shared bound), Timeout (a
	// whole request), BodyReadTimeout and BodyMinRate (an idle or slow
	// request body) per request; ReadHeaderTimeout (0 means 30 s) and
	// IdleTimeout per client connection, for the proxy listener and for
	// every intercepted connection alike.
	PeekBytes         int
	PeekBudget        *proxy.PeekBudget
	Timeout           time.Duration
	BodyReadTimeout   time.Duration
	BodyMinRate       int64
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// ProbeHeader is the secret that marks the sidecar's own probes
	// (proxy.Options.ProbeHeader): forwarded, not recorded twice.
	ProbeHeader string
	// Tenants identifies each request's tenant (proxy.Options.Tenants);
	// nil: none.
	Tenants proxy.Tenants
	// Structure checks the structure of answers (proxy.Options.Structure);
	// nil checks nothing.
	Structure proxy.Structure
	// Via is the sidecar's pseudonym in the Via header
	// (proxy.Options.Via): added to every intercepted request forwarded,
	// and an intercepted request that carries it already is a loop,
	// answered 508. "": no Via.
	Via string

	// LookupIP resolves a destination's host name; nil means the
	// system's resolver (net.DefaultResolver). Tests resolve their test
	// host names here.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// DialContext dials an upstream host or a tunnel's destination, at
	// an address LookupIP returned and the guard checked ("ip:port",
	// never a name); nil means a net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// RootCAs verifies the intercepted hosts' certificates; nil means
	// the system roots.
	RootCAs *x509.CertPool
	// Now dates minted certificates; nil means time.Now.
	Now func() time.Time
}

// Proxy is the egress forward proxy. Create it with New, run it with
// Serve, stop it with Shutdown (then Cut, when the grace is over) and
// Close.
type Proxy struct {
	opts    Options
	cfg     config.Egress
	log     *slog.Logger
	match   *matcher
	tunnel  []hostPort   // egress.tunnel_allow
	guard   *guard       // the address checks
	auth    *credentials // nil: no proxy authentication
	ca      *CA
	bundle  string // the trust bundle written beside the CA, or ""
	leaves  *leafCache
	gp      *goproxy.ProxyHttpServer
	front   *http.Server // the proxy listener: CONNECT and plain-HTTP forward requests
	mitm    *http.Server // every intercepted connection, decrypted
	mitmLn  *connListener
	targets *targets
	tr      *http.Transport // to the intercepted hosts
	tunnels connSet         // the upstream ends of blind tunnels
	// ends counts the intercepted requests' end-of-request stages, run
	// after their responses (proxy.Options.Ends, shared by every target
	// proxy); Shutdown waits for them.
	ends proxy.Ends

	connects *prometheus.CounterVec
	refused  *prometheus.CounterVec
	conns    sync.Map // intercepted *tls.Conn or net.Conn → target
}

// target is an intercepted host as one upstream.
type target struct {
	scheme    string // https, or http (plain forward requests)
	authority string // host[:port], the default port left out
	rule      string // the allow-list entry it matched
}

func (t target) key() string { return t.scheme + "://" + t.authority }

type targetKey struct{}

// New loads or generates the CA (logging once where it is and how to
// trust it) and builds the proxy; nothing is served yet.
func New(opts Options) (*Proxy, error) {
	cfg := opts.Config.WithDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Pipeline == nil {
		opts.Pipeline = pipeline.New(pipeline.Options{})
	}
	if opts.ReadHeaderTimeout <= 0 {
		opts.ReadHeaderTimeout = 30 * time.Second
	}
	if opts.DialContext == nil {
		opts.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if opts.LookupIP == nil {
		opts.LookupIP = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p := &Proxy{opts: opts, cfg: cfg, log: opts.Logger, match: newMatcher(cfg.Intercept)}
	p.guard = &guard{lookup: p.lookup, localAddrs: localInterfaceAddrs}
	for _, e := range cfg.TunnelAllow {
		host, port, _ := config.SplitTunnelEntry(e)
		p.tunnel = append(p.tunnel, hostPort{pattern: newPattern(host), port: port})
	}
	for _, e := range cfg.InternalAllow {
		p.guard.internalAllow = append(p.guard.internalAllow, newPattern(e))
	}
	if cfg.AuthFile != "" {
		var err error
		if p.auth, err = loadCredentials(cfg.AuthFile); err != nil {
			return nil, err
		}
	}

	certPath, keyPath := cfg.CACert, cfg.CAKey
	if certPath == "" && keyPath == "" {
		var err error
		if certPath, keyPath, err = DefaultCAPaths(); err != nil {
			return nil, err
		}
	}
	ca, err := LoadOrCreateCA(certPath, keyPath, cfg.Intercept, opts.Now())
	if err != nil {
		return nil, err
	}
	p.ca = ca
	p.bundle = writeBundle(ca)
	p.announceCA()
	p.leaves = newLeafCache(ca, cfg.LeafCache, cfg.LeafValidity, opts.Now)

	if opts.Registry != nil {
		p.connects = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_egress_connects_total",
			Help: "CONNECT requests to the egress proxy by what was done: intercept (decrypted and measured), tunnel (passed through blind, never decrypted), refuse (refused: tokentap_egress_refused_total says why)."},
			[]string{"action"})
		p.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_egress_refused_total",
			Help: "Requests the egress proxy refused (CONNECT or plain-HTTP forward) by reason: not_allowed (not on egress.intercept or egress.tunnel_allow), internal (resolves to a loopback, link-local, private or reserved address, not on egress.internal_allow), self (one of the sidecar's own listeners), auth (Proxy-Authorization missing or wrong: 407), bad_request (an oversized authority, a CONNECT without a port, a scheme other than http or https: 400)."},
			[]string{"reason"})
		for _, r := range reasons {
			p.refused.WithLabelValues(r)
		}
		minted := prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_egress_certificates_minted_total",
			Help: "Certificates minted from the egress CA for intercepted hosts (the cache's misses and renewals)."})
		p.leaves.minted = minted.Inc
		opts.Registry.MustRegister(p.connects, p.refused, minted,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_egress_targets",
				Help: "Intercepted hosts with an upstream proxy held (bounded by egress.max_targets)."},
				func() float64 { return float64(p.targets.len()) }))
	}

	p.tr = &http.Transport{
		Proxy:               nil, // never the sidecar's own HTTPS_PROXY: that could be itself
		DialContext:         p.dial,
		TLSClientConfig:     &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,  // the client's Accept-Encoding goes as it came
		ForceAttemptHTTP2:   false, // HTTP/1.1 upstream, as the reverse proxy
	}
	p.targets = &targets{max: cfg.MaxTargets, m: map[string]*targetEntry{}, build: p.newTargetProxy}

	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{p.log}
	gp.Tr = &http.Transport{Proxy: nil, DialContext: p.dial, TLSClientConfig: &tls.Config{RootCAs: opts.RootCAs},
		TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	// goproxy's default chains to $HTTPS_PROXY: never. Without either,
	// a tunnel is dialled by the ProxyCtx.Dialer onConnect sets, to the
	// addresses it checked (and, were none set, by gp.Tr's p.dial).
	gp.ConnectDial, gp.ConnectDialWithReq = nil, nil
	gp.KeepAcceptEncoding = true // a passed-through request is not rewritten
	gp.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "tokentap egress: this is a forward proxy; point clients at it with HTTPS_PROXY=http://"+r.Host, http.StatusBadRequest)
	})
	gp.OnRequest().HandleConnectFunc(p.onConnect)
	p.gp = gp

	// Both servers bound a request's line and headers as the reverse
	// proxy's does (proxy.MaxHeaderBytes): past it a 431, nothing
	// forwarded.
	errLog := slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug)
	p.front = &http.Server{Handler: http.HandlerFunc(p.serveFront), ReadHeaderTimeout: opts.ReadHeaderTimeout,
		IdleTimeout: opts.IdleTimeout, MaxHeaderBytes: proxy.MaxHeaderBytes, ErrorLog: errLog}
	p.mitmLn = newConnListener()
	p.mitm = &http.Server{Handler: http.HandlerFunc(p.serveIntercepted), ReadHeaderTimeout: opts.ReadHeaderTimeout,
		IdleTimeout: opts.IdleTimeout, MaxHeaderBytes: proxy.MaxHeaderBytes, ErrorLog: errLog,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if t, ok := p.conns.Load(c); ok {
				ctx = context.WithValue(ctx, targetKey{}, t.(target))
			}
			return ctx
		},
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				p.conns.Delete(c)
			}
		}}
	return p, nil
}

// CA returns the CA that signs the intercepted hosts' certificates.
func (p *Proxy) CA() *CA { return p.ca }

// Bundle returns the trust bundle written beside the CA (the system's
// roots and the CA), or "" when no system bundle was found.
func (p *Proxy) Bundle() string { return p.bundle }

// announceCA says once where the CA is and how to trust it.
func (p *Proxy) announceCA() {
	what := "egress CA loaded"
	if p.ca.Generated {
		what = "egress CA generated"
	}
	trust := p.ca.CertPath
	if p.bundle != "" {
		trust = p.bundle
	}
	p.log.Info(what+"; clients must trust it to be measured: SSL_CERT_FILE="+trust+
		" (Go, curl, OpenSSL, Python ssl), REQUESTS_CA_BUNDLE="+trust+" (Python requests, httpx), NODE_EXTRA_CA_CERTS="+p.ca.CertPath+
		" (Node), or add "+p.ca.CertPath+" to the OS store (update-ca-certificates, security add-trusted-cert, certutil -addstore Root)",
		"cert", p.ca.CertPath, "key", p.ca.KeyPath, "bundle", p.bundle, "expires", p.ca.Cert.NotAfter.Format(time.DateOnly),
		"intercept", strings.Join(p.cfg.Intercept, ","))
}

// systemBundles are where Linux distributions keep their root bundle.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL, CentOS
	"/etc/ssl/ca-bundle.pem",             // openSUSE
	"/etc/ssl/cert.pem",                  // Alpine, macOS
}

// writeBundle writes <cert>-bundle.pem beside the CA: the system roots
// followed by the CA, for SSL_CERT_FILE and REQUESTS_CA_BUNDLE, which
// replace the roots rather than add to them (so that tunnelled hosts
// still verify). It returns "" when there is no system bundle or the
// file cannot be written.
func writeBundle(ca *CA) string {
	var roots []byte
	for _, f := range systemBundles {
		if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
			roots = b
			break
		}
	}
	if roots == nil {
		return ""
	}
	path := strings.TrimSuffix(ca.CertPath, filepath.Ext(ca.CertPath)) + "-bundle.pem"
	if !strings.HasSuffix(string(roots), "\n") {
		roots = append(roots, '\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(roots, ca.PEM()...), 0o644); err != nil {
		return ""
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return ""
	}
	return path
}

// lookup resolves host with Options.LookupIP. An upstream request's
// dial (dial, through guard.resolve) resolves here, not in a net.Dialer,
// so the request's httptrace hears of the lookup from here (DNSStart,
// DNSDone: the record's DNS phase); a resolver that reports its own
// (the system's) does so inside these, and the outer pair is the one
// kept.
func (p *Proxy) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	tr := httptrace.ContextClientTrace(ctx)
	if tr != nil && tr.DNSStart != nil {
		tr.DNSStart(httptrace.DNSStartInfo{Host: host})
	}
	addrs, err := p.opts.LookupIP(ctx, host)
	if tr != nil && tr.DNSDone != nil {
		done := httptrace.DNSDoneInfo{Err: err, Addrs: make([]net.IPAddr, len(addrs))}
		for i, a := range addrs {
			done.Addrs[i] = net.IPAddr{IP: a.AsSlice(), Zone: a.Zone()}
		}
		tr.DNSDone(done)
	}
	return addrs, err
}

// dial is the dialer of every upstream connection (the intercepted
// hosts' transport, goproxy's forwarder): it resolves addr's host,
// checks every address (guard.resolve), and dials those.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port := splitHostPort(addr)
	addrs, err := p.guard.resolve(ctx, host, port)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			p.refuse(ref.reason, host)
		}
		return nil, err
	}
	return p.dialAddrs(ctx, network, addrs)
}

// dialAddrs dials the checked addresses in turn; the first that answers
// is the connection.
func (p *Proxy) dialAddrs(ctx context.Context, network string, addrs []netip.AddrPort) (net.Conn, error) {
	var err error
	for _, a := range addrs {
		var c net.Conn
		if c, err = p.opts.DialContext(ctx, network, a.String()); err == nil {
			return c, nil
		}
	}
	return nil, err
}

func (p *Proxy) count(action string) {
	if p.connects != nil {
		p.connects.WithLabelValues(action).Inc()
	}
}

// refuse counts a refusal, and logs it at debug level with the host
// clipped.
func (p *Proxy) refuse(reason, host string) {
	if p.refused != nil {
		p.refused.WithLabelValues(reason).Inc()
	}
	p.log.Debug("egress: refused", "reason", reason, "host", clip(host, maxHost))
}

// maxHost bounds a host name (RFC 1035: 253 bytes, and room for an
// IPv6 literal's brackets); maxAuthority is host:port at most. A longer
// authority is refused at once (400), before it is echoed anywhere.
const (
	maxHost      = 255
	maxAuthority = maxHost + len(":65535")
)

// destination decides a destination by name: the intercept rule host
// matches (any port), or tunnel when host:port is on egress.tunnel_allow
// and tunnelling is on; a *refusal otherwise.
func (p *Proxy) destination(host, port string) (rule string, intercept bool, err error) {
	if rule, ok := p.match.rule(host); ok {
		return rule, true, nil
	}
	if p.cfg.Tunnel && allowed(p.tunnel, host, port) {
		return "", false, nil
	}
	return "", false, &refusal{reasonNotAllowed, fmt.Sprintf("%q is not on egress.intercept or egress.tunnel_allow", clip(net.JoinHostPort(host, port), maxAuthority))}
}

// check decides a destination (by name, then by every address it
// resolves to) and returns its checked addresses; an error is a
// *refusal (counted) or a failed lookup.
func (p *Proxy) check(ctx context.Context, host, port string) (rule string, intercept bool, addrs []netip.AddrPort, err error) {
	if rule, intercept, err = p.destination(host, port); err == nil {
		addrs, err = p.guard.resolve(ctx, host, port)
	}
	var ref *refusal
	if errors.As(err, &ref) {
		p.refuse(ref.reason, host)
	}
	return rule, intercept, addrs, err
}

// failure is the status and body for a failed check: 403 (400) for a
// refusal, 502 for a lookup that failed.
func failure(host string, err error) (int, string) {
	var ref *refusal
	switch {
	case errors.As(err, &ref) && ref.reason == reasonBadRequest:
		return http.StatusBadRequest, "tokentap egress: " + ref.msg + "\n"
	case errors.As(err, &ref):
		return http.StatusForbidden, "tokentap egress: " + ref.msg + "\n"
	}
	return http.StatusBadGateway, fmt.Sprintf("tokentap egress: cannot resolve %q\n", clip(host, maxHost))
}

// onConnect decides a CONNECT: intercept a host on the list, tunnel a
// destination on the tunnel allow-list, refuse any other, and any whose
// addresses are refused.
func (p *Proxy) onConnect(authority string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	host, port := splitHostPort(authority)
	if port == "" {
		p.refuse(reasonBadRequest, host)
		p.count("refuse")
		return reject(ctx, http.StatusBadRequest, "tokentap egress: CONNECT needs host:port\n"), authority
	}
	rule, intercept, addrs, err := p.check(ctx.Req.Context(), host, port)
	var ref *refusal
	switch {
	case errors.As(err, &ref):
		p.count("refuse")
	case intercept:
		p.count("intercept")
	default:
		p.count("tunnel")
	}
	if err != nil {
		code, msg := failure(host, err)
		return reject(ctx, code, msg), authority
	}
	if intercept {
		t := target{scheme: "https", authority: targetAuthority("https", host, port), rule: rule}
		return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: func(r *http.Request, c net.Conn, _ *goproxy.ProxyCtx) {
			p.intercept(r, c, host, t)
		}}, authority
	}
	ctx.Dialer = func(dctx context.Context, network, _ string) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(dctx, 10*time.Second)
		defer cancel()
		c, err := p.dialAddrs(dctx, network, addrs)
		if err != nil {
			return nil, err
		}
		return p.tunnels.add(c), nil
	}
	return goproxy.OkConnect, authority
}

// reject answers a CONNECT with code and msg.
func reject(ctx *goproxy.ProxyCtx, code int, msg string) *goproxy.ConnectAction {
	ctx.Resp = goproxy.NewResponse(ctx.Req, goproxy.ContentTypeText, code, msg)
	return goproxy.RejectConnect
}

// intercept takes a hijacked CONNECT: it confirms the tunnel, and hands
// the connection, under TLS with a certificate for host (or as it is,
// when the client speaks plain HTTP in it), to the server of decrypted
// connections. goproxy's hijack hands over the raw connection without
// what its request parser may have buffered past the CONNECT; clients
// wait for the 200 before their ClientHello, so nothing is there.
func (p *Proxy) intercept(r *http.Request, c net.Conn, host string, t target) {
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		c.Close()
		return
	}
	// TLS or not: the first byte of a TLS handshake record is 22.
	_ = c.SetReadDeadline(time.Now().Add(p.opts.ReadHeaderTimeout))
	br := bufio.NewReader(c)
	first, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	conn := net.Conn(&bufferedConn{Conn: c, r: br})
	if first[0] == 22 {
		protos := []string{"http/1.1"}
		if p.cfg.HTTP2 {
			protos = []string{"h2", "http/1.1"}
		}
		conn = tls.Server(conn, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: protos,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				// The name the client asked the tunnel for, whatever its
				// SNI says: that is the name it verifies.
				return p.leaves.get(host)
			},
		})
	} else {
		t.scheme = "http"
		_, port := splitHostPort(r.URL.Host)
		t.authority = targetAuthority("http", host, port)
	}
	p.conns.Store(conn, t)
	if !p.mitmLn.push(conn) {
		p.conns.Delete(conn)
		conn.Close()
	}
}

// serveFront serves the proxy listener. An oversized authority is
// refused first (400), then a client without credentials (407, when
// authentication is on). A plain-HTTP forward request to an intercepted
// host is measured here, one to a destination on the tunnel allow-list
// forwarded by goproxy, any other refused; CONNECT (onConnect) and
// requests that are not proxy requests are goproxy's.
func (p *Proxy) serveFront(w http.ResponseWriter, r *http.Request) {
	if len(r.Host) > maxAuthority || len(r.URL.Host) > maxAuthority {
		p.refuse(reasonBadRequest, r.URL.Host)
		if r.Method == http.MethodConnect {
			p.count("refuse")
		}
		http.Error(w, fmt.Sprintf("tokentap egress: the authority is %d bytes, over %d", max(len(r.Host), len(r.URL.Host)), maxAuthority), http.StatusBadRequest)
		return
	}
	if !p.authorized(r) {
		p.refuse(reasonAuth, "")
		if r.Method == http.MethodConnect {
			p.count("refuse")
		}
		w.Header().Set("Proxy-Authenticate", `Basic realm="tokentap egress"`)
		http.Error(w, "tokentap egress: proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	r.Header.Del("Proxy-Authorization") // for this proxy, never forwarded
	if r.Method == http.MethodConnect || !r.URL.IsAbs() {
		p.gp.ServeHTTP(w, r)
		return
	}
	if r.URL.Scheme != "http" && r.URL.Scheme != "https" {
		p.refuse(reasonBadRequest, r.URL.Host)
		http.Error(w, "tokentap egress: only http and https URLs are forwarded", http.StatusBadRequest)
		return
	}
	host, port := splitHostPort(r.URL.Host)
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[r.URL.Scheme]
	}
	rule, intercept, _, err := p.check(r.Context(), host, port)
	if err != nil {
		code, msg := failure(host, err)
		http.Error(w, msg, code)
		return
	}
	if intercept {
		p.targets.serve(target{scheme: r.URL.Scheme, authority: targetAuthority(r.URL.Scheme, host, port), rule: rule}, w, r)
		return
	}
	p.gp.ServeHTTP(w, r) // its transport dials through p.dial, which checks again
}

// serveIntercepted serves one decrypted request.
func (p *Proxy) serveIntercepted(w http.ResponseWriter, r *http.Request) {
	t, ok := r.Context().Value(targetKey{}).(target)
	if !ok {
		http.Error(w, "tokentap egress: unknown connection", http.StatusInternalServerError)
		return
	}
	p.targets.serve(t, w, r)
}

// newTargetProxy builds the reverse proxy to one intercepted host.
func (p *Proxy) newTargetProxy(t target) (*proxy.Proxy, error) {
	u := &url.URL{Scheme: t.scheme, Host: t.authority}
	return proxy.New(proxy.Options{
		Upstream:        u,
		Transport:       p.tr,
		Pipeline:        p.opts.Pipeline,
		Clock:           p.opts.Clock,
		Logger:          p.log.With("target", t.authority),
		InjectUsage:     p.cfg.InjectUsage,
		PeekBytes:       p.opts.PeekBytes,
		PeekBudget:      p.opts.PeekBudget,
		Timeout:         p.opts.Timeout,
		BodyReadTimeout: p.opts.BodyReadTimeout,
		BodyMinRate:     p.opts.BodyMinRate,
		Traffic:         "live",
		ProbeHeader:     p.opts.ProbeHeader,
		Target:          t.authority,
		TargetRule:      t.rule,
		Ends:            &p.ends,
		Structure:       p.opts.Structure,
		Tenants:         p.opts.Tenants,
		Via:             p.opts.Via,
	})
}

// Serve serves the proxy listener ln (and the intercepted connections)
// until Shutdown or Close; it returns http.ErrServerClosed then. ln's
// address and own (the sidecar's other listeners: the reverse proxy's,
// the admin port's) are refused as destinations, whatever the
// allow-lists say. It warns when ln is not on loopback and there is no
// proxy authentication.
func (p *Proxy) Serve(ln net.Listener, own ...net.Addr) error {
	p.guard.addOwn(append(own, ln.Addr())...)
	p.mitmLn.addr = ln.Addr()
	go p.mitm.Serve(p.mitmLn)
	tunnel := "none"
	if p.cfg.Tunnel && len(p.cfg.TunnelAllow) > 0 {
		tunnel = strings.Join(p.cfg.TunnelAllow, ",")
	}
	p.log.Info("egress proxy is up: clients set HTTPS_PROXY=http://"+ln.Addr().String(), "intercept", strings.Join(p.cfg.Intercept, ","),
		"tunnel_allow", tunnel, "internal_allow", strings.Join(p.cfg.InternalAllow, ","), "auth", p.auth != nil,
		"inject_usage", p.cfg.InjectUsage, "http2", p.cfg.HTTP2)
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); p.auth == nil && (err != nil || !ap.Addr().IsLoopback()) {
		p.log.Warn("egress proxy listens on a non-loopback address without authentication: anyone who can reach "+ln.Addr().String()+
			" can send requests through it to the intercepted hosts and egress.tunnel_allow; set egress.auth_file or listen on 127.0.0.1",
			"listen", ln.Addr().String())
	}
	return p.front.Serve(ln)
}

// Shutdown stops accepting, then waits until the measured requests in
// flight are done and their end-of-request stages have run (their
// records published), or ctx ends. When it ends first, the error says so
// and the caller may Cut and call Shutdown again. Blind tunnels are left
// to Close.
func (p *Proxy) Shutdown(ctx context.Context) error {
	err := p.front.Shutdown(ctx)
	p.mitmLn.Close()
	if err = errors.Join(err, p.mitm.Shutdown(ctx)); err != nil {
		return err
	}
	return p.ends.Wait(ctx)
}

// Cut ends every measured request still in flight, recorded as
// error/shutdown (proxy.Proxy.Cut), and every later one at once; it
// returns how many it cut.
func (p *Proxy) Cut() int { return p.targets.cut() }

// Close closes everything: listeners, intercepted connections and
// tunnels.
func (p *Proxy) Close() error {
	p.mitmLn.Close()
	err := errors.Join(p.front.Close(), p.mitm.Close())
	p.tunnels.closeAll()
	p.tr.CloseIdleConnections()
	p.gp.Tr.CloseIdleConnections()
	return err
}

// targets holds one proxy.Proxy per intercepted host, at most max of
// them while any is idle: past max, the least recently used idle one is
// dropped (a busy one never is, so that Cut reaches every request).
type targets struct {
	max   int
	build func(target) (*proxy.Proxy, error)

	mu      sync.Mutex
	m       map[string]*targetEntry
	tick    uint64
	cutting bool
}

type targetEntry struct {
	p    *proxy.Proxy
	busy int
	used uint64
}

func (ts *targets) acquire(t target) (*targetEntry, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.tick++
	k := t.key()
	if e := ts.m[k]; e != nil {
		e.busy++
		e.used = ts.tick
		return e, nil
	}
	if len(ts.m) >= ts.max {
		var lk string
		var lru *targetEntry
		for k, e := range ts.m {
			if e.busy == 0 && (lru == nil || e.used < lru.used) {
				lk, lru = k, e
			}
		}
		if lru != nil {
			delete(ts.m, lk)
		}
	}
	px, err := ts.build(t)
	if err != nil {
		return nil, err
	}
	if ts.cutting {
		px.Cut()
	}
	e := &targetEntry{p: px, busy: 1, used: ts.tick}
	ts.m[k] = e
	return e, nil
}

func (ts *targets) release(t target, e *targetEntry) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e.busy--
	if k := t.key(); e.busy == 0 && len(ts.m) > ts.max && ts.m[k] == e {
		delete(ts.m, k)
	}
}

func (ts *targets) serve(t target, w http.ResponseWriter, r *http.Request) {
	e, err := ts.acquire(t)
	if err != nil {
		http.Error(w, "tokentap egress: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer ts.release(t, e)
	e.p.ServeHTTP(w, r)
}

func (ts *targets) cut() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.cutting = true
	n := 0
	for _, e := range ts.m {
		n += e.p.Cut()
	}
	return n
}

func (ts *targets) len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.m)
}

// connListener hands intercepted connections to the server of decrypted
// connections.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{}),
		addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
}

// push hands c over; false once the listener is closed.
func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// bufferedConn reads what a bufio.Reader peeked before the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// connSet tracks the upstream ends of blind tunnels, for Close.
type connSet struct {
	mu sync.Mutex
	m  map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.m, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

func (s *connSet) add(c net.Conn) net.Conn {
	t := &trackedConn{Conn: c, set: s}
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*trackedConn]struct{}{}
	}
	s.m[t] = struct{}{}
	s.mu.Unlock()
	return t
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := make([]*trackedConn, 0, len(s.m))
	for c := range s.m {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// goproxyLogger sends goproxy's messages to the debug log: its warnings
// are a client or a tunnel going away, the ordinary end of a connection.
type goproxyLogger struct{ log *slog.Logger }

func (l goproxyLogger) Printf(format string, v ...any) {
	l.log.Debug("goproxy: " + strings.TrimSpace(fmt.Sprintf(format, v...)))
}
