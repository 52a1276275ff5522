package gpu

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/record"
)

// ModelSpec describes a model for the decode speed-of-light ceiling.
type ModelSpec struct {
	WeightBytes     float64 `yaml:"weight_bytes"`
	KVBytesPerToken float64 `yaml:"kv_bytes_per_token"`
}

// Config is the energy section of the configuration.
type Config struct {
	// Enabled is auto (default: on when NVML works), on (say loudly
	// when it does not) or off.
	Enabled string `yaml:"enabled"`
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

// Req is one request's share of the energy. The proxy calls Tokens on
// the hot path (an atomic add on the request's own counter: no lock
// shared across requests); the sampler reads it once per interval.
type Req struct {
	tokens  atomic.Int64
	first   atomic.Bool
	prefill int64

	// owned by the tracker, under its lock
	seen           int64
	prefillCounted bool
	energy, dyn    float64
	sources        uint8 // bit 1: counter, bit 2: power integration
	done           bool
	rec            *record.Record
}

// Tokens counts n output tokens (n ≥ 1) produced now.
func (r *Req) Tokens(n int64) {
	r.first.Store(true)
	r.tokens.Add(n)
}

// Sampler samples the GPUs and attributes each interval's energy.
type Sampler struct {
	src   Source
	cfg   Config
	clock func() time.Time
	next  record.Sink
	label func(string) string
	bw    float64 // summed peak memory bandwidth, bytes/s

	mu      sync.Mutex
	active  map[*Req]struct{}
	prev    []sample
	last    time.Time
	idleW   float64 // learned or configured idle power (all selected GPUs)
	learned bool
	stopped bool // after Run: records are written at once, nothing is held

	energy, power, util, memUsed, smClock, memClock, temp, throttle, peakBW *prometheus.GaugeVec
	energyTotal                                                             *prometheus.CounterVec
	readErrors, resets                                                      *prometheus.CounterVec
	attributed, unattributed, idle                                          prometheus.Counter
	idleGauge, lag                                                          prometheus.Gauge
	perToken, sol                                                           *prometheus.HistogramVec
	ceiling                                                                 *prometheus.GaugeVec
}

type sample struct {
	ok bool
	r  Reading
	at time.Time // when it was read
}

// NewSampler wraps next (the records sink): a record whose request was
// tracked is held until the interval it ended in has been attributed,
// then written with its energy. label bounds model label values.
func NewSampler(src Source, cfg Config, reg prometheus.Registerer, next record.Sink, label func(string) string) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.PrefillWeight <= 0 {
		cfg.PrefillWeight = 0.1
	}
	if label == nil {
		label = func(s string) string { return s }
	}
	s := &Sampler{src: src, cfg: cfg, clock: time.Now, next: next, label: label, active: map[*Req]struct{}{},
		prev: make([]sample, len(src.Devices())), idleW: cfg.IdlePowerWatts, learned: cfg.IdlePowerWatts > 0}
	for _, d := range src.Devices() {
		s.bw += d.PeakMemBandwidth()
	}
	g := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"gpu", "uuid", "name"})
	}
	s.energy = g("tokentap_gpu_energy_counter_joules", "NVML's total energy counter of the GPU (since the driver loaded), in joules, as last read.")
	s.power = g("tokentap_gpu_power_watts", "GPU power: instant where NVML supports the field, else its one-second average.")
	s.util = g("tokentap_gpu_utilization_ratio", "GPU utilisation (0-1) as NVML reports it.")
	s.memUsed = g("tokentap_gpu_memory_used_bytes", "GPU memory used.")
	s.smClock = g("tokentap_gpu_sm_clock_hertz", "SM clock.")
	s.memClock = g("tokentap_gpu_memory_clock_hertz", "Memory clock.")
	s.temp = g("tokentap_gpu_temperature_celsius", "GPU temperature.")
	s.throttle = g("tokentap_gpu_clock_event_reasons", "NVML clock event (throttle) reasons bitmask; 0 means none.")
	s.peakBW = g("tokentap_gpu_peak_memory_bandwidth_bytes_per_second", "Peak memory bandwidth from NVML's bus width and max memory clock.")
	s.energyTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_gpu_energy_joules_total", Help: "Energy used by the GPU since the sidecar started: counter deltas, or integrated power where there is no counter. rate() is watts."}, []string{"gpu", "uuid", "name"})
	s.readErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_gpu_read_errors_total", Help: "GPU samples that could not be read (skipped; the energy counter carries the energy to the next good sample)."}, []string{"gpu"})
	s.resets = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_gpu_energy_counter_resets_total", Help: "Times the energy counter went backwards (wrap or driver reload); that interval used integrated power."}, []string{"gpu"})
	s.attributed = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_energy_attributed_joules_total", Help: "Energy shared among requests in flight."})
	s.unattributed = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_energy_unattributed_joules_total", Help: "Energy of intervals with requests in flight but no token produced (prefill that spans intervals, stalls): not attributed."})
	s.idle = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_energy_idle_joules_total", Help: "Energy of intervals with no request in flight."})
	s.idleGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokentap_gpu_idle_power_watts", Help: "Idle baseline of the selected GPUs together: configured, or learned from intervals with no request in flight (EWMA). Dynamic J/token subtracts it."})
	s.lag = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokentap_energy_sampling_lag_seconds", Help: "How late the last sample was against its schedule."})
	s.perToken = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokentap_request_energy_per_token_joules", Help: "Per-request total energy attributed to the request divided by its output tokens.",
		Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100}}, []string{"gen_ai_request_model", "prompt_class", "output_class"})
	s.sol = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokentap_decode_speed_of_light_ratio", Help: "Per-request measured decode rate as a fraction of the memory-bandwidth ceiling for its model and context.",
		Buckets: []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.2}}, []string{"gen_ai_request_model"})
	s.ceiling = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_decode_ceiling_tokens_per_second", Help: "Single-request decode ceiling at zero context: peak memory bandwidth / weight bytes."}, []string{"gen_ai_request_model"})
	if reg != nil {
		reg.MustRegister(s.energy, s.power, s.util, s.memUsed, s.smClock, s.memClock, s.temp, s.throttle, s.peakBW,
			s.energyTotal, s.readErrors, s.resets, s.attributed, s.unattributed, s.idle, s.idleGauge, s.lag, s.perToken, s.sol, s.ceiling)
	}
	for _, d := range src.Devices() {
		s.peakBW.WithLabelValues(gpuLabels(d)...).Set(d.PeakMemBandwidth())
	}
	for m, spec := range cfg.Models {
		if spec.WeightBytes > 0 && s.bw > 0 {
			s.ceiling.WithLabelValues(m).Set(s.bw / spec.WeightBytes)
		}
	}
	return s
}

