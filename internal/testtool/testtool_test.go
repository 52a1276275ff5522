package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestStartHelper is the subprocess of TestStartLogsWhenTheTestFailed:
// it starts a tool that writes a line and then fails.
func TestStartHelper(t *testing.T) {
	if os.Getenv("TESTTOOL_START") == "" {
		t.Skip("helper process for the tests of Start")
	}
	// The tool says when it has written its line (a sleep of 200 ms was
	// not always enough for it to start on a busy machine).
	said := filepath.Join(t.TempDir(), "said")
	Start(t, "talker", Need(t, "sh"), "-c", "echo the last words of the tool; : > "+said+"; exec sleep 60")
	for i := 0; i < 1000; i++ { // at least 10 s: a bound on a hang
		if _, err := os.Stat(said); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("failing on purpose")
}

func TestStartLogsWhenTheTestFailed(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "TESTTOOL_START=1")
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("the helper: %v, want it failed; output:\n%s", err, out)
	}
	for _, want := range []string{"talker log (last", "the last words of the tool"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestStartKillsTheToolAtCleanup(t *testing.T) {
	sh := Need(t, "sh")
	pidFile := filepath.Join(t.TempDir(), "pid")
	var pid int
	t.Run("tool", func(t *testing.T) {
		Start(t, "sleeper", sh, "-c", "echo $$ > "+pidFile+"; exec sleep 60")
		for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
			if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			if time.Now().After(deadline) {
				t.Fatal("the tool did not start")
			}
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("the tool does not run: %v", err)
		}
	})
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("after the test, signalling the tool (pid %d): %v, want ESRCH", pid, err)
	}
}

func TestClock(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	c := NewClock(base)
	if got := c.Now(); !got.Equal(base) {
		t.Errorf("Now() before Set = %v, want %v", got, base)
	}
	c.Set(1500 * time.Millisecond)
	if got, want := c.Now(), base.Add(1500*time.Millisecond); !got.Equal(want) {
		t.Errorf("Now() after Set(1.5s) = %v, want %v", got, want)
	}
}

// TestStartOrphanHelper is the subprocess of TestStartKillsTheToolWithTheTest:
// it starts a tool, says the tool's pid on stdout, and waits to be killed.
func TestStartOrphanHelper(t *testing.T) {
	if os.Getenv("TESTTOOL_ORPHAN") == "" {
		t.Skip("helper process for TestStartKillsTheToolWithTheTest")
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	Start(t, "sleeper", Need(t, "sh"), "-c", "echo $$ > "+pidFile+"; exec sleep 300")
	for i := 0; i < 1000; i++ { // at least 10 s: a bound on a hang
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			os.Stdout.Write(b)
			time.Sleep(time.Hour) // killed by the parent test
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the tool did not start")
}

// TestStartKillsTheToolWithTheTest: a test binary that dies without its
// cleanups (SIGKILL here; a timeout's panic the same) takes its tools with it.
func TestStartKillsTheToolWithTheTest(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartOrphanHelper$", "-test.count=1")
	// The helper dies without its cleanups: its temporary directory goes
	// under this test's, which this test's cleanup removes.
	cmd.Env = append(os.Environ(), "TESTTOOL_ORPHAN=1", "TMPDIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 32)
	n, err := out.Read(line)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("reading the tool's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(line[:n])))
	if err != nil {
		t.Fatalf("the helper said %q, want a pid", line[:n])
	}
	cmd.Process.Kill() // no cleanup runs
	cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if gone(pid) {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the tool (pid %d) outlived its killed test binary by 10 s", pid)
		}
	}
}

// gone reports whether pid has exited: no such process, or a zombie that
// nobody has reaped yet.
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state is the field after the command's closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
