//go:build cgo && nvml

package gpu

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// script feeds a mock GPU its energy and power readings, one step per
// sample; a Return other than SUCCESS makes that reading fail.
type script struct {
	mu     sync.Mutex
	step   int
	energy []uint64 // mJ; nil: the counter is not supported
	power  []uint32 // mW
	fail   map[int]nvml.Return
}

func (s *script) at() (int, nvml.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.fail[s.step]; ok {
		return s.step, r
	}
	return s.step, nvml.SUCCESS
}

func (s *script) next() { s.mu.Lock(); s.step++; s.mu.Unlock() }

// mockServer is a DGX H100 of n GPUs whose power functions the scripts
// drive (the mock servers leave them unset: the test must set them).
func mockServer(t *testing.T, scripts ...*script) *server.Server {
	t.Helper()
	cfgs := make([]gpus.Config, len(scripts))
	for i := range cfgs {
		cfgs[i] = gpus.H100_SXM5_80GB
	}
	srv := dgxh100.NewWithGPUs(cfgs...)
	for i, sc := range scripts {
		d := srv.Devices[i].(*server.Device)
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			k, ret := sc.at()
			if ret != nvml.SUCCESS || sc.energy == nil {
				return 0, map[bool]nvml.Return{true: ret, false: nvml.ERROR_NOT_SUPPORTED}[ret != nvml.SUCCESS]
			}
			return sc.energy[k], nvml.SUCCESS
		}
		d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			k, ret := sc.at()
			if ret != nvml.SUCCESS {
				return 0, ret
			}
			return sc.power[k], nvml.SUCCESS
		}
		d.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 5120, nvml.SUCCESS }
		d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 2619, nvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 50}, nvml.SUCCESS }
		d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 60, nvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	}
	return srv
}

// sampler over the mock: Tick(k) samples at k seconds after t0 and moves
// every script to its next step.
type rig struct {
	s       *Sampler
	scripts []*script
	t0      time.Time
	reg     *prometheus.Registry
	written []*record.Record
}

