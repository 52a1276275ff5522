package egress

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/tracing"
)

// The "hosted APIs" of these tests are TLS servers on loopback with
// certificates for test host names (*.test) from a CA of their own; the
// sidecar's resolver resolves *.test to 127.0.0.1 (or to what a test
// says) and refuses any other name, and its dialer dials loopback
// addresses only, so no test can reach a real host.

// testCA is a CA of the hosted APIs (not the sidecar's).
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) leaf(t *testing.T, hosts ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: hosts[0]},
		DNSNames: hosts, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// hosted starts a TLS server for the given host names, its certificate
// from ca; it returns the server and its port.
func hosted(t *testing.T, ca *testCA, h http.Handler, hosts ...string) (*httptest.Server, string) {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, hosts...)}}
	s.StartTLS()
	t.Cleanup(s.Close)
	_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	return s, port
}

// dialer resolves *.test to loopback (or to what resolveTo says) and
// refuses every other name; it dials loopback addresses only, and keeps
// every address it was asked to dial and what crossed each connection
// (both ways).
type dialer struct {
	mu        sync.Mutex
	resolveTo map[string][]netip.Addr // host → its n-th lookup's address (the last one repeats), instead of 127.0.0.1
	lookups   []string
	dialed    []string
	wire      bytes.Buffer // every byte read or written on every connection
}

func (d *dialer) LookupIP(ctx context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.lookups {
		if l == host {
			n++
		}
	}
	d.lookups = append(d.lookups, host)
	if a, ok := d.resolveTo[host]; ok {
		return a[min(n, len(a)-1) : min(n, len(a)-1)+1], nil
	}
	if !strings.HasSuffix(host, ".test") {
		return nil, fmt.Errorf("test resolver: refusing %s: tests never leave loopback", host)
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func (d *dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	d.mu.Unlock()
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("test dialer: refusing %s: tests never leave loopback", addr)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &wiredConn{Conn: c, d: d}, nil
}

// dials returns the addresses the dialer was asked to dial.
func (d *dialer) dials() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

func (d *dialer) sawWire(b []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Contains(d.wire.Bytes(), b)
}

func (d *dialer) wireLen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wire.Len()
}

type wiredConn struct {
	net.Conn
	d *dialer
}

func (c *wiredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.d.mu.Lock()
	c.d.wire.Write(b[:n])
	c.d.mu.Unlock()
	return n, err
}

func (c *wiredConn) Write(b []byte) (int, error) {
	c.d.mu.Lock()
	c.d.wire.Write(b)
	c.d.mu.Unlock()
	return c.Conn.Write(b)
}

// collect is a record sink.
type collect struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (c *collect) Write(r *record.Record) { c.mu.Lock(); c.recs = append(c.recs, r); c.mu.Unlock() }

func (c *collect) all() []*record.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*record.Record(nil), c.recs...)
}

// wait returns the records once there are n of them.
func (c *collect) wait(t *testing.T, n int) []*record.Record {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if r := c.all(); len(r) >= n {
			return r
		}
	}
	t.Fatalf("want %d records, have %d", n, len(c.all()))
	return nil
}

// harness is an egress proxy serving on loopback, with a pipeline that
// keeps records, Prometheus metrics and spans.
type harness struct {
	p        *Proxy
	addr     string // the proxy listener
	proxy    *url.URL
	caFile   string // the sidecar's CA certificate (the file clients trust)
	sink     *collect
	metrics  *exporter.Metrics
	reg      *prometheus.Registry // egress counters
	spans    *tracetest.SpanRecorder
	dial     *dialer
	hosted   *testCA
	logs     *bytes.Buffer
	logMu    *sync.Mutex
	accepted *countListener // the proxy listener, counting its connections
}

// logText returns what was logged so far.
func (h *harness) logText() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.logs.String()
}

// countListener counts the connections it accepts.
type countListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

