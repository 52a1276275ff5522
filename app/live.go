package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
)

// The first run (docs/live.md): with the built-in simulator and no
// configuration file, a demo SLO, a demo price and a gentle open-loop
// load, so that /slo, the knee, /live and /metrics have data within
// seconds. Every page says so (synthetic).

// DemoSLO is the SLO the first run declares when none is.
func DemoSLO() config.Objective {
	return config.Objective{Name: "demo", Target: 0.9, Window: 15 * time.Minute,
		Thresholds: config.Thresholds{TTFT: time.Second, MaxITL: 500 * time.Millisecond}}
}

// DemoPrice is the price the first run declares when none is.
func DemoPrice() config.Cost { return config.Cost{Currency: "USD", PerHour: 2} }

// demoLoadBuckets are the first run's load buckets.
func demoLoadBuckets() []float64 { return []float64{4, 8, 16, 32, 64} }

// demoStallThreshold is the first run's stall threshold: below the
// simulator's 250 ms stalls, so that the live page marks them.
const demoStallThreshold = 200 * time.Millisecond

// applyDemo declares the demo SLO and price (each only when the
// configuration declares none) and returns what the pages say is
// synthetic; "" when the sidecar is in front of a real engine.
func applyDemo(cfg *config.Config) string {
	if cfg.Upstream != "" {
		return ""
	}
	said := []string{"every number comes from the built-in simulated engine (no --upstream)"}
	if !cfg.DemoOn() {
		return said[0]
	}
	if len(cfg.SLO.Objectives) == 0 {
		cfg.SLO.Objectives = []config.Objective{DemoSLO()}
		o := cfg.SLO.Objectives[0]
		said = append(said, fmt.Sprintf("the SLO %q (TTFT ≤ %v, max ITL ≤ %v, target %g) is a demo", o.Name, o.Thresholds.TTFT, o.Thresholds.MaxITL, o.Target))
		if cfg.SLO.StallThreshold == 0 {
			cfg.SLO.StallThreshold = demoStallThreshold
		}
	}
	if len(cfg.Capacity.LoadBuckets) == 0 {
		// Coarser load buckets than the defaults: the gentle demo load
		// runs at 1 to 4 requests in flight, and the knee needs 20 in
		// one bucket; with these it has them within seconds.
		cfg.Capacity.LoadBuckets = demoLoadBuckets()
	}
	if !cfg.Cost.Declared() {
		cfg.Cost = DemoPrice()
		said = append(said, fmt.Sprintf("the price %g %s/h is a demo", cfg.Cost.PerHour, cfg.Cost.Currency))
	}
	said = append(said, fmt.Sprintf("a demo load of %g requests/s runs (--demo=off turns the demo off)", demoRate(cfg.Demo)))
	return strings.Join(said, "; ")
}

func demoRate(d config.Demo) float64 {
	if d.Rate <= 0 {
		return config.DemoDefaults().Rate
	}
	return d.Rate
}

// demoLoad sends the demo's open-loop load to the proxy at addr: Poisson
// arrivals at rate per second, streamed chat requests of 8 to 48 tokens,
// at most maxInFlight at once (an arrival past it is skipped: the load
// stays gentle whatever the simulator does). It returns when ctx is
// done and its requests have ended.
func demoLoad(ctx context.Context, addr, model string, rate float64, seed uint64) {
	const maxInFlight = 32
	client := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rng := rand.New(rand.NewPCG(seed, 0xde70))
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	next := time.Now()
	for n := 0; ; n++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		select {
		case sem <- struct{}{}:
		default:
			continue
		}
		// A chat request, as the API's description builds one.
		path, m := stream.APIChat.Probe(stream.ProbeParams{Model: model, Prompt: fmt.Sprintf("tokentap demo load, request %d", n),
			MaxTokens: 8 + rng.IntN(41), Stream: true})
		body, _ := json.Marshal(m)
		wg.Go(func() {
			defer func() { <-sem }()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		})
	}
}

// endpoint is one line of the admin port's index.
type endpoint struct{ path, what string }

// serveIndex serves the admin port's index: every endpoint, one line
// each, and what is synthetic.
func serveIndex(eps []endpoint, synthetic string) http.HandlerFunc {
	var b strings.Builder
	b.WriteString(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tokentap admin</title><link rel="icon" href="data:,">
<style>body{font-family:sans-serif;margin:2em}li{margin:.3em 0}.synthetic{background:#fff3b0;border:2px solid #d9a400;padding:.5em 1em;font-weight:bold}</style></head><body>
`)
	if synthetic != "" {
		fmt.Fprintf(&b, "<div class=\"synthetic\" id=\"synthetic\">SYNTHETIC: %s</div>\n", html.EscapeString(synthetic))
	}
	b.WriteString("<h1>tokentap admin</h1>\n<ul>\n")
	for _, e := range eps {
		fmt.Fprintf(&b, "<li><a href=\"%s\">%s</a>: %s</li>\n", e.path, e.path, html.EscapeString(e.what))
	}
	b.WriteString("</ul>\n<p>Every figure is defined in the repository's docs/ (measurement.md, metrics.md, slo.md, live.md).</p></body></html>\n")
	page := b.String()
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	}
}

// newTrend returns the live page's trend over the pipeline's in-flight
// count and the engine's queue.
func newTrend(cfg config.Config, load *slo.LoadMeter, waiting func() (float64, bool)) *slo.Trend {
	return slo.NewTrend(cfg.SLO, slo.TrendOptions{Resolution: cfg.Live.Resolution, InFlight: load.InFlight, Queue: waiting})
}

// tallies counts each finished record in several tallies (the
// scorecard and the live page's trend).
type tallies []pipeline.Tally

func (t tallies) Add(r *record.Record) {
	for _, x := range t {
		x.Add(r)
	}
}
