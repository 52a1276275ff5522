// Package gpu reads GPU energy and power through NVML and attributes the
// energy to the requests in flight (docs/measurement.md §8): joules per token
// per window and per request, with the idle baseline kept apart.
//
// NVML sits behind the narrow Source interface. The NVML implementation
// needs cgo (go-nvml loads libnvidia-ml.so.1 at run time) and the nvml
// build tag (go-nvml's compile is noisy: docs/energy.md, "Builds"); a
// build without either, or a machine without a GPU or driver, gets a
// Source error instead, and the sidecar runs on without energy.
package gpu

import (
	"errors"
	"strings"
	"time"
)

// DeviceInfo describes one selected GPU.
type DeviceInfo struct {
	Index int
	UUID  string
	Name  string
	// MemBusWidthBits and MaxMemClockMHz give the peak memory bandwidth;
	// zero when NVML does not report them.
	MemBusWidthBits uint32
	MaxMemClockMHz  uint32
}

// PeakMemBandwidth is the peak memory bandwidth in bytes/s: bus width in
// bytes × max memory clock × 2 transfers per clock (NVML reports the
// memory clock of DDR/HBM memories at half the transfer rate). For an H100
// SXM (5120 bits, 2619 MHz) it gives 3.35 TB/s, the datasheet figure.
func (d DeviceInfo) PeakMemBandwidth() float64 {
	return float64(d.MemBusWidthBits) / 8 * float64(d.MaxMemClockMHz) * 1e6 * 2
}

// Reading is one sample of one GPU. Has* say which fields were read.
type Reading struct {
	EnergyMJ  uint64 // total energy since the driver loaded, mJ
	HasEnergy bool
	PowerMW   uint32 // instant power where supported, else NVML's averaged power
	HasPower  bool
	Instant   bool // PowerMW is the instant reading (field FI_DEV_POWER_INSTANT)

	UtilGPU     uint32 // percent
	MemUsed     uint64 // bytes
	SMClockMHz  uint32
	MemClockMHz uint32
	TempC       uint32
	Throttle    uint64 // clock event (throttle) reasons bitmask
}

// Source reads the selected GPUs.
type Source interface {
	Devices() []DeviceInfo
	// Read samples device i (an index into Devices()). An error means
	// the sample is missing; the sampler skips it and counts it.
	Read(i int) (Reading, error)
	Close() error
}

// ErrNoNVML is wrapped by Open's error when NVML cannot be used at all.
var ErrNoNVML = errors.New("NVML is not available")

// Selection resolves which GPUs to read: the configured list if any, else
// NVIDIA_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES; nil means all.
// Entries are indices or UUIDs. "none" and "void" select nothing.
func Selection(configured []string, getenv func(string) string) (sel []string, none bool) {
	if len(configured) > 0 {
		return configured, false
	}
	for _, v := range []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} {
		s := strings.TrimSpace(getenv(v))
		switch s {
		case "":
			continue
		case "all":
			return nil, false
		case "none", "void":
			return nil, true
		}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				sel = append(sel, p)
			}
		}
		return sel, false
	}
	return nil, false
}

// selected reports whether a device matches the selection.
func selected(sel []string, index string, uuid string) bool {
	if sel == nil {
		return true
	}
	for _, s := range sel {
		if s == index || s == uuid || (strings.HasPrefix(s, "GPU-") && strings.HasPrefix(uuid, s)) {
			return true
		}
	}
	return false
}

// Clock is the time source of the sampler.
type Clock interface{ Now() time.Time }
