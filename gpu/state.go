package gpu

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Energy states, exported as tokentap_energy_info{state,reason}.
const (
	StateOn  = "on"
	StateOff = "off"
)

// ExportState registers tokentap_energy_enabled (1/0) and
// tokentap_energy_info{state,reason} = 1, so a dashboard can say why
// there is no J/token instead of showing an empty panel.
func ExportState(reg prometheus.Registerer, state, reason string) {
	on := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokentap_energy_enabled", Help: "1 when GPU energy is measured, 0 when it is off (see tokentap_energy_info for why)."})
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_energy_info", Help: "Energy measurement state (on/off) and the reason: nvml, disabled, nvml_unavailable, no_cgo, no_devices."}, []string{"state", "reason"})
	reg.MustRegister(on, info)
	if state == StateOn {
		on.Set(1)
	}
	info.WithLabelValues(state, reason).Set(1)
}

// Reason classifies why Open failed, as a bounded label value.
func Reason(err error) string {
	switch {
	case err == nil:
		return "nvml"
	case errors.Is(err, ErrNoNVML) && containsCgo(err.Error()):
		return "no_cgo"
	case errors.Is(err, ErrNoNVML):
		return "nvml_unavailable"
	}
	return "nvml_unavailable"
}

func containsCgo(s string) bool {
	for i := 0; i+len("CGO_ENABLED=0") <= len(s); i++ {
		if s[i:i+len("CGO_ENABLED=0")] == "CGO_ENABLED=0" {
			return true
		}
	}
	return false
}

// Validate returns one error per problem, naming the field.
func (c Config) Validate() []error {
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
