//go:build cgo && nvml

package gpu

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Open loads NVML and selects the GPUs. On a machine without the driver
// it returns an error wrapping ErrNoNVML that says why.
func Open(selection []string, none bool) (Source, error) {
	return NewNVML(nvml.New(), selection, none)
}

type nvmlSource struct {
	lib   nvml.Interface
	devs  []nvml.Device
	infos []DeviceInfo
}

// NewNVML reads GPUs through lib (nvml.New() in production, go-nvml's
// mocks in tests).
func NewNVML(lib nvml.Interface, selection []string, none bool) (s Source, err error) {
	defer func() { // a library that cannot load can panic inside go-nvml
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%w: %v", ErrNoNVML, r)
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: init: %s", ErrNoNVML, nvml.ErrorString(ret))
	}
	src := &nvmlSource{lib: lib}
	if none {
		return src, nil
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("%w: device count: %s", ErrNoNVML, nvml.ErrorString(ret))
	}
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, _ := d.GetUUID()
		if !selected(selection, strconv.Itoa(i), uuid) {
			continue
		}
		name, _ := d.GetName()
		info := DeviceInfo{Index: i, UUID: uuid, Name: name}
		if w, ret := d.GetMemoryBusWidth(); ret == nvml.SUCCESS {
			info.MemBusWidthBits = w
		}
		if c, ret := d.GetMaxClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
			info.MaxMemClockMHz = c
		}
		src.devs = append(src.devs, d)
		src.infos = append(src.infos, info)
	}
	return src, nil
}

func (s *nvmlSource) Devices() []DeviceInfo { return s.infos }

func (s *nvmlSource) Close() error {
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}

// Read samples one GPU: the energy counter, the power (instant where the
// field is supported, else the averaged reading), and the stats.
func (s *nvmlSource) Read(i int) (r Reading, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("gpu %d: %v", s.infos[i].Index, p)
		}
	}()
	d := s.devs[i]
	if e, ret := d.GetTotalEnergyConsumption(); ret == nvml.SUCCESS {
		r.EnergyMJ, r.HasEnergy = e, true
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_POWER_INSTANT}}
	if ret := d.GetFieldValues(fv); ret == nvml.SUCCESS && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		r.PowerMW, r.HasPower, r.Instant = binary.LittleEndian.Uint32(fv[0].Value[:4]), true, true
	} else if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
		r.PowerMW, r.HasPower = p, true
	}
	if !r.HasEnergy && !r.HasPower {
		_, ret := d.GetPowerUsage()
		return r, fmt.Errorf("gpu %d: no energy or power reading: %s", s.infos[i].Index, nvml.ErrorString(ret))
	}
	if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
		r.UtilGPU = u.Gpu
	}
	if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		r.MemUsed = m.Used
	}
	r.SMClockMHz, _ = d.GetClockInfo(nvml.CLOCK_SM)
	r.MemClockMHz, _ = d.GetClockInfo(nvml.CLOCK_MEM)
	r.TempC, _ = d.GetTemperature(nvml.TEMPERATURE_GPU)
	r.Throttle, _ = d.GetCurrentClocksEventReasons()
	return r, nil
}
