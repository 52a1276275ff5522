//go:build unix

package record

import (
	"errors"
	"os"
	"syscall"
)

// openAppend opens path for appending, creating it (mode 0644), without
// blocking: O_NONBLOCK makes open(2) of a FIFO with no reader fail at
// once (ENXIO: noReader) instead of waiting for one, and changes nothing
// for a regular file. A FIFO opened so is written through Go's poller:
// a write to a reader that stopped reading parks the writing goroutine,
// and closing the file wakes it.
func openAppend(path string) (fileHandle, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NONBLOCK, 0o644)
}

// noReader reports whether err is a FIFO's open with no reader.
func noReader(err error) bool { return errors.Is(err, syscall.ENXIO) }
