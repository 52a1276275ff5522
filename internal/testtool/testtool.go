// Package testtool finds the real external tools that integration tests
// use (prometheus, promtool, jaeger) and runs them for a test. Outside CI
// a missing tool skips the test, loudly; with CI=true it fails it: an
// integration test never passes by not running. scripts/test.sh installs
// every tool and sets CI=true. Clock is the fake clock that the scripted
// upstreams of several packages' tests set.
package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Need returns the path of the named program or ends the test: with
// CI=true it fails the test, otherwise it skips it.
func Need(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FAILED: %s is not installed, and CI=true: run scripts/test.sh to install it", name)
		return ""
	}
	t.Skipf("\n"+
		"    ************************************************************\n"+
		"    SKIPPED: %s is not installed: run scripts/test.sh to install it\n"+
		"    (this integration test did not run; with CI=true it fails)\n"+
		"    ************************************************************", name)
	return ""
}

// logTail is how much of a tool's log Start shows when the test failed:
// its last bytes, where the error usually is.
const logTail = 16 << 10

// Start runs bin with args for the rest of the test: its output goes to a
// log file in a temporary folder, the test's cleanup kills it (and, on
// Linux, the kernel does when the test binary dies first), and a test
// that failed logs the end of that log (the last logTail bytes) as name's.
// The tool is started, not ready: the caller waits for what it needs.
func Start(t testing.TB, name, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > logTail {
				b = b[len(b)-logTail:]
			}
			t.Logf("%s log (last %d bytes at most):\n%s", name, logTail, b)
		}
	})
}
