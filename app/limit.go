package app

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// descriptorReserve is how many descriptors the default connection
// limit leaves for everything but client connections: the listeners,
// the records and capture files, the engine's health poll and metrics
// scrape, the canary's connections, and the admin and proxy listeners'
// refusals (a refused connection holds a descriptor until its 503 is
// written).
const descriptorReserve = 64

// defaultMaxConnections sizes the proxy's connection limit to the
// descriptor limit (RLIMIT_NOFILE, read at startup): each proxied stream
// holds perStream descriptors (streamDescriptors), and descriptorReserve
// plus the admin listener's own limit are kept out of it, so that
// neither a flood on the admin port nor one on the proxy takes the
// other's: (RLIMIT_NOFILE − 64 − admin) / perStream, at least 16.
func defaultMaxConnections(admin, perStream int) int {
	n := (int(min(descriptorLimit(), 1<<20)) - descriptorReserve - admin) / perStream
	return max(n, 16)
}

// streamDescriptors is how many descriptors a proxied stream holds: a
// client and an engine connection, and with the event loop a copy of
// the client's socket too.
func streamDescriptors(eventLoop bool) int {
	if eventLoop {
		return 3
	}
	return 2
}

// descriptorLimit is the process's RLIMIT_NOFILE (its soft limit, which
// the Go runtime raised to the hard one at startup); 1024 when unknown.
func descriptorLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return rl.Cur
}

// overloaded is what a connection past the limit gets before it is closed.
var overloaded = func() []byte {
	body := `{"error":{"message":"tokentap: too many open connections","type":"tokentap_overloaded","code":503}}` + "\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// connLimit is one bound on open client connections, shared by every
// listener it wraps: past max open connections, a new one is answered
// 503 and closed at once (counted), so that a flood of idle or slow
// clients cannot take every descriptor. The reverse proxy's and the
// egress proxy's listeners share one (proxyLimitSeries: one descriptor
// budget, counted once); the admin listener has its own
// (adminLimitSeries), so that a flood of admin connections never takes
// the proxy's descriptors, nor a flood of proxy ones /metrics.
type connLimit struct {
	sem      chan struct{}
	rejected prometheus.Counter
}

// limitSeries names a limit's series and says what it bounds.
type limitSeries struct {
	prefix string // tokentap_connections: _open, _max, _rejected_total
	what   string // "Client connections (to ...)"
	flag   string // the flag that sets the limit
}

var (
	proxyLimitSeries = limitSeries{"tokentap_connections", "Client connections to the reverse proxy and the egress proxy together", "--max-connections"}
	adminLimitSeries = limitSeries{"tokentap_admin_connections", "Connections to the admin listener (/metrics, /healthz, /readyz, /slo, /live)", "--admin-max-connections"}
)

// newConnLimit registers the limit's series, named by names, on reg.
func newConnLimit(max int, reg prometheus.Registerer, names limitSeries) *connLimit {
	l := &connLimit{sem: make(chan struct{}, max),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: names.prefix + "_rejected_total",
			Help: names.what + " refused with a 503 because " + names.flag + " were open."})}
	reg.MustRegister(l.rejected,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: names.prefix + "_open",
			Help: names.what + ", open."},
			func() float64 { return float64(len(l.sem)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: names.prefix + "_max",
			Help: "The " + names.flag + " limit in force: " + strings.ToLower(names.what[:1]) + names.what[1:] + "."},
			func() float64 { return float64(cap(l.sem)) }))
	return l
}

// listener wraps ln in the limit.
func (l *connLimit) listener(ln net.Listener) *limitListener {
	return &limitListener{Listener: ln, limit: l}
}

// limitListener accepts the connections its connLimit has room for.
type limitListener struct {
	net.Listener
	limit *connLimit
}

// Accept returns the next connection within the limit.
func (l *limitListener) Accept() (net.Conn, error) {
	sem := l.limit.sem
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-sem }}, nil
		default:
			// Answered and closed here, before the next accept: the
			// descriptor is released at once, so that a flood past the
			// limit never holds more than one (a goroutine per refusal
			// held them until it ran, a thousand at once on a busy
			// machine). A new connection's send buffer is empty: the
			// write does not wait.
			l.limit.rejected.Inc()
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			c.Write(overloaded)
			c.Close()
		}
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// SyscallConn hands out the wrapped connection's socket, when it has one
// (proxy.Options.EventLoop writes to it); errors.ErrUnsupported otherwise.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite half-closes the connection when the wrapped one can (a TCP
// connection can). net/http's server looks for it before closing a
// connection whose request body it did not read, so that the client gets
// the response and a FIN rather than a reset; without it the wrapper
// hid the method. It returns nil for a connection that cannot.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
