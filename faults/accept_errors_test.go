//go:build linux

package faults

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// prlimitNofile sets (when set is not nil) and returns a process's
// RLIMIT_NOFILE (prlimit(2)).
func prlimitNofile(t *testing.T, pid int, set *syscall.Rlimit) syscall.Rlimit {
	t.Helper()
	var old syscall.Rlimit
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(syscall.RLIMIT_NOFILE),
		uintptr(unsafe.Pointer(set)), uintptr(unsafe.Pointer(&old)), 0, 0)
	if errno != 0 {
		t.Fatalf("prlimit(%d, RLIMIT_NOFILE): %v", pid, errno)
	}
	return old
}

// Out of descriptors: the sidecar's descriptor limit is lowered to what
// it holds plus 16 and idle clients connect until accept(2) fails with
// EMFILE. The failure is logged at error level (it was at debug, so
// invisible) and counted in tokentap_accept_errors_total{listener="proxy",
// reason="emfile"}; once the clients leave, the sidecar serves again.
func TestAcceptErrorsCounted(t *testing.T) {
	t.Parallel()
	up := upstream(t, quickStream)
	s := startSidecar(t, "--upstream", up.URL, "--max-connections", "100000")
	orig := prlimitNofile(t, s.pid, nil)
	low := uint64(s.fds() + 16)
	prlimitNofile(t, s.pid, &syscall.Rlimit{Cur: low, Max: orig.Max})
	host := strings.TrimPrefix(s.proxy, "http://")
	const line = "accepting client connections fails"
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 200 && !strings.Contains(s.log.String(), line); i++ {
		c, err := net.Dial("tcp", host) // the kernel completes it; the sidecar's accept needs a descriptor
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		time.Sleep(5 * time.Millisecond)
	}
	if !s.log.waitFor(line, 5*time.Second) {
		t.Fatalf("%d idle clients against a limit of %d descriptors: no accept error in the log", len(conns), low)
	}
	clients := len(conns)
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	prlimitNofile(t, s.pid, &orig)
	var n float64
	if !waitUntil(10*time.Second, func() bool {
		n = s.metric("tokentap_accept_errors_total", "listener", "proxy", "reason", "emfile")
		return n > 0
	}) {
		t.Fatalf("tokentap_accept_errors_total{listener=\"proxy\",reason=\"emfile\"} is %v", n)
	}
	for _, l := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(l, line) {
			if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "reason=emfile") {
				t.Errorf("log line %q: want level WARN and reason emfile", l)
			}
			t.Logf("limit %d descriptors, %d idle clients: %v accept errors; %s", low, clients, n, l)
			break
		}
	}
	// Served again.
	resp, body := postAll(t, newClient(t), s.proxy, chatBody("after", true))
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("after the clients left: %s %q", resp.Status, body)
	}
}
