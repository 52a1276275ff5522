package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
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
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// scriptClock is the test's clock: each phase of the script moves it
// forward by the phase's length, so every duration the proxy measures
// from it is exact.
type scriptClock struct {
	*testtool.Clock
	base time.Time
}

func newScriptClock() *scriptClock {
	base := time.Unix(1_700_000_000, 0)
	return &scriptClock{Clock: testtool.NewClock(base), base: base}
}

func (c *scriptClock) advance(d time.Duration) { c.Set(c.Now().Sub(c.base) + d) }

// egressSetup is an egress proxy on loopback intercepting
// api.openai.test, with the given clock, sink, resolver and dialer (the
// dialer must dial loopback only).
type egressSetup struct {
	clock  record.Clock
	sink   record.Sink
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	roots  *x509.CertPool
}

// start serves the proxy and returns it, its URL and the CA file a
// client trusts; the test's end shuts it down.
func (s egressSetup) start(t *testing.T) (*Proxy, *url.URL, string) {
	t.Helper()
	cfg := config.EgressDefaults()
	cfg.Intercept, cfg.InternalAllow, cfg.InjectUsage = []string{"api.openai.test"}, []string{"api.openai.test"}, true
	dir := t.TempDir()
	cfg.CACert, cfg.CAKey = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	cfg.Listen = "127.0.0.1:0"
	p, err := New(Options{Config: cfg, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{s.sink}}), Clock: s.clock,
		IdleTimeout: time.Minute, LookupIP: s.lookup, DialContext: s.dial, RootCAs: s.roots})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
		p.Close()
		<-done
	})
	u, _ := url.Parse("http://" + ln.Addr().String())
	return p, u, cfg.CACert
}

func loopbackOnly(addr string) error {
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("test dialer: refusing %s: tests never leave loopback", addr)
	}
	return nil
}

// The acceptance test of the connection phases, through egress to a
// scripted TLS upstream that sends its first token 240 ms after it has
// the request, on the script's clock. The first request opens the
// connection: the lookup takes 1 ms, the TCP connect 3 ms, the TLS
// handshake 20 ms (each moves the clock inside the phase: the resolver,
// the socket's control function before connect(2), the server's
// ClientHello callback). The second reuses it. On both, TTFT minus the
// wait for the connection is exactly the script's 240 ms.
func TestConnectionPhasesThroughEgress(t *testing.T) {
	const ms = time.Millisecond
	clock := newScriptClock()
	ca := newTestCA(t, "hosted API CA")
	var handshakes, dials atomic.Int64
	first := sse(chunk+`"delta":{"content":"Hi"},"finish_reason":null}]}`) + sse(chunk+`"delta":{},"finish_reason":"stop"}]}`)
	hostedAPI := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		clock.advance(240 * ms) // the model's time to its first token
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first+sse("[DONE]"))
	}))
	hostedAPI.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "api.openai.test")},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			if handshakes.Add(1) == 1 {
				clock.advance(20 * ms) // the handshake's round trips
			}
			return nil, nil
		}}
	hostedAPI.StartTLS()
	t.Cleanup(hostedAPI.Close)
	_, port, _ := net.SplitHostPort(hostedAPI.Listener.Addr().String())

	sink := &collect{}
	_, proxyURL, caFile := egressSetup{clock: clock, sink: sink, roots: ca.pool,
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if host != "api.openai.test" {
				return nil, fmt.Errorf("test resolver: refusing %s", host)
			}
			clock.advance(1 * ms)
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := loopbackOnly(addr); err != nil {
				return nil, err
			}
			n := dials.Add(1)
			d := net.Dialer{ControlContext: func(context.Context, string, string, syscall.RawConn) error {
				if n == 1 {
					clock.advance(3 * ms) // the TCP handshake
				}
				return nil
			}}
			return d.DialContext(ctx, network, addr)
		}}.start(t)
	c := clientWith(t, proxyURL, caFile, false)
	for i := 1; i <= 2; i++ {
		resp, err := c.Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), first) {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
		}
		sink.wait(t, i) // its record: the upstream connection is idle again by then
	}

	phase := func(u record.Upstream, bit uint8) any {
		if d, ok := u.Phase(bit); ok {
			return d
		}
		return nil
	}
	for i, want := range []struct {
		reused bool
		phases map[uint8]any
	}{
		{false, map[uint8]any{record.UpConnWait: 24 * ms, record.UpDNS: 1 * ms, record.UpConnect: 3 * ms, record.UpTLS: 20 * ms}},
		{true, map[uint8]any{record.UpConnWait: time.Duration(0)}},
	} {
		r := sink.all()[i]
		u := r.Upstream
		if r.Outcome != record.Success || !u.Asked || u.Reused != want.reused {
			t.Errorf("request %d: outcome %s, asked %v, reused %v; want success, true, %v", i+1, r.Outcome, u.Asked, u.Reused, want.reused)
		}
		// The server phase is from the request written (the record's
		// UpstreamSent) to the answer's first byte (its headers, on this
		// clock): 240 ms, or less when the transport wrote the body
		// straight to the connection and the upstream answered (moving
		// the clock) before the transport's writer reported it written.
		want.phases[record.UpServer] = max(r.Headers.Sub(r.UpstreamSent), 0)
		if r.Headers.Sub(r.UpstreamSent) > 240*ms {
			t.Errorf("request %d: written at %v, answered at %v: more than the script's 240ms", i+1, r.UpstreamSent.Sub(r.Arrive), r.Headers.Sub(r.Arrive))
		}
		for _, p := range record.UpstreamPhases {
			if got := phase(u, p.Bit); got != want.phases[p.Bit] {
				t.Errorf("request %d: %s = %v, want %v", i+1, p.Name, got, want.phases[p.Bit])
			}
		}
		ttft, ok := r.TTFT()
		if !ok || ttft-u.ConnWait != 240*ms {
			t.Errorf("request %d: TTFT %v minus the wait for a connection %v = %v, want the script's 240ms", i+1, ttft, u.ConnWait, ttft-u.ConnWait)
		}
		line, _ := r.MarshalJSON()
		if !strings.Contains(string(line), `"upstream":{"reused":`+fmt.Sprint(want.reused)) {
			t.Errorf("request %d: record line %s", i+1, line)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d upstream dials, want 1 (the second request reuses the connection)", n)
	}
}

