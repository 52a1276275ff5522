package app

import (
	"io"
	"net"
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
	l := newLimitListener(ln, 4, prometheus.NewRegistry())
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