type harnessOpts struct {
	intercept []string
	tunnel    []string // egress.tunnel_allow
	internal  []string // egress.internal_allow; nil: every test host name
	authFile  string
	resolve   map[string][]netip.Addr
	hosted    *testCA // the hosted APIs' CA; nil: a new one
	debugLogs bool    // keep debug lines too
	own       []net.Addr
	ln        net.Listener // the proxy listener; nil: a new one on 127.0.0.1
	noInject  bool
	noTunnel  bool
	http2Off  bool
	clock     record.Clock
	timeout   time.Duration
	bodyIdle  time.Duration
	caDir     string
	rootCAs   *x509.CertPool // nil: the hosted CA
	otlp      *exporter.OTLP // the pipeline's OTLP metric backend; nil: none
	via       string         // Options.Via
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	h := &harness{sink: &collect{}, spans: tracetest.NewSpanRecorder(), dial: &dialer{resolveTo: o.resolve}, hosted: o.hosted,
		reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}}
	if h.hosted == nil {
		h.hosted = newTestCA(t, "hosted API CA")
	}
	h.metrics = exporter.New(exporter.Config{MaxModels: 10})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	pipe := pipeline.New(pipeline.Options{Live: h.metrics, Models: h.metrics.Models(), Prometheus: h.metrics, OTLP: o.otlp,
		Tracer: tracing.New(tracing.Options{Provider: tp}), Sinks: []record.Sink{h.sink}})
	cfg := config.EgressDefaults()
	if o.intercept != nil {
		cfg.Intercept = o.intercept
	} else {
		cfg.Intercept = []string{"api.openai.test", "*.azure.test", "api.badcert.test", "plain.test"}
	}
	cfg.InjectUsage, cfg.Tunnel, cfg.HTTP2 = !o.noInject, !o.noTunnel, !o.http2Off
	cfg.TunnelAllow, cfg.InternalAllow, cfg.AuthFile = o.tunnel, o.internal, o.authFile
	if o.internal == nil {
		// The test hosts are on loopback: allowed by name, as an
		// operator would allow an internal host.
		cfg.InternalAllow = []string{"api.openai.test", "*.azure.test", "api.badcert.test", "plain.test", "other.test"}
	}
	dir := o.caDir
	if dir == "" {
		dir = t.TempDir()
	}
	cfg.CACert, cfg.CAKey = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	cfg.Listen = "127.0.0.1:0"
	roots := o.rootCAs
	if roots == nil {
		roots = h.hosted.pool
	}
	h.logMu = &sync.Mutex{}
	logw := writerFunc(func(b []byte) (int, error) { h.logMu.Lock(); defer h.logMu.Unlock(); return h.logs.Write(b) })
	level := slog.LevelInfo
	if o.debugLogs {
		level = slog.LevelDebug
	}
	p, err := New(Options{Config: cfg, Pipeline: pipe, Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level})),
		Clock: o.clock, Registry: h.reg, Timeout: o.timeout, BodyReadTimeout: o.bodyIdle, IdleTimeout: time.Minute,
		LookupIP: h.dial.LookupIP, DialContext: h.dial.DialContext, RootCAs: roots, Via: o.via})
	if err != nil {
		t.Fatal(err)
	}
	ln := o.ln
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	h.accepted = &countListener{Listener: ln}
	go func() { done <- p.Serve(h.accepted, o.own...) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		p.Close()
		if err := <-done; err != http.ErrServerClosed {
			t.Errorf("Serve returned %v", err)
		}
	})
	h.p, h.addr, h.caFile = p, ln.Addr().String(), cfg.CACert
	h.proxy, _ = url.Parse("http://" + h.addr)
	return h
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// client is an application configured only with the proxy's URL (as
// HTTPS_PROXY would give it) and the CA file it trusts.
func (h *harness) client(t *testing.T, h2 bool) *http.Client {
	t.Helper()
	return clientWith(t, h.proxy, h.caFile, h2)
}

func clientWith(t *testing.T, proxyURL *url.URL, caFile string, h2 bool) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: h2, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// counter reads a counter's value from a registry (0 when absent).
func counter(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matchLabels(m, labels) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// histCount reads a histogram's sample count and sum.
func histCount(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matchLabels(m, labels) {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

func matchLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// step is one upstream write at a known instant; client is what the
// client receives of it ("" when the sidecar cuts it: the usage chunk).
type step struct {
	at          time.Duration
	raw, client string
}

// lockstep serves steps in lockstep with the test's client: the next
// event is written only once the client has received the last one.
type lockstep struct {
	t       *testing.T
	clock   *testtool.Clock
	steps   []step
	ack     chan struct{}
	req     chan seen
	cancelc chan error // the request context's end, when the client left
}

type seen struct {
	header http.Header
	host   string
	body   []byte
	proto  string
}

func newLockstep(t *testing.T, steps []step) *lockstep {
	return &lockstep{t: t, clock: testtool.NewClock(time.Unix(1_700_000_000, 0)), steps: steps,
		ack: make(chan struct{}), req: make(chan seen, 8), cancelc: make(chan error, 8)}
}

func (u *lockstep) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.req <- seen{header: r.Header.Clone(), host: r.Host, body: b, proto: r.Proto}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	includeUsage := bytes.Contains(b, []byte(`"include_usage":true`))
	for _, s := range u.steps {
		if s.client == "" && !includeUsage {
			continue // the usage chunk: only when asked
		}
		u.clock.Set(s.at)
		io.WriteString(w, s.raw)
		w.(http.Flusher).Flush()
		if s.client == "" {
			continue
		}
		select {
		case <-u.ack:
		case <-r.Context().Done():
			u.cancelc <- r.Context().Err()
			return
		case <-time.After(10 * time.Second):
			u.t.Errorf("the client never received %q", s.client)
			return
		}
	}
}

// readLockstep reads the client's side of a lockstep stream, acking
// each step; it returns every byte received.
func readLockstep(t *testing.T, u *lockstep, body io.Reader) string {
	t.Helper()
	var got strings.Builder
	for _, s := range u.steps {
		if s.client == "" {
			continue
		}
		buf := make([]byte, len(s.client))
		if _, err := io.ReadFull(body, buf); err != nil {
			t.Fatalf("reading %q: %v (so far %q)", s.client, err, got.String())
		}
		got.Write(buf)
		u.ack <- struct{}{}
	}
	rest, _ := io.ReadAll(body)
	got.Write(rest)
	return got.String()
}
