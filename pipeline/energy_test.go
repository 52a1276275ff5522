//go:build cgo && nvml

package pipeline_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/gpu"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
)

// mockGPU is one H100 (go-nvml's mock) drawing 300 W, whose energy
// counter is read once per sample: each read's instant is appended to
// *reads.
func mockGPU(t *testing.T, mu *sync.Mutex, reads *[]time.Time) gpu.Source {
	t.Helper()
	srv := dgxh100.NewWithGPUs(gpus.H100_SXM5_80GB)
	d := srv.Devices[0].(*server.Device)
	t0 := time.Now()
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
		now := time.Now()
		mu.Lock()
		*reads = append(*reads, now)
		mu.Unlock()
		return uint64(now.Sub(t0).Milliseconds()) * 300, nvml.SUCCESS // 300 W in mJ
	}
	d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 300_000, nvml.SUCCESS }
	d.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 5120, nvml.SUCCESS }
	d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 2619, nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 50}, nvml.SUCCESS }
	d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 60, nvml.SUCCESS }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	src, err := gpu.NewNVML(srv, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// With energy on, 2,000 requests end within one sampling interval and
// their publication (stages 5-7: metric backends, /slo book, a sink that
// is busy 1 ms per record) takes 2 s in all. The sample after the
// interval they ended in is still taken on schedule: publication runs off
// the sampler's goroutine. The clock is synctest's: the sink's cost is
// fake time that delays only the goroutine it runs on, and the sample
// instants the mock GPU sees are exact, so a busy machine cannot move
// them. Every record is published, with its energy; none spills.
func TestBurstDoesNotDelayTheNextSample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			interval = time.Second
			n        = 2000
			cost     = time.Millisecond // stages 5-7 of one record
		)
		var mu sync.Mutex
		var reads []time.Time
		src := mockGPU(t, &mu, &reads)
		metrics := exporter.New(exporter.Config{MaxModels: 1})
		cfg := slo.Config{Objectives: []slo.Objective{{Name: "chat", Target: 0.9, Thresholds: slo.Thresholds{TTFT: time.Second}}}}
		sampler := gpu.NewSampler(src, gpu.Config{Interval: interval}, metrics.Registry)
		var published []*record.Record
		p := pipeline.New(pipeline.Options{Live: metrics, Models: metrics.Models(), Judge: slo.NewJudge(cfg),
			Energy: sampler, Prometheus: metrics, Book: slo.NewBook(cfg, nil),
			Sinks: []record.Sink{sinkFunc(func(r *record.Record) {
				time.Sleep(cost)
				mu.Lock()
				published = append(published, r)
				mu.Unlock()
			})}})
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan struct{})
		t0 := time.Now()
		go func() { sampler.Run(ctx); close(ran) }()

		time.Sleep(interval / 2) // the burst: every request ends inside [t0, t0+1s]
		for range n {
			rec := record.New(4)
			rec.Arrive, rec.API, rec.Traffic, rec.Stream = time.Now(), stream.NameChat, "live", true
			rec.SetModel("m")
			_, q := p.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: rec.API, Model: rec.Model, Traffic: "live"}, PromptTokens: 10})
			q.Tokens(3)
			rec.AddToken(time.Now(), 3, true)
			rec.HTTPStatus, rec.Outcome, rec.OutputTokens, rec.Terminal = 200, record.Success, 3, time.Now()
			q.End(rec, nil)
		}
		// t0+1s attributes the interval and hands the 2,000 records over;
		// the next sample is due at t0+2s, while they are still being
		// published (until t0+3s).
		time.Sleep(2*interval - interval/2 + interval/4)
		mu.Lock()
		got, sunk := append([]time.Time(nil), reads...), len(published)
		mu.Unlock()
		if len(got) < 3 {
			t.Errorf("%d samples by t0+2.25s, want 3 (t0, t0+1s, t0+2s): the sample after the burst is late", len(got))
		} else {
			delay := got[2].Sub(t0.Add(2 * interval))
			t.Logf("next sample after the burst: %v late (%.1f%% of the %v interval); %d of %d records published by then", delay, 100*delay.Seconds()/interval.Seconds(), interval, sunk, n)
			if delay > interval/10 {
				t.Errorf("the sample after a burst of %d ending requests came %v late, more than 10%% of the %v interval", n, delay, interval)
			}
		}
		if sunk == n {
			t.Error("every record was published before the next sample: the sink's cost did not overlap it, the test proves nothing")
		}

		time.Sleep(2 * interval) // the publisher finishes the burst
		stop()
		<-ran
		mu.Lock()
		defer mu.Unlock()
		if len(published) != n {
			t.Fatalf("%d records published, want %d", len(published), n)
		}
		for _, r := range published {
			if r.EnergySource != "counter" || r.EnergyJ <= 0 {
				t.Fatalf("a record was published without its energy: %q %v J", r.EnergySource, r.EnergyJ)
			}
		}
		if v := counter(t, metrics, "tokentap_energy_publish_queue_full_total"); v != 0 {
			t.Errorf("tokentap_energy_publish_queue_full_total %v, want 0 (2,000 fit the queue)", v)
		}
	})
}

// counter reads one unlabelled counter from m's registry.
func counter(t *testing.T, m *exporter.Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
