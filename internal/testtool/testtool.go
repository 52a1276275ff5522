// Package testtool finds the real external tools that integration tests
// use (prometheus, promtool, jaeger). Outside CI a missing tool skips the
// test, loudly; with CI=true it fails it: an integration test never passes
// by not running. scripts/test.sh installs every tool and sets CI=true.
package testtool

import (
	"os"
	"os/exec"
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