// blockedSink holds the first record until released: an end-of-request
// stage that takes long.
type blockedSink struct {
	collect
	entered, release chan struct{}
	once             sync.Once
}

func (b *blockedSink) Write(r *record.Record) {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	b.collect.Write(r)
}

// An intercepted request's end-of-request stages run after its response
// (proxy.Options.Ends, one count shared by every target proxy): the
// egress client reads the whole stream while a stage is still blocked,
// and Shutdown waits for the stage, so the record is written when it
// returns.
func TestEgressEndStagesAfterTheResponse(t *testing.T) {
	ca := newTestCA(t, "hosted API CA")
	_, port := hosted(t, ca, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, delta("a")+sse(chunk+`"delta":{},"finish_reason":"stop"}]}`)+sse("[DONE]"))
	}), "api.openai.test")
	sink := &blockedSink{entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(sink.release) }) }
	t.Cleanup(release) // before the proxy's shutdown, which waits for the stage
	p, proxyURL, caFile := egressSetup{sink: sink, roots: ca.pool,
		lookup: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := loopbackOnly(addr); err != nil {
				return nil, err
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}.start(t)
	c := clientWith(t, proxyURL, caFile, false)
	resp, err := c.Post("https://api.openai.test:"+port+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a measurement
		t.Fatal("the egress client's response did not complete while an end stage was blocked")
	}
	select {
	case <-sink.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the end stage never ran")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.ends.Wait(cancelled); err != context.Canceled {
		t.Fatalf("the egress proxy's Ends with a stage blocked: %v, want context.Canceled (the stage counted)", err)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	type result struct {
		err     error
		records int
	}
	shut := make(chan result, 1)
	go func() {
		err := p.Shutdown(context.Background())
		shut <- result{err, len(sink.all())}
	}()
	release()
	r := <-shut
	if r.err != nil || r.records != 1 {
		t.Fatalf("Shutdown returned %v with %d records written, want nil and 1", r.err, r.records)
	}
}

// The intercepted connections' server and the proxy listener bound a
// request's line and headers as the reverse proxy does (64 KiB): a 100 KB
// header gets a 431 and reaches no upstream, through a CONNECT (TLS) and
// as a plain forward request; 60 KB still passes.
func TestEgressHeaderBound(t *testing.T) {
	var served atomic.Int64
	h := newHarness(t, harnessOpts{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, delta("a")+sse(chunk+`"delta":{},"finish_reason":"stop"}]}`)+sse("[DONE]"))
	})
	_, tlsPort := hosted(t, h.hosted, handler, "api.openai.test")
	plain := httptest.NewServer(handler)
	t.Cleanup(plain.Close)
	_, plainPort, _ := net.SplitHostPort(plain.Listener.Addr().String())

	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(h.caFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("the sidecar's CA: %v", err)
	}
	// status sends a request with the extra header bytes on a connection
	// of its own (written on its own goroutine: a refused request is not
	// read to its end) and returns the status of the answer.
	status := func(intercepted bool, header string) int {
		t.Helper()
		conn, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		target := "http://plain.test:" + plainPort + "/v1/chat/completions"
		if intercepted {
			fmt.Fprintf(conn, "CONNECT api.openai.test:%s HTTP/1.1\r\nHost: api.openai.test:%s\r\n\r\n", tlsPort, tlsPort)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %v %v", resp, err)
			}
			tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "api.openai.test"})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			conn, target = tc, "/v1/chat/completions"
		}
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: api.openai.test\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			target, header, len(chatBody), chatBody)
		go io.WriteString(conn, head)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the answer to a %d-byte request: %v", len(head), err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	big, fine := "X-Big: "+strings.Repeat("a", 100_000)+"\r\n", "X-Fine: "+strings.Repeat("a", 60_000)+"\r\n"
	for _, intercepted := range []bool{true, false} {
		if code := status(intercepted, big); code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("intercepted %v: a 100 KB header got %d, want 431", intercepted, code)
		}
		if code := status(intercepted, fine); code != 200 {
			t.Errorf("intercepted %v: a 60 KB header got %d, want 200", intercepted, code)
		}
	}
	h.sink.wait(t, 2)
	if n := served.Load(); n != 2 {
		t.Fatalf("the upstreams served %d requests, want 2 (the refused ones reach none)", n)
	}
}
