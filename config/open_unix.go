//go:build unix

package config

import (
	"os"
	"syscall"
)

// openConfig opens path for reading without blocking: O_NONBLOCK makes
// open(2) of a FIFO with no writer return at once (readFile then
// refuses it), and changes nothing for a regular file.
func openConfig(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
