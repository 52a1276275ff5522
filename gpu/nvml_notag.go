//go:build cgo && !nvml

package gpu

import "fmt"

// Open always fails in a build without the nvml tag: NVML is read
// through go-nvml, whose cgo compile prints pages of its C header's
// deprecation warnings, so it is built only when asked for (go build
// -tags nvml, as the container image is; docs/energy.md, "Builds"). The
// sidecar runs on without energy, or reads the node's DCGM exporter.
func Open(selection []string, none bool) (Source, error) {
	return nil, fmt.Errorf("%w: this binary was built without the nvml tag (go build -tags nvml)", ErrNoNVML)
}
