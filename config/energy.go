package config

import (
	"fmt"
	"time"
)

// ModelSpec describes a model for the decode speed-of-light ceiling.
type ModelSpec struct {
	WeightBytes     float64 `yaml:"weight_bytes"`
	KVBytesPerToken float64 `yaml:"kv_bytes_per_token"`
}

// Energy is the energy section (docs/energy.md).
//
// The zero value is auto-detect, every visible GPU, 1 s sampling,
// prefill weight 0.1 and a learned idle baseline.
type Energy struct {
	// Enabled is auto (default: on when NVML works), on (say loudly
	// when it does not) or off.
	Enabled string `yaml:"enabled"`
	// Devices are GPU indices or UUIDs; empty means NVIDIA_VISIBLE_DEVICES,
	// else CUDA_VISIBLE_DEVICES, else all.
	Devices []string `yaml:"devices"`
	// Interval between samples; 0 means 1s (see docs/energy.md: NVML
	// refreshes its power readings about every 100 ms and its averaged
	// power over one second; a window shorter than the counter's update
	// reads 0 J).
	Interval time.Duration `yaml:"interval"`
	// PrefillWeight is what one prompt token weighs against one output
	// token when an interval's energy is shared; 0 means 0.1.
	PrefillWeight float64 `yaml:"prefill_weight"`
	// IdlePowerWatts fixes the idle baseline; 0 learns it from intervals
	// with no request in flight.
	IdlePowerWatts float64 `yaml:"idle_power_watts"`
	// Models give weight and KV bytes for the decode speed-of-light.
	Models map[string]ModelSpec `yaml:"models"`
}

// Validate returns one error per problem, naming the field.
func (c Energy) Validate() []error {
	var errs []error
	switch c.Enabled {
	case "", "auto", "on", "off":
	default:
		errs = append(errs, fmt.Errorf("energy.enabled: must be auto, on or off, got %q", c.Enabled))
	}
	if c.Interval != 0 && c.Interval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("energy.interval: must be at least 100ms (NVML refreshes power about every 100 ms), got %v", c.Interval))
	}
	if c.PrefillWeight < 0 {
		errs = append(errs, fmt.Errorf("energy.prefill_weight: must not be negative"))
	}
	if c.IdlePowerWatts < 0 {
		errs = append(errs, fmt.Errorf("energy.idle_power_watts: must not be negative"))
	}
	for m, s := range c.Models {
		if s.WeightBytes <= 0 || s.KVBytesPerToken < 0 {
			errs = append(errs, fmt.Errorf("energy.models.%s: weight_bytes must be positive and kv_bytes_per_token not negative", m))
		}
	}
	return errs
}
