package faults

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// echoUpgrade answers a request to switch to the protocol "echo" with a
// 101 and then echoes the connection's bytes until the client's side
// ends; anything else gets a 400.
func echoUpgrade(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "echo") {
		http.Error(w, "Upgrade: echo, please", http.StatusBadRequest)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	io.Copy(conn, brw) // until the client half-closes (through the proxy)
}

// dialEcho opens a session of the "echo" protocol through the proxy at
// base (http://host:port) and checks the 101.
func dialEcho(t *testing.T, base string) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /v1/realtime HTTP/1.1\r\nHost: %s\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n", addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the switch: %s, want 101", resp.Status)
	}
	return c.(*net.TCPConn), br
}

// echoOnce sends a line and reads it back.
func echoOnce(t *testing.T, c net.Conn, br *bufio.Reader, line string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
		t.Fatalf("writing %q: %v", line, err)
	}
	got, err := br.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q: %q, %v", line, got, err)
	}
}

// A session that switched protocols (a WebSocket) is bounded by
// --timeout only until its 101, and SIGTERM lets it run on through the
// grace period, as a stream does: net/http's Shutdown neither waits for
// nor closes such a connection, and the sidecar used to exit at once and
// cut every session (300 held sessions closed in 0.0 s). A session still
// open when the grace is over is cut and recorded error/shutdown.
func TestShutdownWaitsForSwitchedSessions(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		grace string
		close bool // the client ends the session after SIGTERM
	}{
		{"the client ends it within the grace", "60s", true},
		{"still open when the grace is over", "15s", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := upstreamRaw(t, http.HandlerFunc(echoUpgrade))
			// Long enough for the switch itself on a busy machine (at
			// 100 ms, a busy run's 101 came too late: a 504).
			const timeout = 2 * time.Second
			path := filepath.Join(t.TempDir(), "records.jsonl")
			s := startSidecar(t, "--upstream", up.URL, "--records", path, "--shutdown-grace", c.grace,
				"--timeout", timeout.String())
			conn, br := dialEcho(t, s.proxy)
			switched := time.Now()
			echoOnce(t, conn, br, "before")
			s.signal(syscall.SIGTERM)
			if !s.log.waitFor("shutting down", 20*time.Second) {
				t.Fatal("no shutdown line after SIGTERM")
			}
			// Past the request timeout twice over, measured.
			for time.Since(switched) < 2*timeout {
				time.Sleep(timeout / 4)
			}
			echoOnce(t, conn, br, "after SIGTERM and past --timeout")
			if !s.running() {
				t.Fatal("the sidecar exited with a session open, within the grace period")
			}
			wantCode, want := 0, "success/"
			if c.close {
				conn.CloseWrite() // the upstream's copy ends, and so the session
				if _, err := br.ReadString('\n'); err != io.EOF {
					t.Fatalf("after the client's half-close: %v, want EOF", err)
				}
			} else {
				wantCode, want = 1, "error/shutdown"
			}
			if code := s.wait(40 * time.Second); code != wantCode {
				t.Errorf("exit status %d, want %d", code, wantCode)
			}
			rs := readRecords(t, path)
			if len(rs) != 1 || rs[0].API != "upgrade" || rs[0].HTTPStatus != 101 || rs[0].Outcome+"/"+rs[0].ErrorType != want {
				t.Fatalf("records %+v, want one, api upgrade, status 101, %s", rs, want)
			}
		})
	}
}
