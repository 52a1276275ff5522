package exporter

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Prices are the declared prices of the replica behind this sidecar
// (the config cost section), exported so that the shipped cost rules can
// divide them by goodput (docs/cost.md). Nothing is guessed: an
// undeclared price (0) exports no series.
type Prices struct {
	// Currency labels every price series (ISO 4217: EUR, USD...).
	Currency string
	// PerHour is the replica's price per hour; 0: none.
	PerHour float64
	// EnergyPerKWh is the price of a kWh of the measured GPU energy; 0:
	// none.
	EnergyPerKWh float64
}

// The price instruments in both backends: the same names, units and
// label, like the per-request instruments (specs).
var (
	priceHourly = Spec{Prom: "tokentap_replica_price_per_hour", OTel: "tokentap.replica.price_per_hour",
		Help: "The replica's declared price per hour (config cost.per_hour, or per_gpu_hour × gpus), in the currency label's unit."}
	priceAccrued = Spec{Prom: "tokentap_replica_cost_total", OTel: "tokentap.replica.cost", Counter: true,
		Help: "The replica's declared price accrued over the time this sidecar has run: price per hour × hours up. rate() is the price per second over any window, replicas that came and went included; the cost rules divide it by goodput."}
	priceEnergy = Spec{Prom: "tokentap_energy_price_per_kwh", OTel: "tokentap.energy.price_per_kwh",
		Help: "The declared price of a kWh (config cost.energy_per_kwh), in the currency label's unit: times the measured GPU energy, the energy share of the cost."}
)

const currencyLabel, currencyAttr = "currency", "tokentap.currency"

// accrued is the cost accrued since start at p's hourly price.
func (p Prices) accrued(start, now time.Time) float64 { return p.PerHour * now.Sub(start).Hours() }

// RegisterPrices exports the declared prices on the Prometheus registry;
// the accrued cost counts from start.
func (m *Metrics) RegisterPrices(p Prices, start time.Time) {
	labels := prometheus.Labels{currencyLabel: p.Currency}
	if p.PerHour > 0 {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: priceHourly.Prom, Help: priceHourly.Help, ConstLabels: labels})
		g.Set(p.PerHour)
		m.Registry.MustRegister(g, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: priceAccrued.Prom, Help: priceAccrued.Help, ConstLabels: labels},
			func() float64 { return p.accrued(start, time.Now()) }))
	}
	if p.EnergyPerKWh > 0 {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: priceEnergy.Prom, Help: priceEnergy.Help, ConstLabels: labels})
		g.Set(p.EnergyPerKWh)
		m.Registry.MustRegister(g)
	}
}

// RegisterOTLPPrices exports the declared prices on the OTLP backend's meter
// provider, as observable instruments; the accrued cost counts from
// start.
func RegisterOTLPPrices(mp metric.MeterProvider, p Prices, start time.Time) error {
	if p.PerHour <= 0 && p.EnergyPerKWh <= 0 {
		return nil
	}
	m := mp.Meter("github.com/tokentap/tokentap/exporter")
	set := metric.WithAttributes(attribute.String(currencyAttr, p.Currency))
	unit := "{" + p.Currency + "}"
	var errs []error
	var obs []metric.Observable
	var hourly, energy metric.Float64ObservableGauge
	var accrued metric.Float64ObservableCounter
	var err error
	if p.PerHour > 0 {
		hourly, err = m.Float64ObservableGauge(priceHourly.OTel, metric.WithUnit(unit+"/h"), metric.WithDescription(priceHourly.Help))
		errs = append(errs, err)
		accrued, err = m.Float64ObservableCounter(priceAccrued.OTel, metric.WithUnit(unit), metric.WithDescription(priceAccrued.Help))
		errs = append(errs, err)
		obs = append(obs, hourly, accrued)
	}
	if p.EnergyPerKWh > 0 {
		energy, err = m.Float64ObservableGauge(priceEnergy.OTel, metric.WithUnit(unit+"/kW.h"), metric.WithDescription(priceEnergy.Help))
		errs = append(errs, err)
		obs = append(obs, energy)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if p.PerHour > 0 {
			o.ObserveFloat64(hourly, p.PerHour, set)
			o.ObserveFloat64(accrued, p.accrued(start, time.Now()), set)
		}
		if p.EnergyPerKWh > 0 {
			o.ObserveFloat64(energy, p.EnergyPerKWh, set)
		}
		return nil
	}, obs...)
	return err
}
