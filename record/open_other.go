//go:build !unix

package record

import "os"

// openAppend opens path for appending, creating it (mode 0644).
func openAppend(path string) (fileHandle, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}

// noReader reports false: there are no FIFOs to wait for here.
func noReader(error) bool { return false }
