package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A tool name that is on no PATH.
const missing = "tokentap-testtool-no-such-tool"

// TestNeedHelper is the subprocess that the tests below start: it calls
// Need for the tool named in TESTTOOL_NEED and is a no-op otherwise.
func TestNeedHelper(t *testing.T) {
	name := os.Getenv("TESTTOOL_NEED")
	if name == "" {
		t.Skip("helper process for the tests of Need")
	}
	t.Logf("found: %s", Need(t, name))
}

// runHelper runs TestNeedHelper in a new process of this test binary, with
// CI set to ci (unset when empty) and PATH set to path.
func runHelper(t *testing.T, name, ci, path string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNeedHelper$", "-test.v", "-test.count=1")
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CI=") || strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "TESTTOOL_NEED=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "TESTTOOL_NEED="+name, "PATH="+path)
	if ci != "" {
		env = append(env, "CI="+ci)
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestNeedMissingToolFailsUnderCI(t *testing.T) {
	out, err := runHelper(t, missing, "true", t.TempDir())
	if err == nil {
		t.Fatalf("Need(%q) with CI=true: the test passed, want it failed; output:\n%s", missing, out)
	}
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("running the helper: %v", err)
	}
	for _, want := range []string{"--- FAIL: TestNeedHelper", missing, "run scripts/test.sh to install it"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestNeedMissingToolSkipsOutsideCI(t *testing.T) {
	for _, ci := range []string{"", "false"} {
		out, err := runHelper(t, missing, ci, t.TempDir())
		if err != nil {
			t.Fatalf("Need(%q) with CI=%q: %v, want a skip; output:\n%s", missing, ci, err, out)
		}
		for _, want := range []string{"--- SKIP: TestNeedHelper", "SKIPPED: " + missing + " is not installed", "run scripts/test.sh to install it"} {
			if !strings.Contains(out, want) {
				t.Errorf("CI=%q: output lacks %q:\n%s", ci, want, out)
			}
		}
	}
}

func TestNeedFindsToolOnPath(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "fake-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if got := Need(t, "fake-tool"); got != tool {
		t.Errorf("Need(fake-tool) = %q, want %q", got, tool)
	}
}
