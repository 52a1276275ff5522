package config

import (
	"fmt"
	"net/url"
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
	// Enabled is auto (default: on when a source works), on (say loudly
	// when none does) or off.
	Enabled string `yaml:"enabled"`
	// Source is where the energy is read: nvml (the GPUs this container
	// sees), dcgm (the node's dcgm-exporter), auto (NVML, then DCGM when
	// its URL is configured or derivable) or off. Empty means auto.
	Source string `yaml:"source"`
	// DCGM locates the node's dcgm-exporter and this pod's GPUs in it.
	DCGM DCGM `yaml:"dcgm"`
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

// DCGM is where the node's dcgm-exporter is and which of its GPUs are
// this pod's (docs/energy.md, "DCGM exporter").
//
// The zero value derives everything from the environment the chart sets
// through the downward API: the URL from TOKENTAP_DCGM_URL, else
// http://$NODE_IP:9400/metrics; the pod and namespace from POD_NAME and
// POD_NAMESPACE. Devices (energy.devices, else NVIDIA_VISIBLE_DEVICES)
// select by UUID or index instead of by pod when set.
type DCGM struct {
	// URL of the exporter's metrics, e.g. http://10.0.0.7:9400/metrics.
	URL string `yaml:"url"`
	// Pod and Namespace name the pod whose GPUs are read (the exporter
	// labels each GPU with the pod it is assigned to).
	Pod       string `yaml:"pod"`
	Namespace string `yaml:"namespace"`
	// MaxBytes bounds one page of the exporter: a larger one (or one
	// that never ends) is refused and counted (dcgm_too_large). 0 means
	// 4 MiB; at most 1 GiB. Each scrape, the page read included, is also
	// bounded in time by the energy interval (dcgm_timeout).
	MaxBytes int64 `yaml:"max_bytes"`
}

// Validate returns one error per problem, naming the field.
func (c Energy) Validate() []error {
	var errs []error
	switch c.Enabled {
	case "", "auto", "on", "off":
	default:
		errs = append(errs, fmt.Errorf("energy.enabled: must be auto, on or off, got %q", c.Enabled))
	}
	switch c.Source {
	case "", "auto", "nvml", "dcgm", "off":
	default:
		errs = append(errs, fmt.Errorf("energy.source: must be auto, nvml, dcgm or off, got %q", c.Source))
	}
	if u := c.DCGM.URL; u != "" {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("energy.dcgm.url: must be an http(s) URL such as http://10.0.0.7:9400/metrics, got %q", u))
		}
	}
	if m := c.DCGM.MaxBytes; m != 0 && (m < 4096 || m > 1<<30) {
		errs = append(errs, fmt.Errorf("energy.dcgm.max_bytes: must be from 4096 to 1073741824 (1 GiB; 0: 4 MiB), got %d", m))
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
