package gpu

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// Config is the energy section and ModelSpec one of its models; they live
// in package config (a leaf).
type (
	Config    = config.Energy
	ModelSpec = config.ModelSpec
)

// Req is one request's share of the energy (a pipeline.EnergyShare).
// The proxy calls Tokens on the hot path (an atomic add on the request's
// own counter: no lock shared across requests); the sampler reads it once
// per interval.
type Req struct {
	s       *Sampler
	tokens  atomic.Int64
	first   atomic.Bool
	prefill int64

	// owned by the tracker, under its lock
	seen           int64
	prefillCounted bool
	energy, dyn    float64
	sources        uint8 // bit 1: counter, bit 2: power integration
	done           bool
	rec            *record.Record // the finished record: its energy fields are set before then
	then           func()
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
	bw    float64 // summed peak memory bandwidth, bytes/s
	// origin prefixes the record's energy_source: "" for NVML, "dcgm_"
	// for the DCGM exporter (a Source with an Origin method).
	origin string

	mu      sync.Mutex
	active  map[*Req]struct{}
	prev    []sample
	last    time.Time
	idleW   float64 // learned or configured idle power (all selected GPUs)
	learned bool
	stopped bool // after Run: records are written at once, nothing is held

	// queue carries held requests from the sampler's goroutine to the
	// publisher while Run runs (nil otherwise: Tick's caller publishes);
	// queueLen is its capacity. spill counts the goroutines publishing
	// what found it full.
	queue    chan *Req
	queueLen int
	spill    sync.WaitGroup

	energy, power, util, memUsed, smClock, memClock, temp, throttle, peakBW *prometheus.GaugeVec
	energyTotal                                                             *prometheus.CounterVec
	readErrors, resets                                                      *prometheus.CounterVec
	attributed, unattributed, idle                                          prometheus.Counter
	idleGauge, lag                                                          prometheus.Gauge
	queueFull                                                               prometheus.Counter
	ceiling                                                                 *prometheus.GaugeVec
}

type sample struct {
	ok bool
	r  Reading
	at time.Time // when it was read
}

// publishQueue is how many held requests wait for the publisher at most
// (8 bytes each): a burst of 4,096 requests ending in one interval passes
// without spilling (docs/energy.md, "Publishing off the sampler").
const publishQueue = 4096

