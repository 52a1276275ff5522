package config

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// Cost is the cost section: the declared price of the replica this
// sidecar fronts, and optionally the price of its energy
// (docs/cost.md). Nothing is guessed: with no price declared, no cost
// figure is published.
//
// The price per hour is either PerHour, or PerGPUHour × GPUs (one of the
// two forms, not both). The currency is an ISO 4217 code (EUR, USD...);
// every sidecar that a Prometheus aggregates should declare the same one.
type Cost struct {
	// Currency names the unit of every price, e.g. EUR; required with
	// any price.
	Currency string `yaml:"currency"`
	// PerHour is the replica's price per hour: what running it costs,
	// whatever it serves.
	PerHour float64 `yaml:"per_hour"`
	// PerGPUHour and GPUs give the price per hour as PerGPUHour × GPUs.
	PerGPUHour float64 `yaml:"per_gpu_hour"`
	GPUs       int     `yaml:"gpus"`
	// EnergyPerKWh is the price of a kWh; with energy on, the measured
	// energy times it is published as the energy share of the cost. 0:
	// no energy price.
	EnergyPerKWh float64 `yaml:"energy_per_kwh"`
}

// Hourly is the replica's declared price per hour (0 when none).
func (c Cost) Hourly() float64 {
	if c.PerHour > 0 {
		return c.PerHour
	}
	return c.PerGPUHour * float64(c.GPUs)
}

// Declared reports whether any price is declared.
func (c Cost) Declared() bool { return c.Hourly() > 0 || c.EnergyPerKWh > 0 }

func (c *Cost) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Currency, "cost.currency", c.Currency, "ISO 4217 currency of the prices, e.g. EUR")
	fs.Float64Var(&c.PerHour, "cost.per-hour", c.PerHour, "the replica's price per hour (or --cost.per-gpu-hour with --cost.gpus)")
	fs.Float64Var(&c.PerGPUHour, "cost.per-gpu-hour", c.PerGPUHour, "price per GPU-hour; times --cost.gpus gives the replica's price per hour")
	fs.IntVar(&c.GPUs, "cost.gpus", c.GPUs, "GPUs the replica pays for (with --cost.per-gpu-hour)")
	fs.Float64Var(&c.EnergyPerKWh, "cost.energy-per-kwh", c.EnergyPerKWh, "energy price per kWh: the energy share of the cost, when energy is measured (0 = none)")
}

// Validate returns one error per problem, naming the field.
func (c Cost) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	for _, p := range []struct {
		name string
		v    float64
	}{{"per_hour", c.PerHour}, {"per_gpu_hour", c.PerGPUHour}, {"energy_per_kwh", c.EnergyPerKWh}} {
		if p.v < 0 || math.IsNaN(p.v) || math.IsInf(p.v, 0) {
			bad("cost.%s: must be a finite number, not negative, got %v", p.name, p.v)
		}
	}
	if c.GPUs < 0 {
		bad("cost.gpus: must not be negative, got %d", c.GPUs)
	}
	switch {
	case c.PerHour > 0 && (c.PerGPUHour > 0 || c.GPUs > 0):
		bad("cost: give per_hour, or per_gpu_hour with gpus, not both")
	case c.PerGPUHour > 0 && c.GPUs == 0:
		bad("cost.gpus: required with per_gpu_hour")
	case c.GPUs > 0 && c.PerGPUHour == 0:
		bad("cost.per_gpu_hour: required with gpus")
	}
	if c.Declared() || c.Currency != "" {
		if !isCurrencyCode(c.Currency) {
			bad("cost.currency: must be an ISO 4217 code of three capital letters (EUR, USD...), got %q", c.Currency)
		} else if !c.Declared() {
			bad("cost.currency: %s given but no price (per_hour, per_gpu_hour with gpus, or energy_per_kwh)", c.Currency)
		}
	}
	return errs
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, r := range []byte(s) {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// Capacity is the capacity section: the load buckets in which every
// finished request is counted, per SLO, so that attainment and goodput
// read as a curve against load and the knee can be estimated
// (docs/cost.md). A request's load is the time-weighted mean number of
// requests in flight through the sidecar during its life, itself
// included.
type Capacity struct {
	// LoadBuckets are the upper bounds of the load buckets, increasing;
	// a last, open bucket (+Inf) is implied. Empty means
	// DefaultLoadBuckets. At most MaxLoadBuckets.
	LoadBuckets []float64 `yaml:"load_buckets"`
	// ForecastWindow is how far back the breach forecast fits the load's
	// trend (docs/measurement.md, the breach forecast); 0 means
	// DefaultForecastWindow. Within [MinForecastWindow,
	// MaxForecastWindow].
	ForecastWindow time.Duration `yaml:"forecast_window"`
	// ForecastHorizon is how far ahead the forecast may reach: a breach
	// further away is not forecast. 0 means DefaultForecastHorizon; at
	// most MaxForecastHorizon.
	ForecastHorizon time.Duration `yaml:"forecast_horizon"`
}

// The breach forecast's window and horizon: defaults and bounds.
const (
	DefaultForecastWindow  = 15 * time.Minute
	MinForecastWindow      = time.Minute
	MaxForecastWindow      = 24 * time.Hour
	DefaultForecastHorizon = time.Hour
	MaxForecastHorizon     = 7 * 24 * time.Hour
)

// MaxLoadBuckets bounds the load label's values (each SLO has three
// counters per bucket).
const MaxLoadBuckets = 32

// DefaultLoadBuckets returns the default load buckets: every count up to
// 8, then about 1.5× apart up to 256 (a new slice each call). Fine where
// a small engine's knee lies, coarse where only large batches go.
func DefaultLoadBuckets() []float64 {
	return []float64{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256}
}

// WithDefaults fills the zero fields.
func (c Capacity) WithDefaults() Capacity {
	if len(c.LoadBuckets) == 0 {
		c.LoadBuckets = DefaultLoadBuckets()
	}
	if c.ForecastWindow == 0 {
		c.ForecastWindow = DefaultForecastWindow
	}
	if c.ForecastHorizon == 0 {
		c.ForecastHorizon = DefaultForecastHorizon
	}
	return c
}

// Validate returns one error per problem, naming the field.
func (c Capacity) Validate() []error {
	var errs []error
	b := c.LoadBuckets
	if len(b) > MaxLoadBuckets {
		errs = append(errs, fmt.Errorf("capacity.load_buckets: at most %d, got %d", MaxLoadBuckets, len(b)))
	}
	for i, v := range b {
		if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("capacity.load_buckets: each must be a finite number above 0 (the open +Inf bucket is implied), got %v", v))
			break
		}
		if i > 0 && v <= b[i-1] {
			errs = append(errs, fmt.Errorf("capacity.load_buckets: must increase, got %v after %v", v, b[i-1]))
			break
		}
	}
	if w := c.ForecastWindow; w != 0 && (w < MinForecastWindow || w > MaxForecastWindow) {
		errs = append(errs, fmt.Errorf("capacity.forecast_window: must be within [%v, %v], got %v", MinForecastWindow, MaxForecastWindow, w))
	}
	if h := c.ForecastHorizon; h < 0 || h > MaxForecastHorizon {
		errs = append(errs, fmt.Errorf("capacity.forecast_horizon: must not be negative or above %v, got %v", MaxForecastHorizon, h))
	}
	return errs
}
