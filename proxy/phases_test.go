package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/record"
)

// The phases as the transport reports them, on a clock the test moves:
// a new TLS connection whose dial raced two addresses, a report from a
// dial that came after the request had its connection, a reused
// connection whose own dial served another request, the transport trying
// again on a new connection, an early answer, and reports after the
// record was settled.
func TestPhasesFromTheHooks(t *testing.T) {
	const ms = time.Millisecond
	clock := testtool.NewClock(time.Unix(1_700_000_000, 0))
	start := func() (*phases, *httptrace.ClientTrace) {
		clock.Set(0)
		ph := &phases{}
		tr := httptrace.ContextClientTrace(ph.install(context.Background(), clock, false))
		if tr == nil {
			t.Fatal("no trace in the context")
		}
		return ph, tr
	}
	at := func(d time.Duration, hook func()) { clock.Set(d); hook() }
	phase := func(u record.Upstream, bit uint8) any {
		if d, ok := u.Phase(bit); ok {
			return d
		}
		return nil
	}
	check := func(name string, u record.Upstream, reused bool, want map[uint8]any) {
		t.Helper()
		if !u.Asked || u.Reused != reused {
			t.Errorf("%s: asked %v reused %v, want true %v", name, u.Asked, u.Reused, reused)
		}
		for _, p := range record.UpstreamPhases {
			if got := phase(u, p.Bit); got != want[p.Bit] {
				t.Errorf("%s: %s = %v, want %v", name, p.Name, got, want[p.Bit])
			}
		}
	}
	refused := errors.New("connection refused")

	// A new TLS connection: the lookup, two addresses raced (the one
	// that answered ends the connect; the other's later failure does
	// not), the handshake, then 240 ms of the server.
	ph, tr := start()
	at(0, func() { tr.GetConn("api.test:443") })
	at(0, func() { tr.DNSStart(httptrace.DNSStartInfo{Host: "api.test"}) })
	at(1*ms, func() { tr.DNSDone(httptrace.DNSDoneInfo{}) })
	at(1*ms, func() { tr.ConnectStart("tcp", "[::1]:443") })
	at(1*ms+300*time.Microsecond, func() { tr.ConnectStart("tcp", "127.0.0.1:443") })
	at(3*ms, func() { tr.ConnectDone("tcp", "127.0.0.1:443", nil) })
	at(4*ms, func() { tr.ConnectDone("tcp", "[::1]:443", refused) })
	at(4*ms, func() { tr.TLSHandshakeStart() })
	at(24*ms, func() { tr.TLSHandshakeDone(tls.ConnectionState{}, nil) })
	at(24*ms, func() { tr.GotConn(httptrace.GotConnInfo{}) })
	at(25*ms, func() { tr.WroteRequest(httptrace.WroteRequestInfo{}) })
	at(265*ms, func() { tr.GotFirstResponseByte() })
	// Another dial of this request's, reporting after it had its
	// connection: not this request's.
	at(300*ms, func() { tr.TLSHandshakeStart() })
	at(310*ms, func() { tr.TLSHandshakeDone(tls.ConnectionState{}, nil) })
	up, sent := ph.settle()
	check("new connection", up, false, map[uint8]any{record.UpConnWait: 24 * ms, record.UpDNS: 1 * ms, record.UpConnect: 2 * ms,
		record.UpTLS: 20 * ms, record.UpServer: 240 * ms})
	if want := clock.Now().Add(-310 * ms).Add(25 * ms); !sent.Equal(want) {
		t.Errorf("sent at %v, want %v", sent, want)
	}
	// After the record is settled, nothing changes it.
	at(400*ms, func() { tr.GetConn("api.test:443") })
	at(401*ms, func() { tr.GotConn(httptrace.GotConnInfo{Reused: true}) })
	if again, _ := ph.settle(); again != up {
		t.Errorf("settled phases changed by later reports: %+v, was %+v", again, up)
	}

	// A reused connection: the dial this request started (its connect
	// done) served another request; the request waited 2 ms.
	ph, tr = start()
	at(0, func() { tr.GetConn("api.test:443") })
	at(0, func() { tr.ConnectStart("tcp", "127.0.0.1:443") })
	at(1*ms, func() { tr.ConnectDone("tcp", "127.0.0.1:443", nil) })
	at(2*ms, func() { tr.GotConn(httptrace.GotConnInfo{Reused: true, WasIdle: true}) })
	at(2*ms, func() { tr.WroteRequest(httptrace.WroteRequestInfo{}) })
	at(50*ms, func() { tr.GotFirstResponseByte() })
	up, _ = ph.settle()
	check("reused", up, true, map[uint8]any{record.UpConnWait: 2 * ms, record.UpServer: 48 * ms})

	// The kept-alive connection was closed: the transport tries again on
	// a new one. The record has the attempt that carried the request.
	ph, tr = start()
	at(0, func() { tr.GetConn("127.0.0.1:8000") })
	at(0, func() { tr.GotConn(httptrace.GotConnInfo{Reused: true}) })
	at(1*ms, func() { tr.WroteRequest(httptrace.WroteRequestInfo{Err: net.ErrClosed}) })
	at(2*ms, func() { tr.GetConn("127.0.0.1:8000") })
	at(2*ms, func() { tr.ConnectStart("tcp", "127.0.0.1:8000") })
	at(5*ms, func() { tr.ConnectDone("tcp", "127.0.0.1:8000", nil) })
	at(5*ms, func() { tr.GotConn(httptrace.GotConnInfo{}) })
	at(6*ms, func() { tr.WroteRequest(httptrace.WroteRequestInfo{}) })
	at(16*ms, func() { tr.GotFirstResponseByte() })
	up, _ = ph.settle()
	check("tried again", up, false, map[uint8]any{record.UpConnWait: 3 * ms, record.UpConnect: 3 * ms, record.UpServer: 10 * ms})

	// An upstream that answers before it has read the request whole: a
	// server phase of 0. A dial that failed: its connect time, no
	// connection.
	ph, tr = start()
	at(0, func() { tr.GetConn("127.0.0.1:8000") })
	at(0, func() { tr.GotConn(httptrace.GotConnInfo{Reused: true}) })
	at(3*ms, func() { tr.GotFirstResponseByte() })
	at(4*ms, func() { tr.WroteRequest(httptrace.WroteRequestInfo{}) })
	up, _ = ph.settle()
	check("early answer", up, true, map[uint8]any{record.UpConnWait: time.Duration(0), record.UpServer: time.Duration(0)})
	ph, tr = start()
	at(0, func() { tr.GetConn("127.0.0.1:9") })
	at(0, func() { tr.ConnectStart("tcp", "127.0.0.1:9") })
	at(7*ms, func() { tr.ConnectDone("tcp", "127.0.0.1:9", refused) })
	up, sent = ph.settle()
	check("refused", up, false, map[uint8]any{record.UpConnect: 7 * ms})
	if !sent.IsZero() {
		t.Errorf("a request never written was sent at %v", sent)
	}
}

