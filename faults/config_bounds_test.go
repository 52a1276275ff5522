//go:build linux

package faults

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// configCheck runs `sidecar --config path --config.check` and returns its
// exit code, stderr, wall time, CPU time (user and system) and peak RSS
// (getrusage's ru_maxrss).
func configCheck(t *testing.T, path string) (code int, stderr string, took, cpu time.Duration, peak int64) {
	t.Helper()
	cmd := exec.Command(sidecarBin, "--config", path, "--config.check")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // hermetic: no TOKENTAP_* or OTEL_*
	var errb bytes.Buffer
	cmd.Stderr = &errb
	done := make(chan error, 1)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // the bug this guards against: minutes and gigabytes
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("--config.check still ran after 30 s")
	}
	took = time.Since(start)
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return cmd.ProcessState.ExitCode(), errb.String(), took, cpu, ru.Maxrss * 1024
}

// Config bounds: a 1 MB YAML alias fan-out (hundreds of megabytes once
// expanded) fails --config.check within 1 s and under 100 MB of peak
// RSS, exit 2, naming the limit; a config of 10,001 SLOs is refused with
// exit 2 naming the cap.
func TestConfigBounds(t *testing.T) {
	dir := t.TempDir()
	var bomb strings.Builder
	bomb.WriteString("models:\n  - &s \"" + strings.Repeat("lol", 700) + "\"\n")
	for bomb.Len() < 1<<20-8 {
		bomb.WriteString("  - *s\n")
	}
	var slos strings.Builder
	slos.WriteString("slo:\n  objectives:\n")
	for i := range 10001 {
		fmt.Fprintf(&slos, "    - {name: s%d, target: 0.9, thresholds: {ttft: 1s}}\n", i)
	}
	for _, c := range []struct {
		name, doc, want string
	}{
		{"alias-fan-out", bomb.String(), "with its aliases expanded, this node is larger than the limit of 4194304 bytes (4 MiB)"},
		{"10001-slos", slos.String(), "slo.objectives: at most 64 SLOs, got 10001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".yaml")
			if err := os.WriteFile(path, []byte(c.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stderr, took, cpu, peak := configCheck(t, path)
			t.Logf("%d bytes: exit %d in %v (CPU %v), peak RSS %s: %s", len(c.doc), code, took.Round(time.Millisecond), cpu.Round(time.Millisecond), mb(peak), strings.TrimSpace(stderr))
			if code != 2 || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q: want exit 2 and %q", code, stderr, c.want)
			}
			// CPU time, not wall time: on a busy machine the process
			// waits for a core, which is not the work it does.
			if cpu > time.Second {
				t.Errorf("took %v of CPU, want under 1 s", cpu)
			}
			if peak > 100<<20 {
				t.Errorf("peak RSS %s, want under 100 MB", mb(peak))
			}
		})
	}
}
