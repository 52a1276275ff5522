// Package testtool finds the real external tools that integration tests
// use (prometheus, promtool). Outside CI a missing tool skips the test,
// loudly; with CI=true it fails it: an integration test never passes by
// not running.
package testtool

import (
	"os"
	"os/exec"
	"testing"
)

// Need returns the path of the named program or ends the test.
func Need(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed, and CI=true: run scripts/install-test-tools.sh", name)
	}
	t.Skipf("SKIPPED: %s is not installed (scripts/install-test-tools.sh installs it; with CI=true this fails)", name)
	return ""
}
