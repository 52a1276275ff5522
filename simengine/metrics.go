package simengine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// simMetrics is the simulator's vLLM-style /metrics: vLLM v1's names,
// types, labels (model_name, engine) and buckets (vllm/v1/metrics/
// loggers.py), following the batching model; the prefix-cache counters
// only with the prefix cache on.
type simMetrics struct {
	reg     *prometheus.Registry
	success *prometheus.CounterVec
	ttft    prometheus.Observer
	itl     prometheus.Observer
	prompt  prometheus.Counter
	gen     prometheus.Counter
}

func newSimMetrics(e *Engine) *simMetrics {
	labels := prometheus.Labels{"model_name": e.cfg.Model, "engine": "0"}
	locked := func(f func() float64) func() float64 {
		return func() float64 {
			e.mu.Lock()
			defer e.mu.Unlock()
			return f()
		}
	}
	m := &simMetrics{reg: prometheus.NewRegistry()}
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"})
	for _, r := range []string{"stop", "length", "abort", "error"} {
		m.success.WithLabelValues(r)
	}
	ttft := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds.", ConstLabels: labels,
		Buckets: []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}})
	itl := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:inter_token_latency_seconds",
		Help: "Histogram of inter-token latency in seconds.", ConstLabels: labels,
		Buckets: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}})
	m.ttft, m.itl = ttft, itl
	m.prompt = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total", Help: "Number of prefill tokens processed.", ConstLabels: labels})
	m.gen = prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total", Help: "Number of generation tokens processed.", ConstLabels: labels})
	m.reg.MustRegister(m.success, ttft, itl, m.prompt, m.gen,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "Number of requests in model execution batches.", ConstLabels: labels},
			locked(func() float64 { return float64(e.running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", Help: "Number of requests waiting to be processed.", ConstLabels: labels},
			locked(func() float64 { return float64(len(e.waiting)) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: labels},
			locked(func() float64 { return min(1, float64(e.kvUsed)/float64(e.cfg.KVCapacityTokens)) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:num_preemptions_total", Help: "Cumulative number of preemption from the engine.", ConstLabels: labels},
			locked(func() float64 { return float64(e.preemptions) })),
	)
	if e.cache != nil {
		m.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total", Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: labels},
				locked(func() float64 { return float64(e.prefixQueries) })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total", Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: labels},
				locked(func() float64 { return float64(e.prefixHits) })),
		)
	}
	return m
}

// token observes a generated token of s at now: the TTFT for its first,
// else the gap since its previous (a preemption's wait and recompute
// included, as vLLM counts them).
func (m *simMetrics) token(s *seq, now time.Time) {
	if s.generated == 1 {
		m.ttft.Observe(now.Sub(s.arrive).Seconds())
		m.prompt.Add(float64(s.prompt))
	} else {
		m.itl.Observe(now.Sub(s.lastToken).Seconds())
	}
	m.gen.Inc()
	s.lastToken = now
}

// finished counts a request that left the engine, by vLLM's finish
// reason (stop, length, abort, error).
func (m *simMetrics) finished(reason string) { m.success.WithLabelValues(reason).Inc() }