func gpuLabels(d DeviceInfo) []string { return []string{strconv.Itoa(d.Index), d.UUID, d.Name} }

// Start tracks a request; prefillTokens is an estimate of its prompt
// tokens (corrected by nothing: see docs/energy.md).
func (s *Sampler) Start(prefillTokens int64) record.EnergyHandle {
	r := &Req{prefill: prefillTokens}
	s.mu.Lock()
	s.active[r] = struct{}{}
	s.mu.Unlock()
	return r
}

// Write implements record.Sink: a tracked record waits for the end of
// its last interval; any other passes through.
func (s *Sampler) Write(rec *record.Record) {
	r, _ := rec.Energy.(*Req)
	if r == nil {
		s.next.Write(rec)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r.done, r.rec = true, rec
	if s.stopped { // a request that outlived the shutdown: never lose its record
		delete(s.active, r)
		s.finish(r)
	}
}

// Run samples every interval until ctx is done, then attributes the last
// partial interval and flushes every held record.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	s.Tick(s.clock())
	sched := s.clock()
	for {
		select {
		case <-ctx.Done():
			s.Tick(s.clock())
			s.flush()
			return
		case <-t.C:
		}
		sched = sched.Add(s.cfg.Interval)
		now := s.clock()
		s.lag.Set(math.Max(0, now.Sub(sched).Seconds()))
		s.Tick(now)
	}
}

// Tick samples every GPU at now and attributes the interval since the
// last tick.
func (s *Sampler) Tick(now time.Time) {
	var dE float64
	var src uint8
	have := false
	for i, d := range s.src.Devices() {
		r, err := s.src.Read(i)
		p := &s.prev[i]
		if err != nil {
			s.readErrors.WithLabelValues(strconv.Itoa(d.Index)).Inc()
			continue
		}
		l := gpuLabels(d)
		if p.ok {
			e, how := s.delta(d, p, r, now)
			if how != 0 {
				dE += e
				src |= how
				have = true
				s.energyTotal.WithLabelValues(l...).Add(e)
			}
		}
		s.export(l, r)
		*p = sample{ok: true, r: r, at: now}
	}
	if !s.last.IsZero() {
		s.attribute(dE, now.Sub(s.last).Seconds(), src, have)
	}
	s.last = now
}

