package gpu

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// The fixture's GPUs (gpu/testdata/README.md): this pod (vllm-0 in
// namespace llm) has node-a's GPUs 0 and 1.
const (
	uuidA0 = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43" // node-a gpu 0, llm/vllm-0, counter 5551899580 mJ
	uuidA1 = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c" // node-a gpu 1, llm/vllm-0, counter 5432100417 mJ
	uuidB0 = "GPU-4e75c9ab-0ed7-8a57-75f5-23761b9f053f" // node-b gpu 0, llm/vllm-1
	uuidB1 = "GPU-c0b5694b-2b5d-6b20-f903-558341437f6b" // node-b gpu 1, llm/vllm-1
)

// exporter serves the fixture as dcgm-exporter would, one step of a
// script per scrape-and-tick: each GPU's energy counter is the fixture's
// plus what the script added so far. down makes it answer 503; gone
// leaves a GPU out; set overrides a counter (a node reboot).
type exporter struct {
	t       *testing.T
	fixture string
	mu      sync.Mutex
	addMJ   map[string]uint64
	set     map[string]uint64
	down    bool
	gone    map[string]bool
	scrapes int
}

func newExporter(t *testing.T) (*exporter, string) {
	b, err := os.ReadFile("testdata/dcgm-exporter-2nodes.prom")
	if err != nil {
		t.Fatal(err)
	}
	e := &exporter{t: t, fixture: string(b), addMJ: map[string]uint64{}, set: map[string]uint64{}, gone: map[string]bool{}}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL + "/metrics"
}

func (e *exporter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.scrapes++
	if e.down {
		http.Error(w, "exporter restarting", http.StatusServiceUnavailable)
		return
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(e.fixture, "\n") {
		uuid := ""
		if i := strings.Index(line, `UUID="`); i >= 0 && !strings.HasPrefix(line, "#") {
			uuid = line[i+6 : i+6+strings.Index(line[i+6:], `"`)]
		}
		if e.gone[uuid] {
			continue
		}
		if uuid != "" && strings.HasPrefix(line, dcgmEnergy+"{") {
			sp := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseUint(strings.TrimSpace(line[sp+1:]), 10, 64)
			if err != nil {
				e.t.Errorf("fixture line %q: %v", line, err)
			}
			if s, ok := e.set[uuid]; ok {
				v = s
			}
			line = fmt.Sprintf("%s %d\n", line[:sp], v+e.addMJ[uuid])
		}
		out.WriteString(line)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write([]byte(out.String()))
}

func (e *exporter) add(mJ map[string]uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for u, v := range mJ {
		e.addMJ[u] += v
	}
}

func (e *exporter) with(f func()) { e.mu.Lock(); f(); e.mu.Unlock() }

func uuids(src Source) []string {
	var u []string
	for _, d := range src.Devices() {
		u = append(u, d.UUID)
	}
	return u
}

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %.9f, want %.9f (±%g)", what, got, want, tol)
	} else {
		t.Logf("%s = %.6f (want %.6f)", what, got, want)
	}
}

