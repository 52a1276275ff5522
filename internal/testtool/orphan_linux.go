package testtool

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel kill the tool when the test binary dies
// without running its cleanups (a test timeout's panic, a SIGKILL), so
// that no Prometheus or Jaeger outlives its test run.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