// closeConn tells when the transport closes its connection.
type closeConn struct {
	net.Conn
	once   sync.Once
	closed chan<- struct{}
}

func (c *closeConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}

// In front of a loopback engine: the first request dials (a connect
// phase; no lookup: an IP address; no handshake: http), the next ones
// reuse the kept-alive connection (no connect phase, reused), and the
// first after the engine restarts on the same port dials again.
func TestConnectionPhasesAcrossAnEngineRestart(t *testing.T) {
	if loopAll {
		t.Skip("TOKENTAP_TEST_EVENT_LOOP: a streamed request on the event loop's path dials a connection of its own; no reuse to see")
	}
	events := []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n", "data: [DONE]\n\n"}
	serve := func(ln net.Listener) *httptest.Server {
		s := httptest.NewUnstartedServer(sse(events...))
		s.Listener.Close()
		s.Listener = ln
		s.Start()
		t.Cleanup(s.Close)
		return s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	engine := serve(ln)

	closed := make(chan struct{}, 16)
	tr := NewTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := dial(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return &closeConn{Conn: c, closed: closed}, nil
	}
	u, _ := url.Parse("http://" + addr)
	fs, sink := front(t, nil, Options{Upstream: u, Transport: tr})
	next := func(n int) *record.Record {
		t.Helper()
		if resp, body := do(t, fs, "/v1/chat/completions", streamBody); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %q", n, resp.StatusCode, body)
		}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			sink.mu.Lock()
			have := len(sink.recs)
			sink.mu.Unlock()
			if have >= n {
				break
			}
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.recs) != n {
			t.Fatalf("%d records after request %d", len(sink.recs), n)
		}
		return sink.recs[n-1]
	}
	newConn := func(name string, r *record.Record) {
		t.Helper()
		u := r.Upstream
		wait, waited := u.Phase(record.UpConnWait)
		connect, connected := u.Phase(record.UpConnect)
		_, looked := u.Phase(record.UpDNS)
		_, shook := u.Phase(record.UpTLS)
		server, served := u.Phase(record.UpServer)
		if !u.Asked || u.Reused || !connected || connect <= 0 || !waited || wait < connect || looked || shook || !served || server < 0 {
			t.Errorf("%s: %+v; want a new connection with a positive connect phase inside the wait, no lookup, no handshake", name, u)
		}
		if r.Outcome != record.Success || r.UpstreamSent.IsZero() {
			t.Errorf("%s: outcome %s, sent %v", name, r.Outcome, r.UpstreamSent)
		}
	}
	reused := func(name string, r *record.Record) {
		t.Helper()
		u := r.Upstream
		_, waited := u.Phase(record.UpConnWait)
		if !u.Asked || !u.Reused || !waited || u.Known&(record.UpDNS|record.UpConnect|record.UpTLS) != 0 {
			t.Errorf("%s: %+v; want a reused connection with no connect phase", name, u)
		}
	}
	newConn("first request", next(1))
	reused("second request", next(2))
	reused("third request", next(3))

	// The engine restarts: its connections close (the transport sees its
	// idle one closed), and it listens on the same port again.
	engine.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second): // a bound on a hang, not a measurement
		t.Fatal("the transport never closed its connection to the stopped engine")
	}
	if ln, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	serve(ln)
	newConn("first request after the restart", next(4))
	reused("the next one", next(5))
}