// NewSampler returns a sampler of src's GPUs; reg (nil: none) receives
// its metrics. A request tracked with Start is held at its end (Hold)
// until the interval it ended in has been attributed.
func NewSampler(src Source, cfg Config, reg prometheus.Registerer) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.PrefillWeight <= 0 {
		cfg.PrefillWeight = 0.1
	}
	s := &Sampler{src: src, cfg: cfg, clock: time.Now, active: map[*Req]struct{}{},
		prev: make([]sample, len(src.Devices())), queueLen: publishQueue, idleW: cfg.IdlePowerWatts, learned: cfg.IdlePowerWatts > 0}
	for _, d := range src.Devices() {
		s.bw += d.PeakMemBandwidth()
	}
	if o, ok := src.(interface{ Origin() string }); ok {
		s.origin = o.Origin() + "_"
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
	s.queueFull = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokentap_energy_publish_queue_full_total", Help: "Held records that found the energy publish queue full: published on a goroutine started for them, never dropped, the sampler not delayed."})
	s.ceiling = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_decode_ceiling_tokens_per_second", Help: "Single-request decode ceiling at zero context: peak memory bandwidth / weight bytes."}, []string{"gen_ai_request_model"})
	if reg != nil {
		reg.MustRegister(s.energy, s.power, s.util, s.memUsed, s.smClock, s.memClock, s.temp, s.throttle, s.peakBW,
			s.energyTotal, s.readErrors, s.resets, s.attributed, s.unattributed, s.idle, s.idleGauge, s.lag, s.queueFull, s.ceiling)
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
// tokens (corrected by nothing: see docs/energy.md). It returns a *Req.
func (s *Sampler) Start(prefillTokens int64) pipeline.EnergyShare {
	r := &Req{s: s, prefill: prefillTokens}
	s.mu.Lock()
	s.active[r] = struct{}{}
	s.mu.Unlock()
	return r
}

// Hold is called once when r's request has ended, with its finished
// record (which must not change until then is called). Once the interval
// it ended in has been attributed, rec's energy fields are set
// (EnergyJ, EnergyDynamicJ, EnergySource, DecodeSOL) and then runs: on
// Run's publisher goroutine (never the sampler's), on Tick's caller when
// Run is not running, and at once after Run has returned.
func (r *Req) Hold(rec *record.Record, then func()) {
	s := r.s
	s.mu.Lock()
	r.done, r.rec, r.then = true, rec, then
	stopped := s.stopped
	if stopped { // a request that outlived the shutdown: never lose it
		delete(s.active, r)
	}
	s.mu.Unlock()
	if stopped {
		s.finish(r)
	}
}

// Run samples every interval until ctx is done, then attributes the last
// partial interval and flushes every held record. The held records are
// handed to a publisher goroutine through a bounded queue, so that their
// publication (spans, metrics, sinks) never delays a sample; when the
// queue is full, a tick's overflow is published on a goroutine of its own
// and counted. Run returns once every record it held has been published.
// Run is called at most once.
func (s *Sampler) Run(ctx context.Context) {
	s.queue = make(chan *Req, s.queueLen)
	published := make(chan struct{})
	go func() {
		for r := range s.queue {
			s.finish(r)
		}
		close(published)
	}()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	s.Tick(s.clock())
	sched := s.clock()
	for {
		select {
		case <-ctx.Done():
			s.Tick(s.clock())
			s.flush()
			close(s.queue)
			<-published
			s.spill.Wait()
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
// last tick. The requests whose last interval this was are handed to
// Run's publisher, or published before Tick returns when Run is not
// running.
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
	s.publish(s.attributeLocked(dE, dt, src, have))
}

// publish hands the finished requests to the publisher without waiting:
// what does not fit in the queue is counted and published on a goroutine
// of its own, never dropped. Without Run, it publishes them itself.
func (s *Sampler) publish(done []*Req) {
	if s.queue == nil {
		for _, r := range done {
			s.finish(r)
		}
		return
	}
	for i, r := range done {
		select {
		case s.queue <- r:
			continue
		default:
		}
		over := done[i:]
		s.queueFull.Add(float64(len(over)))
		s.spill.Add(1)
		go func() {
			defer s.spill.Done()
			for _, r := range over {
				s.finish(r)
			}
		}()
		return
	}
}

// attributeLocked shares the energy and returns the requests whose last
// interval this was.
func (s *Sampler) attributeLocked(dE, dt float64, src uint8, have bool) []*Req {
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
		return nil
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
	return s.takeDone()
}

// takeDone removes and returns the held requests; s.mu must be held.
func (s *Sampler) takeDone() []*Req {
	var done []*Req
	for r := range s.active {
		if r.done {
			delete(s.active, r)
			done = append(done, r)
		}
	}
	return done
}

// finish writes a held request's attribution into its record and hands
// it on. It runs without s.mu: the request is out of the active set, so
// nothing else touches it.
func (s *Sampler) finish(r *Req) {
	rec := r.rec
	rec.EnergyJ, rec.EnergyDynamicJ, rec.DecodeSOL = r.energy, r.dyn, 0
	rec.EnergyInterval = s.cfg.Interval
	switch r.sources {
	case viaCounter:
		rec.EnergySource = s.origin + "counter"
	case viaPower:
		rec.EnergySource = s.origin + "power_integration"
	case viaCounter | viaPower:
		rec.EnergySource = s.origin + "counter+power_integration"
	default:
		rec.EnergySource = "none"
	}
	if spec, ok := s.cfg.Models[rec.Model]; ok && s.bw > 0 && spec.WeightBytes > 0 && rec.OutputTokens >= 2 {
		if tpot, ok := rec.TPOT(); ok && tpot > 0 {
			ctx := math.Max(0, float64(rec.InputTokens)) + float64(rec.OutputTokens)/2
			ceiling := s.bw / (spec.WeightBytes + ctx*spec.KVBytesPerToken)
			rec.DecodeSOL = (1 / tpot.Seconds()) / ceiling
		}
	}
	r.then()
}

// flush hands out every request still held (at shutdown).
func (s *Sampler) flush() {
	s.mu.Lock()
	s.stopped = true
	done := s.takeDone()
	s.mu.Unlock()
	s.publish(done)
}
