package engine

import (
	"math"
	"sort"

	dto "github.com/prometheus/client_model/go"

	"github.com/tokentap/tokentap/stream"
)

// Kind names an engine; it is the engine label of every normalised series.
type Kind string

// The engines whose metrics are normalised (docs/engine-signals.md has
// the table, with the source of every name).
// The names are stream's (stream.EngineKinds, the one list).
const (
	Unknown   Kind = ""
	VLLM      Kind = stream.EngineVLLM
	SGLang    Kind = stream.EngineSGLang
	TGI       Kind = stream.EngineTGI
	LlamaCpp  Kind = stream.EngineLlamaCpp
	TRTLLM    Kind = stream.EngineTRTLLM
	Dynamo    Kind = stream.EngineDynamo
	Ollama    Kind = stream.EngineOllama
	Simulator Kind = stream.EngineSimulator // the built-in engine: vLLM's names
)

// Label is the value of the engine label: "unknown" for Unknown.
func (k Kind) Label() string {
	if k == Unknown {
		return "unknown"
	}
	return string(k)
}

// The normalised series, by the suffix of their name after
// tokentap_engine_.
const (
	sRunning        = "requests_running"
	sWaiting        = "requests_waiting"
	sKVUsage        = "kv_cache_usage_ratio"
	sPrefixHitRatio = "prefix_cache_hit_ratio"
	sPreemptions    = "preemptions_total"
	sRejected       = "requests_rejected_total"
	sAborted        = "requests_aborted_total"
	sPrefixHits     = "prefix_cache_hits" // vLLM's counters: the ratio is derived per scrape
	sPrefixQueries  = "prefix_cache_queries"
	sModelsLoaded   = "models_loaded"
	sVRAMBytes      = "vram_bytes"
	hTTFT           = "time_to_first_token_seconds"
	hITL            = "inter_token_latency_seconds"
	hTPOT           = "time_per_output_token_seconds"
)

// agg says how the series of one source family combine into one value:
// the sum (requests, counters: several data-parallel engines or ranks
// add up), the maximum (KV usage: the most pressed engine is the one
// that preempts) or the mean (ratios).
type agg int

const (
	aggSum agg = iota
	aggMax
	aggMean
)

// source is one engine family that maps onto one of our series.
type source struct {
	out  string
	from []string          // candidate family names, the first present wins
	with map[string]string // label values the series must have
	agg  agg
}

// mapping per engine. Names are the engines' own (see the table in
// docs/engine-signals.md for the file and version of each); counters are
// given with the _total that appears on the wire.
var mappings = map[Kind][]source{
	VLLM: {
		{out: sRunning, from: []string{"vllm:num_requests_running"}},
		{out: sWaiting, from: []string{"vllm:num_requests_waiting"}},
		{out: sKVUsage, from: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, agg: aggMax},
		{out: sPreemptions, from: []string{"vllm:num_preemptions_total"}},
		{out: sPrefixHits, from: []string{"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"}},
		{out: sPrefixQueries, from: []string{"vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"}},
		{out: sAborted, from: []string{"vllm:request_success_total"}, with: map[string]string{"finished_reason": "abort"}},
		{out: hTTFT, from: []string{"vllm:time_to_first_token_seconds"}},
		{out: hITL, from: []string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}},
		{out: hTPOT, from: []string{"vllm:request_time_per_output_token_seconds"}},
	},
	SGLang: {
		{out: sRunning, from: []string{"sglang:num_running_reqs"}},
		{out: sWaiting, from: []string{"sglang:num_queue_reqs"}},
		{out: sKVUsage, from: []string{"sglang:token_usage"}, agg: aggMax},
		{out: sPreemptions, from: []string{"sglang:num_retracted_requests_total"}},
		{out: sPrefixHitRatio, from: []string{"sglang:cache_hit_rate"}, agg: aggMean},
		{out: sAborted, from: []string{"sglang:num_aborted_requests_total"}},
		{out: hTTFT, from: []string{"sglang:time_to_first_token_seconds"}},
		{out: hITL, from: []string{"sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"}},
	},
	TGI: {
		{out: sRunning, from: []string{"tgi_batch_current_size"}},
		{out: sWaiting, from: []string{"tgi_queue_size"}},
		{out: sRejected, from: []string{"tgi_request_failure"}, with: map[string]string{"err": "overloaded"}},
		{out: hTPOT, from: []string{"tgi_request_mean_time_per_token_duration"}},
		// KV usage is derived below: tgi_batch_current_max_tokens / tgi_batch_max_total_tokens.
	},
	LlamaCpp: {
		{out: sRunning, from: []string{"llamacpp:requests_processing"}},
		{out: sWaiting, from: []string{"llamacpp:requests_deferred"}},
		{out: sKVUsage, from: []string{"llamacpp:kv_cache_usage_ratio"}, agg: aggMax}, // builds before PR #13660 only
	},
	TRTLLM: {
		{out: sRunning, from: []string{"trtllm_num_requests_running"}},
		{out: sWaiting, from: []string{"trtllm_num_requests_waiting"}},
		{out: sKVUsage, from: []string{"trtllm_kv_cache_utilization"}, agg: aggMax},
		{out: sPrefixHitRatio, from: []string{"trtllm_kv_cache_hit_rate"}, agg: aggMean},
		{out: hTTFT, from: []string{"trtllm_time_to_first_token_seconds"}},
		{out: hTPOT, from: []string{"trtllm_time_per_output_token_seconds"}},
	},
	Dynamo: {
		{out: sRunning, from: []string{"dynamo_frontend_inflight_requests"}},
		{out: sWaiting, from: []string{"dynamo_frontend_queued_requests"}},
		{out: sKVUsage, from: []string{"dynamo_component_kvstats_gpu_cache_usage_percent"}, agg: aggMax},
		{out: hTTFT, from: []string{"dynamo_frontend_time_to_first_token_seconds"}},
		{out: hITL, from: []string{"dynamo_frontend_inter_token_latency_seconds"}},
	},
}

