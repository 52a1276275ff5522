package simengine

import (
	"context"
	"net"
	"strconv"
	"sync"
)

// Pipes is an in-memory network for tests under testing/synctest, where
// a loopback socket would leave the fake clock waiting on the kernel: it
// is a net.Listener whose Accept returns the server's end of a net.Pipe
// that Dial (an http.Transport's DialContext) returns the client's end
// of. Each connection has addresses of its own ("pipe-N" for its client,
// "pipes" for the listener), which net.Pipe's ("pipe") are not, so that
// Engine.Dialer tells them apart. The zero value is not usable: call
// NewPipes; Close ends Accept and every Dial to come.
type Pipes struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	n     int
}

// NewPipes returns an open Pipes.
func NewPipes() *Pipes { return &Pipes{conns: make(chan net.Conn), done: make(chan struct{})} }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

type pipeConn struct {
	net.Conn
	local, remote net.Addr
}

func (c *pipeConn) LocalAddr() net.Addr  { return c.local }
func (c *pipeConn) RemoteAddr() net.Addr { return c.remote }

// Dial connects to the listener, whatever the network and address; it
// waits for Accept, ctx or Close.
func (p *Pipes) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	p.mu.Lock()
	p.n++
	client := pipeAddr("pipe-" + strconv.Itoa(p.n))
	p.mu.Unlock()
	a, b := net.Pipe()
	select {
	case p.conns <- &pipeConn{b, pipeAddr("pipes"), client}:
		return &pipeConn{a, client, pipeAddr("pipes")}, nil
	case <-p.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept returns the next connection Dial made.
func (p *Pipes) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

// Close ends Accept and Dial; the connections made stay open.
func (p *Pipes) Close() error {
	p.once.Do(func() { close(p.done) })
	return nil
}

// Addr is the listener's address, "pipes".
func (p *Pipes) Addr() net.Addr { return pipeAddr("pipes") }