func newRig(t *testing.T, cfg Config, scripts ...*script) *rig {
	src, err := NewNVML(mockServer(t, scripts...), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{scripts: scripts, t0: time.Unix(1000, 0), reg: prometheus.NewRegistry()}
	r.s = NewSampler(src, cfg, r.reg)
	return r
}

// hold holds rec for h as the pipeline does: once attributed, the record
// is "written".
func (r *rig) hold(h pipeline.EnergyShare, rec *record.Record) {
	h.Hold(rec, func() { r.written = append(r.written, rec) })
}

func (r *rig) tick(sec float64) {
	r.s.Tick(r.t0.Add(time.Duration(sec * float64(time.Second))))
	for _, sc := range r.scripts {
		sc.next()
	}
}

func (r *rig) energyTotal(gpu string) float64 {
	return testutil.ToFloat64(r.s.energyTotal.WithLabelValues(gpu, r.s.src.Devices()[0].UUID, r.s.src.Devices()[0].Name))
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6 {
		t.Errorf("%s = %.9f, want %.9f", what, got, want)
	}
}

func TestEnergyCounterPath(t *testing.T) {
	r := newRig(t, Config{}, &script{energy: []uint64{5_000_000, 5_300_000, 5_750_000}, power: []uint32{300_000, 300_000, 450_000}})
	r.tick(0)
	r.tick(1)
	r.tick(2)
	// Counter deltas: 300 J then 450 J.
	near(t, "energy", r.energyTotal("0"), 750)
	near(t, "power gauge", testutil.ToFloat64(r.s.power.WithLabelValues("0", r.s.src.Devices()[0].UUID, r.s.src.Devices()[0].Name)), 450)
	// Peak bandwidth from the bus width and max memory clock: 5120/8 × 2619 MHz × 2.
	near(t, "peak bandwidth", r.s.src.Devices()[0].PeakMemBandwidth(), 5120.0/8*2619e6*2)
}

func TestPowerIntegrationFallback(t *testing.T) {
	// No energy counter: the trapezoid of 200 W and 400 W over 1 s is
	// 300 J; then 400 W and 400 W over 0.5 s is 200 J.
	r := newRig(t, Config{}, &script{energy: nil, power: []uint32{200_000, 400_000, 400_000}})
	r.tick(0)
	r.tick(1)
	r.tick(1.5)
	near(t, "energy", r.energyTotal("0"), 500)
}

func TestCounterWrapOrReset(t *testing.T) {
	// 1000 J by the counter; then the counter goes backwards (a wrap or
	// a driver reload): that interval integrates 250 W over 1 s = 250 J;
	// then the counter again: 1 J.
	r := newRig(t, Config{}, &script{energy: []uint64{1_000_000, 2_000_000, 500, 1_500}, power: []uint32{250_000, 250_000, 250_000, 250_000}})
	for i := 0; i < 4; i++ {
		r.tick(float64(i))
	}
	near(t, "energy", r.energyTotal("0"), 1000+250+1)
	if got := testutil.ToFloat64(r.s.resets.WithLabelValues("0")); got != 1 {
		t.Errorf("resets %v, want 1", got)
	}
}

func TestGPUErrorMidRun(t *testing.T) {
	// GPU 0 is lost at the third sample (every reading fails), then comes
	// back. The counter carries its energy over the gap: 100 J, then 300 J
	// across the failed sample. GPU 1 reads throughout: 50 J a second.
	lost := &script{energy: []uint64{0, 100_000, 0, 400_000}, power: []uint32{1, 1, 1, 1}, fail: map[int]nvml.Return{2: nvml.ERROR_GPU_IS_LOST}}
	fine := &script{energy: []uint64{0, 50_000, 100_000, 150_000}, power: []uint32{1, 1, 1, 1}}
	r := newRig(t, Config{}, lost, fine)
	for i := 0; i < 4; i++ {
		r.tick(float64(i))
	}
	near(t, "gpu 0 energy", r.energyTotal("0"), 400)
	d1 := r.s.src.Devices()[1]
	near(t, "gpu 1 energy", testutil.ToFloat64(r.s.energyTotal.WithLabelValues("1", d1.UUID, d1.Name)), 150)
	if got := testutil.ToFloat64(r.s.readErrors.WithLabelValues("0")); got != 1 {
		t.Errorf("read errors %v, want 1", got)
	}
}

// Attribution across overlapping requests, derived by hand. One GPU, its
// counter read at 0, 1, 2, 3, 4, 5 s; prefill_weight 0.1.
//
//	[0,1] 100 J, no request in flight: idle; baseline learned 100 W.
//	A (prompt ≈ 100 tokens) and B (≈ 50) start.
//	[1,2] 500 J. A: 10 tokens, first token → weight 10 + 0.1×100 = 20.
//	      B: 30 tokens, first token → 30 + 0.1×50 = 35. Sum 55.
//	      A 500×20/55 = 181.818 J, B 318.182 J. Dynamic 500 − 100×1 = 400:
//	      A 145.455, B 254.545. B ends in this interval: written at 2 s.
//	C (prompt 0) starts and ends inside [2,3]: shorter than one interval.
//	[2,3] 300 J. A: 5 tokens, C: 5 tokens → 150 J each; dynamic 200: 100 each.
//	[3,4] 200 J. A ends having produced nothing: no weight → unattributed.
//	[4,5] 80 J, nothing in flight: idle; baseline 0.9×100 + 0.1×80 = 98 W.
//
// A: 181.818 + 150 = 331.818 J (dynamic 245.455); C: 150 J (dynamic 100).
func TestAttributionAcrossOverlappingRequests(t *testing.T) {
	r := newRig(t, Config{PrefillWeight: 0.1}, &script{
		energy: []uint64{0, 100_000, 600_000, 900_000, 1_100_000, 1_180_000}, power: []uint32{1, 1, 1, 1, 1, 1}})
	rec := func(model string, out int64) *record.Record {
		x := record.New(0)
		x.Model, x.OutputTokens = model, out
		return x
	}
	r.tick(0)
	r.tick(1)
	near(t, "idle baseline", r.s.idleW, 100)
	a, b := r.s.Start(100), r.s.Start(50)
	a.Tokens(10)
	b.Tokens(30)
	recB := rec("b", 30)
	r.hold(b, recB)
	if len(r.written) != 0 {
		t.Fatal("a record was written before its last interval was attributed")
	}
	r.tick(2)
	near(t, "B energy", recB.EnergyJ, 500*35.0/55)
	near(t, "B dynamic", recB.EnergyDynamicJ, 400*35.0/55)
	c := r.s.Start(0)
	a.Tokens(5)
	c.Tokens(5)
	recC := rec("c", 5)
	r.hold(c, recC)
	r.tick(3)
	near(t, "C energy (shorter than one interval)", recC.EnergyJ, 150)
	near(t, "C dynamic", recC.EnergyDynamicJ, 100)
	recA := rec("a", 15)
	r.hold(a, recA)
	r.tick(4)
	near(t, "A energy", recA.EnergyJ, 500*20.0/55+150)
	near(t, "A dynamic", recA.EnergyDynamicJ, 400*20.0/55+100)
	r.tick(5)
	near(t, "unattributed", testutil.ToFloat64(r.s.unattributed), 200)
	near(t, "idle", testutil.ToFloat64(r.s.idle), 180)
	near(t, "attributed", testutil.ToFloat64(r.s.attributed), 800)
	near(t, "idle baseline (EWMA)", r.s.idleW, 98)
	if len(r.written) != 3 || recA.EnergySource != "counter" {
		t.Fatalf("%d records written, A source %q", len(r.written), recA.EnergySource)
	}
	// Every joule is accounted for: idle + attributed + unattributed.
	near(t, "conservation", testutil.ToFloat64(r.s.idle)+testutil.ToFloat64(r.s.attributed)+testutil.ToFloat64(r.s.unattributed), r.energyTotal("0"))
}

// On this machine there is no GPU driver: Open fails, clearly, without
// panicking; the error says NVML is not available.
func TestOpenWithoutDriver(t *testing.T) {
	src, err := Open(nil, false)
	if err == nil {
		src.Close()
		t.Skip("an NVIDIA driver is present here")
	}
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("error %v does not wrap ErrNoNVML", err)
	}
	t.Logf("as expected: %v", err)
}

// After the sampler stopped, a late record is written at once, not held.
func TestLateRecordAfterStopIsWritten(t *testing.T) {
	r := newRig(t, Config{}, &script{energy: []uint64{0, 1000}, power: []uint32{1, 1}})
	r.tick(0)
	h := r.s.Start(10)
	r.s.flush()
	r.hold(h, record.New(0))
	if len(r.written) != 1 {
		t.Fatalf("%d records written after stop, want 1", len(r.written))
	}
}
