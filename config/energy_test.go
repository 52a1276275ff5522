package config

import (
	"strings"
	"testing"
)

func TestEnergySourceValidate(t *testing.T) {
	cases := []struct {
		e    Energy
		want string // "" means valid
	}{
		{Energy{}, ""},
		{Energy{Source: "auto"}, ""},
		{Energy{Source: "nvml"}, ""},
		{Energy{Source: "dcgm", DCGM: DCGM{URL: "http://10.0.0.7:9400/metrics", Pod: "vllm-0", Namespace: "llm"}}, ""},
		{Energy{Source: "off"}, ""},
		{Energy{Source: "dcmg"}, `energy.source: must be auto, nvml, dcgm or off, got "dcmg"`},
		{Energy{Source: "dcgm", DCGM: DCGM{URL: "10.0.0.7:9400"}}, "energy.dcgm.url: must be an http(s) URL"},
		{Energy{DCGM: DCGM{URL: "ftp://x/metrics"}}, "energy.dcgm.url: must be an http(s) URL"},
		{Energy{DCGM: DCGM{MaxBytes: 64 << 20}}, ""},
		{Energy{DCGM: DCGM{MaxBytes: 100}}, "energy.dcgm.max_bytes: must be from 4096 to 1073741824"},
		{Energy{DCGM: DCGM{MaxBytes: 2 << 30}}, "energy.dcgm.max_bytes: must be from 4096 to 1073741824"},
		{Energy{DCGM: DCGM{MaxBytes: -1}}, "energy.dcgm.max_bytes: must be from 4096 to 1073741824"},
	}
	for _, c := range cases {
		errs := c.e.Validate()
		switch {
		case c.want == "" && len(errs) > 0:
			t.Errorf("%+v: unexpected %v", c.e, errs)
		case c.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want)):
			t.Errorf("%+v: got %v, want one error containing %q", c.e, errs, c.want)
		}
	}
}
