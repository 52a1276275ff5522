//go:build cgo && nvml

package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tokentap/tokentap/gpu"
)

// The whole path with a mock GPU: a DGX H100 mock whose energy counter
// rises 200 J every 100 ms sample (2 kW) while a request streams; the
// record carries energy_j from the counter, and /metrics the GPU series.
func TestEnergyEndToEndWithMockGPU(t *testing.T) {
	srv := dgxh100.New()
	for _, dev := range srv.Devices {
		d := dev.(*server.Device)
		var mJ atomic.Uint64 // each GPU's own counter: 25 J per read, 8 GPUs: 200 J per sample
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return mJ.Add(25_000), nvml.SUCCESS }
		d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 250_000, nvml.SUCCESS }
		d.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 5120, nvml.SUCCESS }
		d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 2619, nvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 90}, nvml.SUCCESS }
		d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 61, nvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/health" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 6; i++ {
			io.WriteString(w, `data: {"choices":[{"delta":{"content":"x"}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		io.WriteString(w, `data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":6}}`+"\n\ndata: [DONE]\n\n")
	}))
	defer us.Close()
	dir := t.TempDir()
	cfg := dir + "/c.yaml"
	os.WriteFile(cfg, []byte("energy:\n  enabled: on\n  interval: 100ms\n  models:\n    m: {weight_bytes: 16e9, kv_bytes_per_token: 131072}\n"), 0o644)
	otlp, query, _ := startJaeger(t) // the span carries the energy too
	otelEnv(t, otlp)
	a, records := startSidecarEnv(t, us.URL, func(e *Env) {
		e.Getenv = os.Getenv
		e.OpenGPU = func(sel []string, none bool) (gpu.Source, error) { return gpu.NewNVML(srv, sel, none) }
	}, "--config", cfg)
	resp, err := http.Post("http://"+a.Proxy+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	var rec struct {
		EnergyJ      float64 `json:"energy_j"`
		EnergySource string  `json:"energy_source"`
		TraceID      string  `json:"trace_id"`
		SOL          float64 `json:"decode_sol_ratio"`
	}
	waitUntil(t, "the record, written after its last interval", 5*time.Second, func() bool {
		b, _ := os.ReadFile(records)
		return len(b) > 0 && json.Unmarshal(b[:strings.IndexByte(string(b), '\n')], &rec) == nil
	})
	t.Logf("record: energy_j %.1f from %s, decode_sol_ratio %.5f", rec.EnergyJ, rec.EnergySource, rec.SOL)
	// About 6 × 100 ms of streaming at 2 kW (200 J per 100 ms interval),
	// the request alone in flight: several hundred joules, by the counter.
	if rec.EnergySource != "counter" || rec.EnergyJ < 400 || rec.EnergyJ > 2000 {
		t.Fatalf("record energy %v J from %q; want ~1 kJ from the counter", rec.EnergyJ, rec.EnergySource)
	}
	// The decode ceiling: 8 GPUs × 3.35 TB/s over 16 GB of weights and a
	// little KV; a 100 ms TPOT is a tiny fraction of it.
	if rec.SOL <= 0 || rec.SOL > 0.01 {
		t.Fatalf("decode speed-of-light ratio %v", rec.SOL)
	}
	tr := getTrace(t, query, rec.TraceID, 2, 15*time.Second)
	if tr == nil {
		t.Fatal("no trace for the request")
	}
	if _, c := byKind(tr); c.tag("tokentap.energy_j") != rec.EnergyJ || c.tag("tokentap.energy_source") != "counter" {
		t.Errorf("span energy %v (%v), record %v", c.tag("tokentap.energy_j"), c.tag("tokentap.energy_source"), rec.EnergyJ)
	}
	m := scrape(t, a.Admin)
	for _, want := range []string{"tokentap_energy_enabled 1", `tokentap_energy_info{reason="nvml",state="on"} 1`,
		`tokentap_gpu_power_watts{gpu="0"`, `tokentap_request_energy_per_token_joules_count{gen_ai_request_model="m"`, `tokentap_decode_ceiling_tokens_per_second{gen_ai_request_model="m"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