// BenchmarkUpstreamTrace is the connection phases' cost per request
// (docs/performance.md): the trace installed on the upstream request and
// its hooks fired as the transport fires them, then the record's phases
// settled; beside it, in the same run, the trace the proxy installed
// before (WroteRequest alone). The phases struct is allocated here; in
// the proxy it is part of the request's state.
func BenchmarkUpstreamTrace(b *testing.B) {
	clock := record.SystemClock{}
	ctx := context.Background()
	b.Run("before", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var sent atomic.Int64
			arrive := clock.Now()
			c := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
				sent.Store(int64(clock.Now().Sub(arrive)))
			}})
			httptrace.ContextClientTrace(c).WroteRequest(httptrace.WroteRequestInfo{})
			if sent.Load() < 0 {
				b.Fatal("negative offset")
			}
		}
	})
	for _, fresh := range []bool{false, true} {
		name := "phases/reused"
		if fresh {
			name = "phases/new_tls"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ph := new(phases)
				tr := httptrace.ContextClientTrace(ph.install(ctx, clock, false))
				tr.GetConn("api.test:443")
				if fresh {
					tr.DNSStart(httptrace.DNSStartInfo{Host: "api.test"})
					tr.DNSDone(httptrace.DNSDoneInfo{})
					tr.ConnectStart("tcp", "127.0.0.1:443")
					tr.ConnectDone("tcp", "127.0.0.1:443", nil)
					tr.TLSHandshakeStart()
					tr.TLSHandshakeDone(tls.ConnectionState{}, nil)
				}
				tr.GotConn(httptrace.GotConnInfo{Reused: !fresh})
				tr.WroteRequest(httptrace.WroteRequestInfo{})
				tr.GotFirstResponseByte()
				if up, _ := ph.settle(); up.Known&record.UpServer == 0 {
					b.Fatal("no server phase")
				}
			}
		})
	}
}
