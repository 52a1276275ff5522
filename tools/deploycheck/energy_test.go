package deploycheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The chart's energy options (docs/deploy.md, "Energy"): the engine's GPUs
// made visible to the sidecar for NVML, and the node's DCGM exporter
// located through the downward API. Each renders, decodes strictly, and
// its configuration is accepted by the sidecar.
func TestHelmChartEnergy(t *testing.T) {
	helm := need(t, "helm")
	dcgmEnv := []string{"NODE_IP=fieldRef:status.hostIP", "POD_NAME=fieldRef:metadata.name",
		"POD_NAMESPACE=fieldRef:metadata.namespace", "TOKENTAP_DCGM_URL=http://$(NODE_IP):9400/metrics"}
	cases := []struct {
		name   string
		sets   []string
		source string   // energy.source in the rendered configuration
		env    []string // the sidecar's env, in order: NAME=value or NAME=fieldRef:path
	}{
		{"defaults: no energy settings", nil, "", nil},
		{"NVML: the engine's GPUs visible to the sidecar",
			[]string{"tokentap.energy.source=nvml", "tokentap.energy.visibleDevices=all"}, "nvml",
			[]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"}},
		{"DCGM: the exporter URL from the downward API, the user's env after it",
			[]string{"tokentap.energy.source=dcgm", "tokentap.env[0].name=TZ", "tokentap.env[0].value=UTC"}, "dcgm",
			append(append([]string{}, dcgmEnv...), "TZ=UTC")},
		{"auto: both, another exporter port",
			[]string{"tokentap.energy.source=auto", "tokentap.energy.visibleDevices=GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "tokentap.energy.dcgm.port=9500"}, "auto",
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "NVIDIA_DRIVER_CAPABILITIES=utility",
				dcgmEnv[0], dcgmEnv[1], dcgmEnv[2], "TOKENTAP_DCGM_URL=http://$(NODE_IP):9500/metrics"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := decodeAll(t, "helm template", helmTemplate(t, helm, c.sets...))
			if len(o.deployments) != 1 {
				t.Fatalf("%d Deployments", len(o.deployments))
			}
			side := checkSidecarPod(t, "helm template", o.deployments[0])
			var got []string
			for _, e := range side.Env {
				got = append(got, envString(e))
			}
			if strings.Join(got, "\n") != strings.Join(c.env, "\n") {
				t.Errorf("sidecar env:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.env, "\n"))
			}
			for _, cm := range o.configMaps {
				text := cm.Data["tokentap.yaml"]
				if text == "" {
					continue
				}
				var cfg struct {
					Energy struct {
						Source string `json:"source"`
					} `json:"energy"`
				}
				if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
					t.Fatal(err)
				}
				if cfg.Energy.Source != c.source {
					t.Errorf("energy.source %q, want %q", cfg.Energy.Source, c.source)
				}
				if c.source != "" {
					checkConfig(t, "the chart's tokentap.yaml", text)
				}
			}
		})
	}
}

func envString(e corev1.EnvVar) string {
	if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
		return e.Name + "=fieldRef:" + e.ValueFrom.FieldRef.FieldPath
	}
	return e.Name + "=" + e.Value
}
