//go:build cgo && !nvml

package gpu

import (
	"errors"
	"testing"
)

// A cgo build without the nvml tag has no NVML, says how to get it, and
// exports why energy is off.
func TestOpenWithoutTheNVMLTag(t *testing.T) {
	src, err := Open(nil, false)
	if src != nil || !errors.Is(err, ErrNoNVML) || Reason(err) != "no_nvml_tag" {
		t.Errorf("Open: %v, %v (reason %q)", src, err, Reason(err))
	}
}
