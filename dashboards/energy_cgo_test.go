//go:build cgo && nvml

package dashboards_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tokentap/tokentap/app"
	"github.com/tokentap/tokentap/gpu"
)

// startSyntheticGPUSidecar runs a second sidecar in-process, in front of
// its own simulator, whose GPUs are go-nvml's DGX H100 mock. EVERY ENERGY
// NUMBER IT EXPORTS IS SYNTHETIC: the mock's energy counters rise by a
// made-up amount per read (about 350 W a GPU at the 200 ms interval);
// they exist only so that the energy panels' queries run on real series
// with the real names and labels. Its scrape job says so.
func startSyntheticGPUSidecar(t *testing.T, dir string) (admin, proxy string) {
	t.Log("**** SYNTHETIC GPU: the energy series come from go-nvml's mock (dgxh100), not from a GPU ****")
	srv := dgxh100.New()
	for i, dev := range srv.Devices {
		d := dev.(*server.Device)
		var mJ, reads atomic.Uint64
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			// GPU 0 also fails a read now and then, and its counter
			// restarts once (a driver reload), so that the sampling-health
			// series exist.
			if n := reads.Add(1); i == 0 && n%25 == 0 {
				return 0, nvml.ERROR_UNKNOWN
			} else if i == 0 && n == 40 {
				mJ.Store(0)
			}
			return mJ.Add(uint64(70_000 + 1_000*i)), nvml.SUCCESS
		}
		d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			if i == 0 && reads.Load()%25 == 0 { // the same failed sample: no reading at all
				return 0, nvml.ERROR_UNKNOWN
			}
			return 350_000, nvml.SUCCESS
		}
		d.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 5120, nvml.SUCCESS }
		d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 2619, nvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 80}, nvml.SUCCESS }
		d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 60, nvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	}
	cfg := filepath.Join(dir, "tokentap-gpu.yaml")
	os.WriteFile(cfg, []byte(sidecarConfig+`
energy:
  enabled: on
  interval: 200ms
  idle_power_watts: 2400
  models:
    llama: {weight_bytes: 16.06e9, kv_bytes_per_token: 131072}
    qwen: {weight_bytes: 15.2e9, kv_bytes_per_token: 57344}
`), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan app.Addrs, 1)
	done := make(chan error, 1)
	env := app.Env{
		Getenv: func(string) string { return "" }, Stdout: io.Discard, Stderr: io.Discard,
		Ready:   func(a app.Addrs) { ready <- a },
		OpenGPU: func(sel []string, none bool) (gpu.Source, error) { return gpu.NewNVML(srv, sel, none) },
	}
	args := []string{"--config", cfg, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--records", filepath.Join(dir, "records-gpu.jsonl"), "--shutdown-grace", "2s"}
	go func() { done <- app.Run(ctx, args, env) }()
	var a app.Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("synthetic-GPU sidecar did not start: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("synthetic-GPU sidecar did not start in 15 s")
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return a.Admin, a.Proxy
}
