package gpu

import (
	"errors"
	"strings"

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
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_energy_info", Help: "Energy measurement state (on/off) and the reason: nvml, dcgm (on); disabled, nvml_unavailable, no_cgo, no_nvml_tag, dcgm_unavailable, no_devices (off)."}, []string{"state", "reason"})
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
	case errors.Is(err, ErrNoNVML) && strings.Contains(err.Error(), "CGO_ENABLED=0"):
		return "no_cgo"
	case errors.Is(err, ErrNoNVML) && strings.Contains(err.Error(), "-tags nvml"):
		return "no_nvml_tag"
	case errors.Is(err, ErrNoNVML):
		return "nvml_unavailable"
	}
	return "nvml_unavailable"
}
