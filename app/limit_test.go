package app

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A connection the limit listener hands out half-closes as the TCP
// connection under it does: net/http's server relies on that to close a
// connection whose request body it did not read without resetting it.
func TestLimitConnHalfCloses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newConnLimit(4, prometheus.NewRegistry(), proxyLimitSeries).listener(ln)
	defer l.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	cw, ok := server.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the limit listener's connection has no CloseWrite")
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	client.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("client read after the server's CloseWrite: %d, %v; want EOF", n, err)
	}
	// Half-closed, not closed: the server still reads what the client sends.
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	server.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(server, b); err != nil || b[0] != 'x' {
		t.Fatalf("server read after its CloseWrite: %q, %v", b, err)
	}
}

// One budget for two listeners: connections to either count against the
// same limit, a connection past it on either gets the 503, and the
// series are those of the registry given (the sidecar's own, /metrics).
func TestConnLimitShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	limit := newConnLimit(2, reg, proxyLimitSeries)
	var lns []*limitListener
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := limit.listener(ln)
		defer l.Close()
		lns = append(lns, l)
	}
	var held []net.Conn
	for _, l := range lns { // one open connection on each listener
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	// The limit is reached: a third connection, on either listener, is refused.
	accepted := make(chan net.Conn, 2)
	for _, l := range lns {
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- c
			}
		}()
	}
	for i, l := range lns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		c.Close()
		if !strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
			t.Errorf("listener %d past the shared limit: %q, want a 503", i, b)
		}
	}
	if v := gauge(t, reg, "tokentap_connections_open"); v != 2 {
		t.Errorf("tokentap_connections_open = %v, want 2", v)
	}
	if v := gauge(t, reg, "tokentap_connections_max"); v != 2 {
		t.Errorf("tokentap_connections_max = %v, want 2", v)
	}
	if v := gauge(t, reg, "tokentap_connections_rejected_total"); v != 2 {
		t.Errorf("tokentap_connections_rejected_total = %v, want 2", v)
	}
	// A slot freed on one listener is taken on the other.
	held[0].Close()
	c, err := net.Dial("tcp", lns[1].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-accepted:
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the freed slot was not taken by the other listener")
	}
}

// gauge reads an unlabelled gauge's or counter's value from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not on the registry", name)
	return 0
}

// The proxy's limit and the admin listener's are apart: the admin one
// full refuses its next connection, counted in its own series, and the
// proxy's still accepts. (The default proxy limit at a descriptor limit
// of 1,024: faults' TestAdminFloodLeavesProxyServed.)
func TestAdminLimitApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl := newConnLimit(4, reg, proxyLimitSeries).listener(proxyLn)
	al := newConnLimit(1, reg, adminLimitSeries).listener(adminLn)
	defer pl.Close()
	defer al.Close()
	c, err := net.Dial("tcp", al.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := al.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	go al.Accept() // refuses the next one
	over, err := net.Dial("tcp", al.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	over.SetDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(over); !strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
		t.Errorf("past the admin limit: %q, want a 503", b)
	}
	over.Close()
	pc, err := net.Dial("tcp", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ps, err := pl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ps.Close()
	for name, want := range map[string]float64{
		"tokentap_admin_connections_open": 1, "tokentap_admin_connections_max": 1, "tokentap_admin_connections_rejected_total": 1,
		"tokentap_connections_max": 4, "tokentap_connections_rejected_total": 0,
	} {
		if v := gauge(t, reg, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// The peek budget's series: its size, what the peeks hold, and the
// requests it refused (here none).
func TestPeekBudgetSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := newPeekBudget(8<<20, reg)
	if b.Max() != 8<<20 {
		t.Fatalf("Max() = %d", b.Max())
	}
	for name, want := range map[string]float64{"tokentap_peek_budget_bytes": 8 << 20, "tokentap_peek_held_bytes": 0, "tokentap_peek_budget_full_total": 0} {
		if v := gauge(t, reg, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// With the event loop a stream holds three descriptors, not two, so the
// default connection limit is two thirds of net/http's path's (both from
// the same descriptor limit, less the same reserve).
func TestDefaultMaxConnectionsPerStream(t *testing.T) {
	free := int(min(descriptorLimit(), 1<<20)) - descriptorReserve - 64
	two, three := defaultMaxConnections(64, streamDescriptors(false)), defaultMaxConnections(64, streamDescriptors(true))
	if free >= 3*16 && (two != free/2 || three != free/3) {
		t.Errorf("limits %d and %d from %d free descriptors, want %d and %d", two, three, free, free/2, free/3)
	}
	if three > two || three < 16 {
		t.Errorf("the event loop's limit %d, net/http's %d: want it no larger, and at least 16", three, two)
	}
}
