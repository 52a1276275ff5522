//go:build !cgo

package dashboards_test

import "testing"

// startSyntheticGPUSidecar: without cgo there is no NVML, not even its
// mock, so the energy panels are exceptions (see energyQueries).
func startSyntheticGPUSidecar(t *testing.T, dir string) (admin, proxy string) {
	t.Log("no cgo: the energy panels are not checked (the NVML mock needs cgo)")
	return "", ""
}