func (s *Sampler) export(l []string, r Reading) {
	if r.HasEnergy {
		s.energy.WithLabelValues(l...).Set(float64(r.EnergyMJ) / 1e3)
	}
	if r.HasPower {
		s.power.WithLabelValues(l...).Set(float64(r.PowerMW) / 1e3)
	}
	s.util.WithLabelValues(l...).Set(float64(r.UtilGPU) / 100)
	s.memUsed.WithLabelValues(l...).Set(float64(r.MemUsed))
	s.smClock.WithLabelValues(l...).Set(float64(r.SMClockMHz) * 1e6)
	s.memClock.WithLabelValues(l...).Set(float64(r.MemClockMHz) * 1e6)
	s.temp.WithLabelValues(l...).Set(float64(r.TempC))
	s.throttle.WithLabelValues(l...).Set(float64(r.Throttle))
}

const (
	viaCounter uint8 = 1
	viaPower   uint8 = 2
)

// delta is one GPU's energy since its previous good sample: the counter
// difference, or where there is no counter (or it went backwards: wrap
// or driver reload) the trapezoid of the two power readings.
func (s *Sampler) delta(d DeviceInfo, p *sample, r Reading, now time.Time) (float64, uint8) {
	if p.r.HasEnergy && r.HasEnergy {
		if r.EnergyMJ >= p.r.EnergyMJ {
			return float64(r.EnergyMJ-p.r.EnergyMJ) / 1e3, viaCounter
		}
		s.resets.WithLabelValues(strconv.Itoa(d.Index)).Inc()
	}
	if p.r.HasPower && r.HasPower {
		dt := now.Sub(p.at).Seconds() // across missed samples too
		return (float64(p.r.PowerMW) + float64(r.PowerMW)) / 2 / 1e3 * dt, viaPower
	}
	return 0, 0
}

// attribute shares an interval's energy dE (over dt seconds) among the
// requests in flight in it, in proportion to the tokens each produced in
// the interval; a request's prompt counts PrefillWeight per token in the
// interval its first token came in. With no request in flight the energy
// is idle and teaches the idle baseline.
func (s *Sampler) attribute(dE, dt float64, src uint8, have bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.active) == 0 {
		if have && dt > 0 {
			s.idle.Add(dE)
			if !s.learned || s.cfg.IdlePowerWatts == 0 {
				w := dE / dt
				if !s.learned {
					s.idleW, s.learned = w, true
				} else {
					s.idleW = 0.9*s.idleW + 0.1*w
				}
			}
			s.idleGauge.Set(s.idleW)
		}
		return
	}
	dyn := math.Max(0, dE-s.idleW*dt)
	var total float64
	weights := make(map[*Req]float64, len(s.active))
	for r := range s.active {
		n := r.tokens.Load()
		w := float64(n - r.seen)
		r.seen = n
		if r.first.Load() && !r.prefillCounted {
			w += s.cfg.PrefillWeight * float64(r.prefill)
			r.prefillCounted = true
		}
		weights[r] = w
		total += w
	}
	switch {
	case !have:
	case total > 0:
		s.attributed.Add(dE)
		for r, w := range weights {
			r.energy += dE * w / total
			r.dyn += dyn * w / total
			if w > 0 {
				r.sources |= src
			}
		}
	default:
		s.unattributed.Add(dE)
	}
	for r := range s.active {
		if r.done {
			delete(s.active, r)
			s.finish(r)
		}
	}
}

// finish writes a held record with its energy.
func (s *Sampler) finish(r *Req) {
	rec := r.rec
	rec.EnergyJ, rec.EnergyDynamicJ = r.energy, r.dyn
	switch r.sources {
	case viaCounter:
		rec.EnergySource = "counter"
	case viaPower:
		rec.EnergySource = "power_integration"
	case viaCounter | viaPower:
		rec.EnergySource = "counter+power_integration"
	default:
		rec.EnergySource = "none"
	}
	model := s.label(rec.Model)
	if rec.OutputTokens > 0 && r.sources != 0 {
		s.perToken.WithLabelValues(model, rec.PromptClass, rec.OutputClass).Observe(r.energy / float64(rec.OutputTokens))
	}
	if spec, ok := s.cfg.Models[rec.Model]; ok && s.bw > 0 && spec.WeightBytes > 0 && rec.OutputTokens >= 2 {
		if tpot, ok := rec.TPOT(); ok && tpot > 0 {
			ctx := math.Max(0, float64(rec.InputTokens)) + float64(rec.OutputTokens)/2
			ceiling := s.bw / (spec.WeightBytes + ctx*spec.KVBytesPerToken)
			ratio := (1 / tpot.Seconds()) / ceiling
			rec.DecodeSOL = ratio
			s.sol.WithLabelValues(model).Observe(ratio)
		}
	}
	rec.EndTrace() // the spans carry the energy too
	s.next.Write(rec)
}

// flush writes every record still held (at shutdown).
func (s *Sampler) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for r := range s.active {
		if r.done {
			delete(s.active, r)
			s.finish(r)
		}
	}
}
