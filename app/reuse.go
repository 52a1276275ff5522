package app

import (
	"crypto/rand"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/slo"
)

// captureSecret is the key of the capture's block digests: the
// capture.secret_file's (generated there when missing), or, with the
// live reuse alone and no secret file, 32 random bytes kept in memory for
// the process's life (nothing leaves it: the ids are only counted).
func captureSecret(c config.Capture) ([]byte, error) {
	if c.Secret() == "" {
		k := make([]byte, 32)
		rand.Read(k)
		return k, nil
	}
	return capture.LoadSecret(c.Secret())
}

// The live reuse's series (docs/metrics.md, "Prefix reuse"), every one
// present from the start.
var (
	dReuseBlocks = prometheus.NewDesc("tokentap_prefix_blocks_total",
		"Blocks of the live prompts counted by the live reuse, by outcome: reused (the block's whole prefix was seen within reuse.window before) or new (docs/capture.md, live reuse).",
		[]string{"outcome"}, nil)
	dReuseRequests = prometheus.NewDesc("tokentap_prefix_requests_total",
		"Live requests whose prompt blocks the live reuse counted (those the capture orders; docs/capture.md, live reuse).", nil, nil)
	dReuseIdeal = prometheus.NewDesc("tokentap_prefix_ideal_cache_blocks_total",
		"Blocks of the live prompts an ideal LRU cache of cache_blocks blocks held (hit) or not (miss) when they arrived: the most a prefix cache of that size could serve (docs/measurement.md §8b).",
		[]string{"cache_blocks", "outcome"}, nil)
	dReuseIDs = prometheus.NewDesc("tokentap_prefix_window_ids",
		"Block ids the reuse window remembers now (bounded by reuse.max_ids).", nil, nil)
	dReuseForgotten = prometheus.NewDesc("tokentap_prefix_ids_forgotten_total",
		"Block ids the reuse window forgot before their window ended because reuse.max_ids was reached (reuse they would have shown counts as new).", nil, nil)
	dReuseWindow = prometheus.NewDesc("tokentap_prefix_window_seconds",
		"The reuse window in force (reuse.window).", nil, nil)
)

// reuseCollector exports a capture's live reuse, read once per scrape.
type reuseCollector struct{ c *capture.Capture }

// registerReuse exports c's live reuse on reg.
func registerReuse(reg prometheus.Registerer, c *capture.Capture) {
	reg.MustRegister(reuseCollector{c})
}

func (r reuseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dReuseBlocks, dReuseRequests, dReuseIdeal, dReuseIDs, dReuseForgotten, dReuseWindow} {
		ch <- d
	}
}

func (r reuseCollector) Collect(ch chan<- prometheus.Metric) {
	st := r.c.Stats().Reuse
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(dReuseBlocks, st.Reused, "reused")
	counter(dReuseBlocks, st.Blocks-st.Reused, "new")
	counter(dReuseRequests, st.Requests)
	for i, size := range st.Sizes {
		n := strconv.Itoa(size)
		counter(dReuseIdeal, st.Hits[i], n, "hit")
		counter(dReuseIdeal, st.Blocks-st.Hits[i], n, "miss")
	}
	ch <- prometheus.MustNewConstMetric(dReuseIDs, prometheus.GaugeValue, float64(st.IDs))
	counter(dReuseForgotten, st.Forgotten)
	ch <- prometheus.MustNewConstMetric(dReuseWindow, prometheus.GaugeValue, st.Window.Seconds())
}

// prefixReuse is /slo's prefix reuse section at now: the capture's
// recent sums, beside the engine's own ratio where it has one.
func (s *Sidecar) prefixReuse(now time.Time) *slo.PrefixReuse {
	rr, ok := s.capture.RecentReuse(now)
	if !ok {
		return nil
	}
	st := s.capture.Stats().Reuse
	block := s.cfg.Capture.BlockSize
	if block == 0 {
		block = capture.DefaultBlockTokens
	}
	ratio := func(n, d uint64) *float64 {
		if d == 0 {
			return nil
		}
		r := float64(n) / float64(d)
		return &r
	}
	p := &slo.PrefixReuse{WindowSeconds: st.Window.Seconds(), SpanSeconds: rr.Span.Seconds(), BlockTokens: block,
		Requests: int64(rr.Requests), Blocks: int64(rr.Blocks), Reused: int64(rr.Reused), Reuse: ratio(rr.Reused, rr.Blocks),
		IDs: int64(st.IDs), Forgotten: st.Forgotten}
	for i, size := range st.Sizes {
		p.IdealCaches = append(p.IdealCaches, slo.IdealCache{Blocks: size, Tokens: int64(size) * int64(block), Hits: int64(rr.Hits[i]), HitRatio: ratio(rr.Hits[i], rr.Blocks)})
	}
	if s.engine != nil {
		if r, eng, from, ok := s.engine.PrefixHitRatio(); ok {
			p.Engine = &slo.EnginePrefix{Engine: eng, HitRatio: r, From: from}
		}
	}
	return p
}
