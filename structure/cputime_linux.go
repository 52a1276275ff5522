package structure

import (
	"syscall"
	"time"
)

// rusageThread is Linux's RUSAGE_THREAD: the calling thread's use.
const rusageThread = 1

// threadCPU is the CPU time (user and system) the calling thread has
// used: the compile's clock, its goroutine locked to its thread
// (Checker.compile), so that a busy machine does not make a schema's
// compile look slower than it is. On an error it reads 0.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(rusageThread, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