func init() { mappings[Simulator] = mappings[VLLM] }

// Histogram is an engine histogram, its series added up.
type Histogram struct {
	Count   uint64
	Sum     float64
	Buckets map[float64]uint64 // upper bound → cumulative count; +Inf left out
}

// Snapshot is one scrape, normalised: only what the engine exports is
// present. Counters are the engine's raw values (summed over series);
// the scraper follows them across resets.
type Snapshot struct {
	Kind       Kind
	Values     map[string]float64
	Histograms map[string]*Histogram
}

// Get returns a value and whether the engine exports it.
func (s *Snapshot) Get(series string) (float64, bool) {
	v, ok := s.Values[series]
	return v, ok
}

// Normalise maps an engine's families onto our series.
func Normalise(kind Kind, fams map[string]*dto.MetricFamily) *Snapshot {
	s := &Snapshot{Kind: kind, Values: map[string]float64{}, Histograms: map[string]*Histogram{}}
	for _, src := range mappings[kind] {
		for _, name := range src.from {
			mf := fams[name]
			if mf == nil || len(mf.GetMetric()) == 0 {
				continue
			}
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				if h := sumHistograms(mf); h != nil {
					s.Histograms[src.out] = h
				}
			} else if v, ok := aggregate(mf, src.with, src.agg); ok {
				s.Values[src.out] = v
			} else {
				continue
			}
			break
		}
	}
	if kind == TGI { // KV pressure: tokens the running batch may reach over the budget
		cur, ok1 := aggregate(fams["tgi_batch_current_max_tokens"], nil, aggSum)
		budget, ok2 := aggregate(fams["tgi_batch_max_total_tokens"], nil, aggSum)
		if ok1 && ok2 && budget > 0 {
			s.Values[sKVUsage] = cur / budget
		}
	}
	if v, ok := s.Values[sKVUsage]; ok {
		s.Values[sKVUsage] = math.Max(0, math.Min(1, v))
	}
	return s
}

// value returns a sample's value whatever its type (a gauge, counter or
// untyped series).
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

func hasLabels(m *dto.Metric, with map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := with[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(with)
}

// aggregate combines the family's series that carry the given labels; it
// skips NaN values.
func aggregate(mf *dto.MetricFamily, with map[string]string, how agg) (float64, bool) {
	if mf == nil {
		return 0, false
	}
	var acc float64
	n := 0
	for _, m := range mf.GetMetric() {
		v, ok := value(m)
		if !ok || math.IsNaN(v) || !hasLabels(m, with) {
			continue
		}
		switch {
		case n == 0:
			acc = v
		case how == aggMax:
			acc = math.Max(acc, v)
		default:
			acc += v
		}
		n++
	}
	if n == 0 {
		return 0, false
	}
	if how == aggMean {
		acc /= float64(n)
	}
	return acc, true
}

// sumHistograms adds up the series of a histogram family that share the
// first series' bucket bounds (a data-parallel engine's replicas do).
func sumHistograms(mf *dto.MetricFamily) *Histogram {
	var h *Histogram
	var bounds []float64
	for _, m := range mf.GetMetric() {
		mh := m.GetHistogram()
		if mh == nil {
			continue
		}
		var bs []float64
		for _, b := range mh.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				bs = append(bs, b.GetUpperBound())
			}
		}
		sort.Float64s(bs)
		if h == nil {
			h, bounds = &Histogram{Buckets: map[float64]uint64{}}, bs
		} else if !equal(bounds, bs) {
			continue
		}
		h.Count += mh.GetSampleCount()
		h.Sum += mh.GetSampleSum()
		for _, b := range mh.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				h.Buckets[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
	}
	return h
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
