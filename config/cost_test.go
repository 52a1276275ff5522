package config

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCostForms(t *testing.T) {
	for _, c := range []struct {
		cost   Cost
		hourly float64
	}{
		{Cost{Currency: "EUR", PerHour: 11}, 11},
		{Cost{Currency: "EUR", PerGPUHour: 2.75, GPUs: 4}, 11},
		{Cost{Currency: "USD", EnergyPerKWh: 0.3}, 0},
		{Cost{}, 0},
	} {
		if errs := c.cost.Validate(); len(errs) > 0 {
			t.Errorf("%+v: %v", c.cost, errs)
		}
		if got := c.cost.Hourly(); got != c.hourly {
			t.Errorf("%+v: hourly %v, want %v", c.cost, got, c.hourly)
		}
	}
}

// Each bad cost section is named, field by field.
func TestCostInvalid(t *testing.T) {
	for _, c := range []struct {
		cost Cost
		want string
	}{
		{Cost{PerHour: 11}, `cost.currency: must be an ISO 4217 code of three capital letters (EUR, USD...), got ""`},
		{Cost{Currency: "€", PerHour: 11}, `cost.currency: must be an ISO 4217 code`},
		{Cost{Currency: "eur", PerHour: 11}, `cost.currency: must be an ISO 4217 code`},
		{Cost{Currency: "EUR"}, "cost.currency: EUR given but no price"},
		{Cost{Currency: "EUR", PerHour: -1}, "cost.per_hour: must be a finite number, not negative, got -1"},
		{Cost{Currency: "EUR", PerHour: math.Inf(1)}, "cost.per_hour: must be a finite number"},
		{Cost{Currency: "EUR", EnergyPerKWh: math.NaN()}, "cost.energy_per_kwh: must be a finite number"},
		{Cost{Currency: "EUR", PerHour: 11, PerGPUHour: 2, GPUs: 4}, "cost: give per_hour, or per_gpu_hour with gpus, not both"},
		{Cost{Currency: "EUR", PerGPUHour: 2}, "cost.gpus: required with per_gpu_hour"},
		{Cost{Currency: "EUR", GPUs: 4, EnergyPerKWh: 0.2}, "cost.per_gpu_hour: required with gpus"},
		{Cost{Currency: "EUR", PerGPUHour: 2, GPUs: -1}, "cost.gpus: must not be negative, got -1"},
	} {
		var msgs []string
		for _, e := range c.cost.Validate() {
			msgs = append(msgs, e.Error())
		}
		if !strings.Contains(strings.Join(msgs, "\n"), c.want) {
			t.Errorf("%+v: errors %q, want one containing %q", c.cost, msgs, c.want)
		}
	}
}

func TestCapacityBuckets(t *testing.T) {
	if d := (Capacity{}).WithDefaults(); len(d.LoadBuckets) == 0 || len(d.LoadBuckets) > MaxLoadBuckets || len(d.Validate()) > 0 {
		t.Fatalf("defaults %v: %v", d.LoadBuckets, d.Validate())
	}
	many := make([]float64, MaxLoadBuckets+1)
	for i := range many {
		many[i] = float64(i + 1)
	}
	for _, c := range []struct {
		b    []float64
		want string
	}{
		{[]float64{1, 2, 2}, "capacity.load_buckets: must increase, got 2 after 2"},
		{[]float64{0, 1}, "capacity.load_buckets: each must be a finite number above 0"},
		{[]float64{1, math.Inf(1)}, "capacity.load_buckets: each must be a finite number above 0 (the open +Inf bucket is implied)"},
		{many, "capacity.load_buckets: at most 32, got 33"},
	} {
		errs := Capacity{LoadBuckets: c.b}.Validate()
		if len(errs) == 0 || !strings.Contains(errs[0].Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.b, errs, c.want)
		}
	}
}

// The breach forecast's window and horizon: defaults, bounds, every
// problem named, and the keys read from a file.
func TestCapacityForecast(t *testing.T) {
	d := (Capacity{}).WithDefaults()
	if d.ForecastWindow != DefaultForecastWindow || d.ForecastHorizon != DefaultForecastHorizon {
		t.Fatalf("defaults: window %v, horizon %v", d.ForecastWindow, d.ForecastHorizon)
	}
	errs := Capacity{ForecastWindow: 30 * time.Second, ForecastHorizon: -time.Minute}.Validate()
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "capacity.forecast_window: must be within [1m0s, 24h0m0s], got 30s") ||
		!strings.Contains(errs[1].Error(), "capacity.forecast_horizon: must not be negative or above 168h0m0s, got -1m0s") {
		t.Fatalf("errors: %v", errs)
	}
	if errs := (Capacity{ForecastWindow: 25 * time.Hour, ForecastHorizon: 8 * 24 * time.Hour}).Validate(); len(errs) != 2 {
		t.Fatalf("errors: %v", errs)
	}
	file := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(file, []byte("capacity:\n  forecast_window: 5m\n  forecast_horizon: 2h\n"), 0o644)
	c, err := Load([]string{"--config", file}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Capacity.ForecastWindow != 5*time.Minute || c.Capacity.ForecastHorizon != 2*time.Hour {
		t.Fatalf("from the file: %+v", c.Capacity)
	}
}

// The cost section comes from the file, the environment or flags.
func TestCostFromFileEnvAndFlags(t *testing.T) {
	c, err := Load([]string{"--config", "../deploy/examples/tokentap.yaml"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Cost.Currency != "EUR" || c.Cost.Hourly() != 11 || c.Cost.EnergyPerKWh <= 0 || len(c.SLO.Objectives) == 0 {
		t.Fatalf("example config: cost %+v, SLOs %d", c.Cost, len(c.SLO.Objectives))
	}
	c, err = Load([]string{"--cost.per-hour", "7.5"}, envOf(map[string]string{"TOKENTAP_COST_CURRENCY": "USD", "TOKENTAP_COST_PER_HOUR": "9"}), io.Discard)
	if err != nil || c.Cost.Currency != "USD" || c.Cost.PerHour != 7.5 {
		t.Fatalf("flags and env: %+v, %v", c.Cost, err)
	}
	_, err = Load([]string{"--cost.per-hour", "7.5"}, noEnv, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "cost.currency") {
		t.Fatalf("a price without a currency: %v", err)
	}
}
