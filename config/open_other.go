//go:build !unix

package config

import "os"

// openConfig opens path for reading (readFile has stat'ed it).
func openConfig(path string) (*os.File, error) { return os.Open(path) }
