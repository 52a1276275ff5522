package app

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// defaultMaxConnections sizes the connection limit to the descriptor
// limit: each proxied stream holds a client and an engine connection, and
// 128 descriptors are left for files, listeners and the admin server.
func defaultMaxConnections() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	n := (int(min(rl.Cur, 1<<20)) - 128) / 2
	return max(n, 16)
}

// overloaded is what a connection past the limit gets before it is closed.
var overloaded = func() []byte {
	body := `{"error":{"message":"tokentap: too many open connections","type":"tokentap_overloaded","code":503}}` + "\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// connLimit is the one bound on open client connections, shared by every
// listener it wraps (the reverse proxy's and the egress proxy's: one
// descriptor budget, counted once): past max open connections, a new one
// is answered 503 and closed at once (counted), so that a flood of idle
// or slow clients, on either listener, cannot take every descriptor.
type connLimit struct {
	sem      chan struct{}
	rejected prometheus.Counter
}

// newConnLimit registers the limit's series on reg.
func newConnLimit(max int, reg prometheus.Registerer) *connLimit {
	l := &connLimit{sem: make(chan struct{}, max),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_connections_rejected_total",
			Help: "Client connections (to the reverse proxy or the egress proxy) refused with a 503 because --max-connections were open."})}
	reg.MustRegister(l.rejected,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_connections_open",
			Help: "Open client connections to the reverse proxy and the egress proxy together."},
			func() float64 { return float64(len(l.sem)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tokentap_connections_max",
			Help: "The --max-connections limit in force, shared by the reverse proxy and the egress proxy."},
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
			l.limit.rejected.Inc()
			go func() {
				c.SetWriteDeadline(time.Now().Add(time.Second))
				c.Write(overloaded)
				c.Close()
			}()
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
