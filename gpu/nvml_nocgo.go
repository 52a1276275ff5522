//go:build !cgo

package gpu

import "fmt"

// Open always fails in a build without cgo: go-nvml needs it to load
// libnvidia-ml.so.1. The sidecar runs on without energy.
func Open(selection []string, none bool) (Source, error) {
	return nil, fmt.Errorf("%w: this binary was built with CGO_ENABLED=0", ErrNoNVML)
}
