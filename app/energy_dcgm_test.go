package app

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/gpu"
)

// energy.source auto in a pod whose sidecar sees no GPU: NVML fails, the
// node's DCGM exporter (its URL from the environment the chart sets) has
// this pod's GPUs, and energy is on through it. With the exporter
// unreachable, energy is off, said once, counted, and the proxy runs on.
func TestEnergyAutoFallsBackToDCGM(t *testing.T) {
	fixture, err := os.ReadFile("../gpu/testdata/dcgm-exporter-2nodes.prom")
	if err != nil {
		t.Fatal(err)
	}
	exp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(fixture) }))
	t.Cleanup(exp.Close) // after the sidecars' last samples
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String() + "/metrics"
	ln.Close()
	us := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer us.Close()
	for _, c := range []struct {
		url  string
		want []string
	}{
		{exp.URL + "/metrics", []string{"tokentap_energy_enabled 1", `tokentap_energy_info{reason="dcgm",state="on"} 1`,
			`tokentap_gpu_power_watts{gpu="1",name="NVIDIA H100 80GB HBM3",uuid="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"} 398.25`}},
		{closed, []string{"tokentap_energy_enabled 0", `tokentap_energy_info{reason="dcgm_unavailable",state="off"} 1`,
			`tokentap_gpu_source_errors_total{reason="energy_off"} 1`}},
	} {
		env := map[string]string{"TOKENTAP_DCGM_URL": c.url, "POD_NAME": "vllm-0", "POD_NAMESPACE": "llm"}
		a, _ := startSidecarEnv(t, us.URL, func(e *Env) {
			e.Getenv = func(k string) string { return env[k] }
			e.OpenGPU = func([]string, bool) (gpu.Source, error) {
				return nil, fmt.Errorf("%w: no GPU in this container", gpu.ErrNoNVML)
			}
		})
		var m string
		waitUntil(t, "the first sample", 5*time.Second, func() bool {
			m = scrape(t, a.Admin)
			return strings.Contains(m, c.want[len(c.want)-1])
		})
		for _, want := range c.want {
			if !strings.Contains(m, want) {
				t.Errorf("%s: /metrics lacks %s", c.url, want)
			}
		}
		if resp, err := http.Get("http://" + a.Proxy + "/v1/models"); err != nil {
			t.Errorf("the proxy does not run on: %v", err)
		} else {
			resp.Body.Close()
		}
	}
}
