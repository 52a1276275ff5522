package engine

import (
	"log/slog"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var (
	lEngine = []string{"engine"}
	dUp     = prometheus.NewDesc("tokentap_engine_up",
		"1 if the last scrape of the engine's metrics (or Ollama's /api/ps) succeeded, else 0; reason says why (ok, api_ps, timeout, connect, http_3xx, http_4xx, http_5xx, parse, too_large, no_metrics, not_started).",
		[]string{"engine", "reason"}, nil)
	dDuration = prometheus.NewDesc("tokentap_engine_scrape_duration_seconds", "Duration of the last scrape of the engine's metrics.", nil, nil)
	gauges    = []struct {
		series string
		desc   *prometheus.Desc
	}{
		{sRunning, prometheus.NewDesc("tokentap_engine_requests_running", "Requests the engine is running (in its batch), as it last reported them.", lEngine, nil)},
		{sWaiting, prometheus.NewDesc("tokentap_engine_requests_waiting", "Requests waiting in the engine's queue, as it last reported them.", lEngine, nil)},
		{sKVUsage, prometheus.NewDesc("tokentap_engine_kv_cache_usage_ratio", "KV cache usage of the engine, 0 to 1 (the most used of its data-parallel engines).", lEngine, nil)},
		{sModelsLoaded, prometheus.NewDesc("tokentap_engine_models_loaded", "Models the engine has loaded (Ollama's /api/ps).", lEngine, nil)},
		{sVRAMBytes, prometheus.NewDesc("tokentap_engine_vram_bytes", "GPU memory the engine's loaded models hold (Ollama's /api/ps size_vram).", lEngine, nil)},
	}
	dPrefix   = prometheus.NewDesc("tokentap_engine_prefix_cache_hit_ratio", "Prefix cache hit ratio: the engine's own gauge, or (vLLM) cached over queried prompt tokens during the last scrape interval.", lEngine, nil)
	followers = []struct {
		series string
		desc   *prometheus.Desc
	}{
		{sPreemptions, prometheus.NewDesc("tokentap_engine_preemptions_total", "Sequences the engine preempted (vLLM) or retracted (SGLang): follows the engine's counter, across its restarts.", lEngine, nil)},
		{sRejected, prometheus.NewDesc("tokentap_engine_requests_rejected_total", "Requests the engine refused as overloaded, by its own count (TGI: tgi_request_failure{err=\"overloaded\"}).", lEngine, nil)},
		{sAborted, prometheus.NewDesc("tokentap_engine_requests_aborted_total", "Requests the engine aborted, by its own count (vLLM: finished_reason=\"abort\"; SGLang).", lEngine, nil)},
	}
	histograms = []struct {
		series string
		desc   *prometheus.Desc
	}{
		{hTTFT, prometheus.NewDesc("tokentap_engine_time_to_first_token_seconds", "The engine's own TTFT histogram, re-exported with its buckets (engine-side: excludes HTTP and the sidecar).", lEngine, nil)},
		{hITL, prometheus.NewDesc("tokentap_engine_inter_token_latency_seconds", "The engine's own inter-token latency histogram, re-exported with its buckets (vLLM observes once per engine step).", lEngine, nil)},
		{hTPOT, prometheus.NewDesc("tokentap_engine_time_per_output_token_seconds", "The engine's own per-request time per output token histogram, re-exported with its buckets.", lEngine, nil)},
	}
)

// collector exports the scraper's state. The normalised series are
// present only while the last scrape succeeded and the engine exports
// them: a missing series is a signal the engine does not have.
type collector struct{ s *Scraper }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dUp
	ch <- dDuration
	ch <- dPrefix
	for _, g := range gauges {
		ch <- g.desc
	}
	for _, f := range followers {
		ch <- f.desc
	}
	for _, h := range histograms {
		ch <- h.desc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	up := 0.0
	if s.reason == ReasonOK || s.reason == ReasonAPIPS {
		up = 1
	}
	eng := s.kind.Label()
	ch <- prometheus.MustNewConstMetric(dUp, prometheus.GaugeValue, up, eng, s.reason)
	ch <- prometheus.MustNewConstMetric(dDuration, prometheus.GaugeValue, s.duration)
	snap := s.snap
	if snap == nil || s.kind == Unknown {
		return
	}
	for _, g := range gauges {
		if v, ok := snap.Values[g.series]; ok {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, eng)
		}
	}
	if s.prefix.have {
		ch <- prometheus.MustNewConstMetric(dPrefix, prometheus.GaugeValue, s.prefix.ratio, eng)
	}
	for _, f := range followers {
		if fl := s.follow[f.series]; fl != nil && fl.seen {
			if _, ok := snap.Values[f.series]; ok {
				ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, fl.total, eng)
			}
		}
	}
	for _, h := range histograms {
		if x := snap.Histograms[h.series]; x != nil {
			if m, err := prometheus.NewConstHistogram(h.desc, x.Count, x.Sum, x.Buckets, eng); err == nil {
				ch <- m
			}
		}
	}
}

