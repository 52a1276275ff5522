//go:build !linux

package structure

import "time"

// start is when the process began, for threadCPU.
var start = time.Now()

// threadCPU is the compile's clock where the thread's CPU time cannot
// be read: the time elapsed (a busy machine makes compiles look
// slower).
func threadCPU() time.Duration { return time.Since(start) }