func TestDCGMSelectsThisPodsGPUs(t *testing.T) {
	_, url := newExporter(t)
	ctx := context.Background()
	cases := []struct {
		name string
		t    DCGMTarget
		want []string
	}{
		// Same pod name in another namespace (node-a gpu 2) and the
		// unassigned GPU (node-a gpu 3) are not ours.
		{"by pod and namespace", DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm"}, []string{uuidA0, uuidA1}},
		{"the other node's pod", DCGMTarget{URL: url, Pod: "vllm-1", Namespace: "llm"}, []string{uuidB0, uuidB1}},
		{"by UUID (NVIDIA_VISIBLE_DEVICES), prefix", DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm", Selection: []string{uuidB1, "GPU-5b4e07f6"}}, []string{uuidA0, uuidB1}},
		{"a pod without GPUs", DCGMTarget{URL: url, Pod: "router-0", Namespace: "llm"}, nil},
	}
	for _, c := range cases {
		src, err := OpenDCGM(ctx, c.t, time.Second, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := uuids(src); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: selected %v, want %v", c.name, got, c.want)
		}
		src.Close()
	}
	src, _ := OpenDCGM(ctx, DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm"}, time.Second, nil)
	if d := src.Devices()[1]; d.Index != 1 || d.Name != "NVIDIA H100 80GB HBM3" {
		t.Errorf("device %+v", d)
	}
	r, err := src.Read(0)
	if err != nil || r.EnergyMJ != 5551899580 || !r.HasEnergy || r.PowerMW != 412518 || r.UtilGPU != 87 || r.MemUsed != 71234<<20 || r.SMClockMHz != 1980 || r.TempC != 61 {
		t.Errorf("Read(0) = %+v, %v", r, err)
	}
	if _, err := OpenDCGM(ctx, DCGMTarget{URL: url}, time.Second, nil); err == nil || !strings.Contains(err.Error(), "no pod") {
		t.Errorf("no pod, no selection: %v", err)
	}
}

func TestResolveDCGMFromTheDownwardAPI(t *testing.T) {
	env := map[string]string{"NODE_IP": "10.0.3.17", "POD_NAME": "vllm-0", "POD_NAMESPACE": "llm"}
	getenv := func(k string) string { return env[k] }
	got, ok := ResolveDCGM(config.DCGM{}, nil, getenv)
	if want := (DCGMTarget{URL: "http://10.0.3.17:9400/metrics", Pod: "vllm-0", Namespace: "llm"}); !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v %v, want %+v", got, ok, want)
	}
	env["NODE_IP"] = "fd00::7"
	if got, _ := ResolveDCGM(config.DCGM{}, nil, getenv); got.URL != "http://[fd00::7]:9400/metrics" {
		t.Errorf("IPv6: %s", got.URL)
	}
	env["TOKENTAP_DCGM_URL"] = "http://10.0.3.17:9500/metrics"
	if got, _ := ResolveDCGM(config.DCGM{}, nil, getenv); got.URL != env["TOKENTAP_DCGM_URL"] {
		t.Errorf("TOKENTAP_DCGM_URL: %s", got.URL)
	}
	if got, _ := ResolveDCGM(config.DCGM{URL: "http://x:1/m", Pod: "p", Namespace: "n"}, nil, getenv); got.URL != "http://x:1/m" || got.Pod != "p" || got.Namespace != "n" {
		t.Errorf("config wins: %+v", got)
	}
	if _, ok := ResolveDCGM(config.DCGM{}, nil, func(string) string { return "" }); ok {
		t.Error("no URL derivable, but ok")
	}
}

// dcgmRig is the sampler over the scripted exporter; tick(sec) samples at
// t0+sec on the fake clock (Tick's argument).
type dcgmRig struct {
	e   *exporter
	s   *Sampler
	t0  time.Time
	log bytes.Buffer
	f   *Faults
	reg *prometheus.Registry
}

func newDCGMRig(t *testing.T, cfg Config) *dcgmRig {
	r := &dcgmRig{t0: time.Unix(2000, 0), reg: prometheus.NewRegistry()}
	var url string
	r.e, url = newExporter(t)
	r.f = NewFaults(r.reg, slog.New(slog.NewTextHandler(&r.log, nil)))
	src, err := OpenDCGM(context.Background(), DCGMTarget{URL: url, Pod: "vllm-0", Namespace: "llm"}, time.Second, r.f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	r.s = NewSampler(src, cfg, r.reg)
	return r
}

func (r *dcgmRig) tick(sec float64) { r.s.Tick(r.t0.Add(time.Duration(sec * float64(time.Second)))) }

// gpuEnergy is the sampler's energy of the selected GPUs since it started.
func (r *dcgmRig) gpuEnergy() float64 {
	var sum float64
	for _, d := range r.s.src.Devices() {
		sum += testutil.ToFloat64(r.s.energyTotal.WithLabelValues(gpuLabels(d)...))
	}
	return sum
}

// The window J/token from the exporter's counters, derived by hand. The
// fixture's counters of this pod's two GPUs start at 5551899580 mJ
// (gpu 0) and 5432100417 mJ (gpu 1). The scripted exporter advances them
// over three 1 s intervals; one request produces 120, 130 and 110 tokens:
//
//	gpu 0: 5551899580 → 5552299830 → 5552811955 → 5553210455 mJ
//	gpu 1: 5432100417 → 5432480417 → 5432981792 → 5433371792 mJ
//	window energy = (5553210455 − 5551899580 + 5433371792 − 5432100417) mJ
//	              = (1310875 + 1271375) mJ = 2582.25 J
//	J/token       = 2582.25 J / 360 tokens = 7.1729166… J/token
//
// The other pods' GPUs advance too and must not count.
func TestDCGMWindowJoulesPerToken(t *testing.T) {
	r := newDCGMRig(t, Config{})
	others := map[string]uint64{uuidB0: 999_000, uuidB1: 777_000, "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc": 555_000}
	r.tick(0)
	h := r.s.Start(0)
	steps := []struct {
		a0, a1 uint64
		tokens int64
	}{{400_250, 380_000, 120}, {512_125, 501_375, 130}, {398_500, 390_000, 110}}
	rec := record.New(0)
	rec.OutputTokens = 360
	for i, st := range steps {
		r.e.add(map[string]uint64{uuidA0: st.a0, uuidA1: st.a1})
		r.e.add(others)
		h.Tokens(st.tokens)
		if i == len(steps)-1 {
			h.Hold(rec, func() {})
		}
		r.tick(float64(i + 1))
	}
	const windowJ = float64(5553210455-5551899580+5433371792-5432100417) / 1e3
	within(t, "window energy of this pod's GPUs (J)", r.gpuEnergy(), windowJ, 1e-9)
	within(t, "window J/token", r.gpuEnergy()/360, 2582.25/360, 1e-9)
	within(t, "the request's energy (J)", rec.EnergyJ, windowJ, 1e-9)
	if rec.EnergySource != "dcgm_counter" || rec.EnergyInterval != time.Second {
		t.Errorf("energy_source %q, interval %v: want dcgm_counter and the sampler's 1s (the record says which source and interval produced its energy)", rec.EnergySource, rec.EnergyInterval)
	}
	if got := testutil.ToFloat64(r.s.power.WithLabelValues(gpuLabels(r.s.src.Devices()[0])...)); got != 412.518 {
		t.Errorf("power gauge %v W", got)
	}
}

// Per-request attribution over the DCGM source on a scripted load: three
// overlapping requests and idle intervals; every joule of the selected
// GPUs is either a request's or idle.
func TestDCGMEnergyConservation(t *testing.T) {
	r := newDCGMRig(t, Config{PrefillWeight: 0.1})
	recA, recB, recC := record.New(0), record.New(0), record.New(0)
	r.tick(0)
	// Per step: the mJ each of this pod's GPUs used, then who produced
	// tokens in it.
	load := []struct{ a0, a1 uint64 }{
		{95_000, 91_000},   // idle
		{410_000, 395_500}, // A, B (B ends)
		{505_250, 490_125}, // A, C
		{450_000, 430_000}, // A, C (A ends)
		{120_000, 110_000}, // C
		{300_000, 280_500}, // C (ends)
	}
	var a, b, c pipeline.EnergyShare
	for i, st := range load {
		r.e.add(map[string]uint64{uuidA0: st.a0, uuidA1: st.a1})
		switch i {
		case 1:
			a, b = r.s.Start(800), r.s.Start(200)
			a.Tokens(40)
			b.Tokens(25)
			b.Hold(recB, func() {})
		case 2:
			c = r.s.Start(50)
			a.Tokens(60)
			c.Tokens(12)
		case 3:
			a.Tokens(33)
			c.Tokens(19)
			a.Hold(recA, func() {})
		case 4:
			c.Tokens(7)
		case 5:
			c.Tokens(44)
			c.Hold(recC, func() {})
		}
		r.tick(float64(i + 1))
	}
	sum := recA.EnergyJ + recB.EnergyJ + recC.EnergyJ
	for _, x := range []*record.Record{recA, recB, recC} {
		if x.EnergySource != "dcgm_counter" || x.EnergyJ <= 0 {
			t.Errorf("energy_source %q, %v J", x.EnergySource, x.EnergyJ)
		}
	}
	idle := testutil.ToFloat64(r.s.idle)
	unattributed := testutil.ToFloat64(r.s.unattributed)
	total := r.gpuEnergy()
	t.Logf("requests %.3f J (A %.3f, B %.3f, C %.3f) + idle %.3f J + unattributed %.3f J = %.3f J; GPUs %.3f J",
		sum, recA.EnergyJ, recB.EnergyJ, recC.EnergyJ, idle, unattributed, sum+idle+unattributed, total)
	if math.Abs(sum+idle-total) > 0.01*total || unattributed != 0 {
		t.Errorf("conservation: requests %.3f + idle %.3f J, GPUs %.3f J (off by more than 1%%; unattributed %.3f J)", sum, idle, total, unattributed)
	}
	within(t, "GPUs' energy over the window (J)", total, float64(95_000+91_000+410_000+395_500+505_250+490_125+450_000+430_000+120_000+110_000+300_000+280_500)/1e3, 1e-9)
	within(t, "idle (J)", idle, float64(95_000+91_000)/1e3, 1e-9)
	// B: its 25 tokens + 0.1×200 prompt against A's 40 + 0.1×800 in the
	// first loaded interval: 805.5 J × 45/165.
	within(t, "B (J)", recB.EnergyJ, 805.5*45/165, 1e-9)
}

// The exporter restarts (503 twice), one of this pod's GPUs drops out of
// the exposition twice, and the node reboots (gpu 0's counter goes from
// 5.55e9 mJ to 1,000 mJ): each is logged once with its reason, counted
// every time, and the sampler runs on.
func TestDCGMFaults(t *testing.T) {
	r := newDCGMRig(t, Config{})
	step := func(sec float64, a0, a1 uint64) {
		r.e.add(map[string]uint64{uuidA0: a0, uuidA1: a1})
		r.tick(sec)
	}
	r.tick(0)
	step(1, 300_000, 300_000) // 600 J
	r.e.with(func() { r.e.down = true })
	step(2, 300_000, 300_000)
	step(3, 300_000, 300_000)
	r.e.with(func() { r.e.down = false; r.e.gone[uuidA1] = true })
	step(4, 300_000, 300_000) // gpu 0: 900 J across the outage, carried by its counter
	step(5, 300_000, 300_000) // gpu 0: 300 J
	r.e.with(func() { r.e.gone[uuidA1] = false })
	step(6, 300_000, 300_000) // gpu 1: 1500 J across outage and absence
	// The reboot: the counter restarts near zero. That interval integrates
	// the fixture's power (412.518 W both ends, 1 s): 412.518 J.
	r.e.with(func() { r.e.set[uuidA0], r.e.addMJ[uuidA0] = 0, 1_000 })
	step(7, 0, 300_000)
	step(8, 250_000, 300_000) // 250 J by the counter again

	for reason, want := range map[string]float64{"dcgm_unreachable": 2, "gpu_missing": 2, "counter_reset": 1} {
		if got := testutil.ToFloat64(r.f.errs.WithLabelValues(reason)); got != want {
			t.Errorf("tokentap_gpu_source_errors_total{reason=%q} = %v, want %v", reason, got, want)
		}
		if n := strings.Count(r.log.String(), "reason="+reason); n != 1 {
			t.Errorf("reason %s logged %d times, want once:\n%s", reason, n, r.log.String())
		}
	}
	t.Logf("log:\n%s", r.log.String())
	d := r.s.src.Devices()
	within(t, "gpu 0 energy (J)", testutil.ToFloat64(r.s.energyTotal.WithLabelValues(gpuLabels(d[0])...)), 300+900+300+300+412.518+250, 1e-6)
	within(t, "gpu 1 energy (J)", testutil.ToFloat64(r.s.energyTotal.WithLabelValues(gpuLabels(d[1])...)), 300+1500+300+300, 1e-6)
	if got := testutil.ToFloat64(r.s.resets.WithLabelValues("0")); got != 1 {
		t.Errorf("sampler counter resets %v, want 1", got)
	}
}

// Energy off is reported like the other faults: once in the log, counted.
func TestFaultsEnergyOff(t *testing.T) {
	var log bytes.Buffer
	reg := prometheus.NewRegistry()
	f := NewFaults(reg, slog.New(slog.NewTextHandler(&log, nil)))
	f.Report("energy_off", fmt.Errorf("%w: no exporter URL", ErrNoDCGM))
	f.Report("energy_off", fmt.Errorf("again"))
	if n := strings.Count(log.String(), "reason=energy_off"); n != 1 || !strings.Contains(log.String(), "no exporter URL") {
		t.Errorf("logged %d times:\n%s", n, log.String())
	}
	if got := testutil.ToFloat64(f.errs.WithLabelValues("energy_off")); got != 2 {
		t.Errorf("counted %v, want 2", got)
	}
	f.Count("dcgm_unreachable") // logged by its caller: counted, never logged here
	f.Report("dcgm_unreachable", fmt.Errorf("refused"))
	if strings.Contains(log.String(), "dcgm_unreachable") || testutil.ToFloat64(f.errs.WithLabelValues("dcgm_unreachable")) != 2 {
		t.Errorf("Count then Report:\n%s", log.String())
	}
	var nilFaults *Faults
	nilFaults.Report("energy_off", nil) // a nil *Faults does nothing
}

// An exporter answering with a redirect is no energy source, the error
// names the status, and the place it points to is never asked.
func TestDCGMRedirectNotFollowed(t *testing.T) {
	var asked atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) }))
	t.Cleanup(elsewhere.Close)
	redirect := httptest.NewServer(http.RedirectHandler(elsewhere.URL+"/metrics", http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	f := NewFaults(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	src, err := OpenDCGM(context.Background(), DCGMTarget{URL: redirect.URL + "/metrics", Pod: "vllm-0", Namespace: "llm"}, time.Second, f)
	if err == nil {
		src.Close()
		t.Fatal("a redirecting exporter opened as an energy source")
	}
	if !strings.Contains(err.Error(), "307") {
		t.Errorf("OpenDCGM: %v, want it to name the 307", err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the redirect's target was asked %d times, want 0", n)
	}
}