// ownPrefixes are the sidecar's own families (and those of its process):
// an engine's family of the same name is never passed through, since two
// families of one name would fail the sidecar's whole /metrics.
var ownPrefixes = []string{"tokentap_", "gen_ai_", "go_", "process_", "promhttp_", "probe_", "otel_", "target_info"}

// passthrough re-exports the engine's own families, as last scraped.
type passthrough struct{ s *Scraper }

func (p *passthrough) Describe(chan<- *prometheus.Desc) {} // unchecked: the families are the engine's

func (p *passthrough) Collect(ch chan<- prometheus.Metric) {
	p.s.mu.Lock()
	fams := p.s.pass
	p.s.mu.Unlock()
	emit(fams, ch)
}

func emit(fams []*dto.MetricFamily, ch chan<- prometheus.Metric) {
	for _, mf := range fams {
		d := prometheus.NewDesc(mf.GetName(), mf.GetHelp(), nil, nil)
		for _, m := range mf.GetMetric() {
			ch <- raw{d, m}
		}
	}
}

// raw is one engine series, written as the engine gave it (labels
// sorted, as the registry wants them).
type raw struct {
	d *prometheus.Desc
	m *dto.Metric
}

func (r raw) Desc() *prometheus.Desc { return r.d }

func (r raw) Write(out *dto.Metric) error {
	out.Label = r.m.Label
	out.Gauge, out.Counter, out.Untyped = r.m.Gauge, r.m.Counter, r.m.Untyped
	out.Histogram, out.Summary = r.m.Histogram, r.m.Summary
	out.TimestampMs = r.m.TimestampMs
	return nil
}

// gatherable is a collector of some engine families, to check that the
// sidecar's registry would accept them.
type gatherable []*dto.MetricFamily

func (g gatherable) Describe(chan<- *prometheus.Desc)    {}
func (g gatherable) Collect(ch chan<- prometheus.Metric) { emit(g, ch) }

func accepted(fams ...*dto.MetricFamily) bool {
	reg := prometheus.NewRegistry()
	if reg.Register(gatherable(fams)) != nil {
		return false
	}
	_, err := reg.Gather()
	return err == nil
}

// passable returns the families to pass through: sorted, labels sorted,
// duplicate series dropped, the sidecar's own names left out, and only
// families the registry accepts (one it would reject is dropped, and
// said once per scrape at debug level).
func passable(fams map[string]*dto.MetricFamily, log *slog.Logger) []*dto.MetricFamily {
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []*dto.MetricFamily
next:
	for _, n := range names {
		for _, p := range ownPrefixes {
			if strings.HasPrefix(n, p) {
				continue next
			}
		}
		mf := fams[n]
		seen := map[string]bool{}
		var ms []*dto.Metric
		for _, m := range mf.GetMetric() {
			sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
			var key strings.Builder
			for _, lp := range m.Label {
				key.WriteString(lp.GetName() + "\xff" + lp.GetValue() + "\xff")
			}
			if !seen[key.String()] {
				seen[key.String()] = true
				ms = append(ms, m)
			}
		}
		mf.Metric = ms
		if !accepted(mf) {
			log.Debug("engine passthrough: family left out (the registry would reject it)", "family", n)
			continue
		}
		out = append(out, mf)
	}
	if !accepted(out...) {
		log.Debug("engine passthrough: the families collide with one another; none passed this scrape")
		return nil
	}
	return out
}
