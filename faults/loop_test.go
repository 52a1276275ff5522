//go:build linux

package faults

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// runExit runs the sidecar with args and returns its exit code and
// stderr (it must exit by itself: a configuration error).
func runExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(sidecarBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // the hang guard: it serves instead
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%q still ran after 30 s:\n%s", args, errb.String())
	}
	return cmd.ProcessState.ExitCode(), errb.String()
}

// freePort is a loopback port nothing listens on (the test's own, closed).
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// The upstream or a probe's url naming the sidecar's own ports, through
// an alias, is refused at start: exit 2, every loop named.
func TestLoopConfigRefused(t *testing.T) {
	p, a := freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "probes.yaml")
	doc := "probes:\n  probes:\n    - {name: self, url: \"http://[::1]:" + a + "\"}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stderr := runExit(t, "--config", cfg, "--listen", "0.0.0.0:"+p, "--admin-listen", "localhost:"+a, "--upstream", "http://localhost:"+p+"/v1")
	t.Logf("exit %d: %s", code, strings.TrimSpace(stderr))
	for _, want := range []string{
		`upstream: "http://localhost:` + p + `/v1" is this sidecar's own listen address "0.0.0.0:` + p + `": every request would be forwarded to itself`,
		`probe self: url "http://[::1]:` + a + `" is this sidecar's own admin_listen address "localhost:` + a + `" (a probe through the sidecar is target: sidecar)`,
	} {
		if code != 2 || !strings.Contains(stderr, want) {
			t.Errorf("exit %d: want exit 2 and %q", code, want)
		}
	}
}

// An upstream that leads back to the sidecar through an alias no
// configuration check can see (a TCP forwarder to its listener, whose
// port was chosen at bind): the client's request is answered 508, after
// one forward; the records say error/loop_detected (the second pass)
// and error/http_5xx (the first, which got the 508); the loop is
// counted; /readyz says the upstream answered 508 Loop Detected. The
// health poll, which carries the sidecar's Via too, is refused at its
// first pass.
func TestLoopThroughAlias(t *testing.T) {
	fwd, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	var target atomic.Pointer[string]
	go func() {
		for {
			c, err := fwd.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				to := target.Load()
				if to == nil {
					return
				}
				u, err := net.Dial("tcp", *to)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, u)
			}()
		}
	}()
	records := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", "http://"+fwd.Addr().String(), "--records", records, "--engine", "off", "--upstream-health-path", "/health")
	to := strings.TrimPrefix(s.proxy, "http://")
	target.Store(&to)

	resp, body := postAll(t, newClient(t), s.proxy, chatBody("m", true))
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(string(body), "tokentap_loop_detected") {
		t.Fatalf("status %d, body %s: want 508 tokentap_loop_detected", resp.StatusCode, body)
	}
	// /readyz answers from a check within the last second: one made
	// before the forwarder had its target says unreachable.
	var ready string
	if !waitUntil(10*time.Second, func() bool {
		rr, err := http.Get(s.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(rr.Body)
		rr.Body.Close()
		ready = fmt.Sprint(rr.StatusCode, " ", string(rb))
		return rr.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(rb), "answered 508 Loop Detected")
	}) {
		t.Errorf("/readyz %q: want 503 naming the 508", ready)
	}
	if n := s.metric("gen_ai_server_request_duration_seconds_count", "gen_ai_operation_name", "chat", "error_type", "loop_detected"); n != 1 {
		t.Errorf("chat requests counted as loop_detected: %v, want 1", n)
	}
	if code := s.stop(); code != 0 {
		t.Errorf("exit %d", code)
	}
	rs := readRecords(t, records)
	chat := map[string]int{}
	other := 0
	for _, r := range rs {
		if r.ErrorType == "loop_detected" && r.HTTPStatus != 508 {
			t.Errorf("a loop_detected record with status %d", r.HTTPStatus)
		}
		if r.API == "chat" {
			chat[r.Outcome+"/"+r.ErrorType]++
		} else {
			other++
			if r.ErrorType != "loop_detected" {
				t.Errorf("a poll's record %s/%s status %d: want error/loop_detected (refused at its first pass)", r.Outcome, r.ErrorType, r.HTTPStatus)
			}
		}
	}
	t.Logf("records: chat %v, the sidecar's own polls %d", chat, other)
	if len(chat) != 2 || chat["error/loop_detected"] != 1 || chat["error/http_5xx"] != 1 {
		t.Errorf("chat records %v: want one error/loop_detected and one error/http_5xx", chat)
	}
}
