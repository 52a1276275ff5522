package engine

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// engineServer serves body at path (404 elsewhere) with a content type.
func engineServer(t *testing.T, path, contentType string, body func() string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", contentType)
		fmt.Fprint(w, body())
	}))
	t.Cleanup(s.Close)
	return s
}

// handlerClient serves requests with h in memory, no network: inside a
// synctest bubble a handler that waits on its request's context waits
// on the bubble's clock, and the scrapes' timeouts are exact.
func handlerClient(h http.HandlerFunc) *http.Client {
	return &http.Client{Transport: handlerTransport(h)}
}

type handlerTransport http.HandlerFunc

func (h handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	h(w, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return w.Result(), nil
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newScraper(t *testing.T, base string, reg prometheus.Registerer, mod func(*config.Engine)) *Scraper {
	t.Helper()
	u, _ := url.Parse(base)
	cfg := config.EngineDefaults()
	if mod != nil {
		mod(&cfg)
	}
	return New(Options{Config: cfg, Upstream: u, Registry: reg})
}

// series gathers the registry into "name{engine}" → value (counters and
// gauges) and "name{engine}/count", "/sum", "/le=<b>" for histograms.
func series(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range fams {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			k := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Gauge != nil:
				out[k] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[k] = m.GetCounter().GetValue()
			case m.Untyped != nil:
				out[k] = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				out[k+"/count"] = float64(m.GetHistogram().GetSampleCount())
				out[k+"/sum"] = m.GetHistogram().GetSampleSum()
				for _, b := range m.GetHistogram().GetBucket() {
					out[fmt.Sprintf("%s/le=%g", k, b.GetUpperBound())] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

// For each engine fixture (testdata/README.md says where each comes
// from), the normalised series equal the values read by hand from the
// fixture, and the series an engine does not export are absent.
func TestFixturesNormalise(t *testing.T) {
	const text = "text/plain; version=0.0.4; charset=utf-8"
	for _, c := range []struct {
		file, path, ctype string
		engine            string
		want              map[string]float64 // series suffix → value
		absent            []string
	}{
		{"vllm-v1.prom", "/metrics", text, "vllm", map[string]float64{
			"requests_running": 8, "requests_waiting": 7, "kv_cache_usage_ratio": 0.9625,
			"preemptions_total": 12, "requests_aborted_total": 0, "prefix_cache_hit_ratio": 0.25,
			"time_to_first_token_seconds/count": 140, "time_to_first_token_seconds/le=0.04": 97,
			"time_to_first_token_seconds/le=0.1": 140, "time_to_first_token_seconds/sum": 0,
			"inter_token_latency_seconds/count": 27313, "inter_token_latency_seconds/sum": 573.5,
			"inter_token_latency_seconds/le=0.025": 20000,
		}, []string{"requests_rejected_total", "time_per_output_token_seconds/count"}},
		{"sglang.prom", "/metrics", text, "sglang", map[string]float64{
			"requests_running": 162, "requests_waiting": 2826, "kv_cache_usage_ratio": 0.28,
			"prefix_cache_hit_ratio":            0.007507552643049313,
			"time_to_first_token_seconds/count": 11008, "time_to_first_token_seconds/sum": 2.3518979474117756e+06,
			"time_to_first_token_seconds/le=2.5": 140,
			"inter_token_latency_seconds/count":  7.400757e+06, "inter_token_latency_seconds/le=0.1": 4.950195e+06,
		}, []string{"preemptions_total", "requests_aborted_total", "requests_rejected_total"}},
		{"tgi.prom", "/metrics", "text/plain; version=0.0.4", "tgi", map[string]float64{
			"requests_running": 16, "requests_waiting": 4, "kv_cache_usage_ratio": 0.75, "requests_rejected_total": 37,
			"time_per_output_token_seconds/count": 1190, "time_per_output_token_seconds/sum": 16.2,
			"time_per_output_token_seconds/le=0.0129746337890625": 410,
		}, []string{"preemptions_total", "prefix_cache_hit_ratio", "time_to_first_token_seconds/count", "inter_token_latency_seconds/count"}},
		{"llamacpp.prom", "/metrics", "text/plain; version=0.0.4", "llamacpp", map[string]float64{
			"requests_running": 2, "requests_waiting": 5,
		}, []string{"kv_cache_usage_ratio", "preemptions_total", "prefix_cache_hit_ratio", "time_to_first_token_seconds/count"}},
		{"trtllm.prom", "/prometheus/metrics", text, "trtllm", map[string]float64{
			"requests_running": 24, "requests_waiting": 3, "kv_cache_usage_ratio": 0.41, "prefix_cache_hit_ratio": 0.62,
			"time_to_first_token_seconds/count": 1000, "time_to_first_token_seconds/sum": 71.5, "time_to_first_token_seconds/le=0.1": 900,
			"time_per_output_token_seconds/count": 1000, "time_per_output_token_seconds/le=0.025": 950,
		}, []string{"preemptions_total", "requests_aborted_total"}},
		{"dynamo.prom", "/metrics", text, "dynamo", map[string]float64{
			"requests_running": 5, "requests_waiting": 2,
			"time_to_first_token_seconds/count": 420, "time_to_first_token_seconds/le=0.1": 380,
			"inter_token_latency_seconds/count": 26880, "inter_token_latency_seconds/sum": 301,
		}, []string{"kv_cache_usage_ratio", "preemptions_total"}},
		{"ollama-api-ps.json", "/api/ps", "application/json; charset=utf-8", "ollama", map[string]float64{
			"models_loaded": 1, "vram_bytes": 5137025024,
		}, []string{"requests_running", "kv_cache_usage_ratio", "preemptions_total"}},
	} {
		t.Run(c.engine, func(t *testing.T) {
			body := fixture(t, c.file)
			srv := engineServer(t, c.path, c.ctype, func() string { return body })
			reg := prometheus.NewRegistry()
			s := newScraper(t, srv.URL, reg, nil)
			s.Scrape(context.Background())
			got := series(t, reg)
			reason := "ok"
			if c.engine == "ollama" {
				reason = "api_ps"
			}
			if up := got[fmt.Sprintf("tokentap_engine_up{engine=%s,reason=%s}", c.engine, reason)]; up != 1 {
				t.Fatalf("tokentap_engine_up{engine=%s,reason=%s} = %v; series: %v", c.engine, reason, up, got)
			}
			for suffix, want := range c.want {
				name, part, _ := strings.Cut(suffix, "/")
				k := "tokentap_engine_" + name + "{engine=" + c.engine + "}"
				if part != "" {
					k += "/" + part
				}
				v, ok := got[k]
				if !ok || math.Abs(v-want) > 1e-9*math.Max(1, math.Abs(want)) {
					t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
				}
			}
			// PrefixHitRatio (the /slo's prefix reuse section) is the
			// gauge's value, with the engine's metric it comes from.
			r, eng, from, ok := s.PrefixHitRatio()
			want, has := c.want["prefix_cache_hit_ratio"]
			wantFrom := map[string]string{"vllm": "increase(vllm:prefix_cache_hits_total) / increase(vllm:prefix_cache_queries_total)",
				"sglang": "sglang:cache_hit_rate", "trtllm": "trtllm_kv_cache_hit_rate"}[c.engine]
			if ok != has || eng != c.engine || (has && (math.Abs(r-want) > 1e-12 || from != wantFrom)) || PrefixSource(Kind(c.engine)) != wantFrom {
				t.Errorf("PrefixHitRatio = %v %q %q %v, want %v %v from %q", r, eng, from, ok, want, has, wantFrom)
			}
			for _, suffix := range c.absent {
				name, part, _ := strings.Cut(suffix, "/")
				k := "tokentap_engine_" + name + "{engine=" + c.engine + "}"
				if part != "" {
					k += "/" + part
				}
				if _, ok := got[k]; ok {
					t.Errorf("%s present; %s does not export it", k, c.engine)
				}
			}
		})
	}
}

// Newer SGLang counts retractions (its preemptions) in a counter.
func TestSGLangRetractionsArePreemptions(t *testing.T) {
	fams, err := Parse([]byte(`# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4.0
# HELP sglang:num_aborted_requests_total Number of requests aborted.
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="m"} 2.0
`), http.Header{"Content-Type": {"text/plain; version=0.0.4"}})
	if err != nil {
		t.Fatal(err)
	}
	snap := Normalise(Detect(fams), fams)
	if snap.Kind != SGLang || snap.Values[sPreemptions] != 4 || snap.Values[sAborted] != 2 {
		t.Fatalf("%+v", snap)
	}
}

// An engine that answers in OpenMetrics is parsed by the OpenMetrics
// parser; its counter families get back the _total they have on the wire.
func TestOpenMetricsNegotiation(t *testing.T) {
	var accept string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = r.Header.Get("Accept")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
		fmt.Fprint(w, `# TYPE vllm:num_preemptions counter
# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:num_requests_running gauge
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# EOF
`)
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	s := newScraper(t, srv.URL, reg, func(c *config.Engine) { c.Passthrough = true })
	s.Scrape(context.Background())
	got := series(t, reg)
	if got["tokentap_engine_preemptions_total{engine=vllm}"] != 3 || got["tokentap_engine_requests_running{engine=vllm}"] != 2 {
		t.Fatalf("series %v", got)
	}
	if got["vllm:num_preemptions_total{engine=0,model_name=m}"] != 3 {
		t.Errorf("passthrough of an OpenMetrics counter: %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasPrefix(accept, "text/plain;version=0.0.4;q=1,application/openmetrics-text") {
		t.Errorf("Accept %q: the text format first", accept)
	}
}

// The preemption counter follows the engine's across a restart (the
// engine's counter falls back to zero), and the history answers "how
// many between t0 and t1" with the scrapes around the window.
func TestPreemptionCounterAndHistory(t *testing.T) {
	var mu sync.Mutex
	preempt, waiting, kv := 5.0, 0.0, 0.5
	srv := engineServer(t, "/metrics", "text/plain; version=0.0.4", func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("vllm:num_preemptions_total %g\nvllm:num_requests_waiting %g\nvllm:kv_cache_usage_perc %g\nvllm:num_requests_running 4\n", preempt, waiting, kv)
	})
	reg := prometheus.NewRegistry()
	s := newScraper(t, srv.URL, reg, nil)
	set := func(p, w, k float64) {
		mu.Lock()
		preempt, waiting, kv = p, w, k
		mu.Unlock()
	}
	var at []time.Time
	scrape := func() {
		s.Scrape(context.Background())
		s.mu.Lock()
		at = append(at, s.hist.s[len(s.hist.s)-1].t)
		s.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
	scrape()        // 0: 5
	set(9, 0, 0.5)  //
	scrape()        // 1: 9
	set(2, 0, 0.5)  // the engine restarted: 9 → 2 is 2 more
	scrape()        // 2: 11
	set(2, 6, 0.97) // queue and KV up, no preemption
	scrape()        // 3: 11
	if v := series(t, reg)["tokentap_engine_preemptions_total{engine=vllm}"]; v != 11 {
		t.Fatalf("preemptions_total %v after 5, 9, restart, 2: want 11", v)
	}
	mid := func(i int) time.Time { return at[i].Add(at[i+1].Sub(at[i]) / 2) }
	for _, c := range []struct {
		t0, t1 time.Time
		want   int
	}{
		{mid(0), mid(0), 4},     // between scrapes 0 and 1: the window widens to them
		{at[0], at[1], 4},       // exactly on scrapes
		{mid(0), mid(1), 6},     // from scrape 0 to scrape 2
		{at[2], at[3], 0},       // nothing
		{mid(2), time.Now(), 0}, // no scrape after: the latest bounds it
		{at[0].Add(-time.Hour), at[0], 0},
	} {
		if n, ok := s.PreemptionsBetween(c.t0, c.t1); !ok || n != c.want {
			t.Errorf("PreemptionsBetween(%v, %v) = %d, %v; want %d", c.t0.Sub(at[0]), c.t1.Sub(at[0]), n, ok, c.want)
		}
	}

	// Signals: a request whose stall spans scrapes 0→1 was stalled by a
	// preemption; one whose stall spans 2→3 coincided with a full cache.
	stalled := func(from, to time.Time) *record.Record {
		r := record.New(2)
		r.Arrive = from
		r.AddToken(from, 0, true)
		r.AddToken(to, 0, true)
		r.Terminal = to
		return r
	}
	if n, cause := s.Signals(stalled(at[0], at[1]), time.Microsecond); n != 4 || cause != CausePreemption {
		t.Errorf("stall across a preemption: %d, %q", n, cause)
	}
	if n, cause := s.Signals(stalled(at[2], at[3]), time.Microsecond); n != 0 || cause != CauseKVCacheFull {
		t.Errorf("stall at 97%% KV: %d, %q", n, cause)
	}
	if _, cause := s.Signals(stalled(at[2], at[3]), time.Hour); cause != "" {
		t.Errorf("no gap above the threshold, cause %q", cause)
	}
}

func TestQueueSpikeCause(t *testing.T) {
	h := &history{}
	t0 := time.Now()
	for i, w := range []float64{1, 1, 9, 2} {
		h.add(sample{t: t0.Add(time.Duration(i) * time.Second), preempt: 0, waiting: w, kv: 0.5, running: 4})
	}
	if c := h.stallCause(t0.Add(1500*time.Millisecond), t0.Add(2500*time.Millisecond)); c != 1 {
		t.Errorf("queue 1 → 9 across the stall: cause %d, want queue_spike", c)
	}
	if c := h.stallCause(t0.Add(2500*time.Millisecond), t0.Add(3*time.Second)); c != 0 {
		t.Errorf("queue falling: cause %d, want none", c)
	}
}

// Failures are counted by reason; tokentap_engine_up says why; an
// engine with no metrics at all is said once and counted as no_metrics;
// Ollama is read through /api/ps.
func TestFailuresAndFallbacks(t *testing.T) {
	// In a synctest bubble, scraping in memory: the hung engine is timed
	// out by the bubble's clock, and the other scrapes cannot be (the
	// 100 ms timeout used to apply to real scrapes of a loopback server,
	// which a busy machine can take longer than).
	synctest.Test(t, testFailuresAndFallbacks)
}

func testFailuresAndFallbacks(t *testing.T) {
	var mu sync.Mutex
	status := 200
	handler := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		st := status
		mu.Unlock()
		switch {
		case st == 0:
			<-r.Context().Done() // hung: past the scrape's timeout
		case r.URL.Path == "/metrics" && st == 200:
			fmt.Fprint(w, "vllm:num_requests_running 1\n")
		case r.URL.Path == "/metrics" && st == 500:
			http.Error(w, "boom", 500)
		case r.URL.Path == "/metrics" && st == 201:
			fmt.Fprint(w, "vllm:num_requests_running{ 1\n")
		case r.URL.Path == "/metrics" && st == 202: // 1 MB, but more lines than MaxLines
			fmt.Fprint(w, strings.Repeat("vllm:num_requests_running 1\n", MaxLines))
			fmt.Fprint(w, "vllm:num_requests_waiting 0\n")
		default:
			http.NotFound(w, r)
		}
	}
	reg := prometheus.NewRegistry()
	cfg := config.EngineDefaults()
	cfg.Timeout = 100 * time.Millisecond
	u, _ := url.Parse("http://engine.test")
	s := New(Options{Config: cfg, Upstream: u, Registry: reg, Client: handlerClient(handler)})
	step := func(st int, upKey string, failures map[string]float64) {
		t.Helper()
		mu.Lock()
		status = st
		mu.Unlock()
		s.Scrape(context.Background())
		got := series(t, reg)
		if got[upKey] != map[bool]float64{true: 1, false: 0}[strings.Contains(upKey, "reason=ok")] {
			t.Fatalf("after status %d: %s missing or wrong; %v", st, upKey, got)
		}
		for r, n := range failures {
			if got["tokentap_engine_scrape_failures_total{reason="+r+"}"] != n {
				t.Errorf("after status %d: failures{%s} = %v, want %v", st, r, got["tokentap_engine_scrape_failures_total{reason="+r+"}"], n)
			}
		}
	}
	step(200, "tokentap_engine_up{engine=vllm,reason=ok}", nil)
	step(500, "tokentap_engine_up{engine=vllm,reason=http_5xx}", map[string]float64{"http_5xx": 1})
	step(201, "tokentap_engine_up{engine=vllm,reason=parse}", map[string]float64{"parse": 1})
	step(202, "tokentap_engine_up{engine=vllm,reason=too_large}", map[string]float64{"too_large": 1})
	step(0, "tokentap_engine_up{engine=vllm,reason=timeout}", map[string]float64{"timeout": 1})
	step(404, "tokentap_engine_up{engine=vllm,reason=http_4xx}", map[string]float64{"http_4xx": 1}) // the path it knew went away
	step(404, "tokentap_engine_up{engine=vllm,reason=no_metrics}", map[string]float64{"no_metrics": 1})
	step(200, "tokentap_engine_up{engine=vllm,reason=ok}", nil)
	if got := series(t, reg); got["tokentap_engine_requests_running{engine=vllm}"] != 1 {
		t.Errorf("normalised series after recovery: %v", got)
	}
}

// With passthrough, the engine's own families are re-exported untouched
// on the sidecar's registry, except those named like the sidecar's own
// (a Python engine's process_* would collide with the Go collector's).
func TestPassthrough(t *testing.T) {
	body := fixture(t, "vllm-v1.prom") + `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
# HELP python_gc_collections_total Number of times this generation was collected
# TYPE python_gc_collections_total counter
python_gc_collections_total{generation="0"} 120.0
`
	srv := engineServer(t, "/metrics", "text/plain; version=0.0.4; charset=utf-8", func() string { return body })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := newScraper(t, srv.URL, reg, func(c *config.Engine) { c.Passthrough = true })
	s.Scrape(context.Background())
	got := series(t, reg)
	for k, want := range map[string]float64{
		"vllm:num_requests_running{model_name=meta-llama/Llama-3.1-8B-Instruct}":              8,
		"vllm:num_preemptions_total{engine=0,model_name=meta-llama/Llama-3.1-8B-Instruct}":    12,
		"vllm:time_to_first_token_seconds{model_name=meta-llama/Llama-3.1-8B-Instruct}/count": 140,
		"python_gc_collections_total{generation=0}":                                           120,
		"tokentap_engine_requests_running{engine=vllm}":                                       8,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	if got["process_cpu_seconds_total{}"] == 12.5 {
		t.Error("the engine's process_cpu_seconds_total replaced the sidecar's own")
	}
}

// A configured kind wins over detection; the simulator is labelled as such.
func TestConfiguredKind(t *testing.T) {
	srv := engineServer(t, "/metrics", "text/plain", func() string { return "vllm:num_requests_waiting 3\n" })
	reg := prometheus.NewRegistry()
	s := newScraper(t, srv.URL, reg, func(c *config.Engine) { c.Kind = "simulator" })
	s.Scrape(context.Background())
	if v := series(t, reg)["tokentap_engine_requests_waiting{engine=simulator}"]; v != 3 {
		t.Fatalf("waiting %v", v)
	}
}

func TestDetect(t *testing.T) {
	for prefix, want := range map[string]Kind{"vllm:x": VLLM, "sglang:x": SGLang, "tgi_x": TGI, "llamacpp:x": LlamaCpp,
		"trtllm_x": TRTLLM, "dynamo_frontend_x": Dynamo, "other_x": Unknown} {
		fams := map[string]*dto.MetricFamily{prefix: {}, "process_cpu_seconds_total": {}}
		if got := Detect(fams); got != want {
			t.Errorf("%s: %q, want %q", prefix, got, want)
		}
	}
	// A Dynamo worker exports its engine's names too: the engine wins.
	if got := Detect(map[string]*dto.MetricFamily{"dynamo_component_requests_total": {}, "vllm:num_requests_running": {}}); got != VLLM {
		t.Errorf("dynamo worker over vLLM: %q", got)
	}
}

// Run stops when its context ends, and scrapes at its interval meanwhile:
// at 0, 100, 200, 300 and 400 ms of a 450 ms context, on synctest's
// clock (counting real scrapes in 450 ms failed on a busy machine).
func TestRunIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Duration
		t0 := time.Now()
		client := handlerClient(func(w http.ResponseWriter, r *http.Request) {
			at = append(at, time.Since(t0)) // one scrape at a time: Run's goroutine
			fmt.Fprint(w, "vllm:num_requests_running 1\n")
		})
		cfg := config.EngineDefaults()
		cfg.Interval = 100 * time.Millisecond
		u, _ := url.Parse("http://engine.test")
		s := New(Options{Config: cfg, Upstream: u, Client: client})
		ctx, cancel := context.WithTimeout(context.Background(), 450*time.Millisecond)
		defer cancel()
		s.Run(ctx)
		if took := time.Since(t0); took != 450*time.Millisecond {
			t.Errorf("Run returned after %v, want 450ms (its context's end)", took)
		}
		want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond}
		if fmt.Sprint(at) != fmt.Sprint(want) {
			t.Errorf("scrapes at %v, want %v", at, want)
		}
	})
}

// A metrics endpoint that redirects is a failed scrape, http_3xx, and
// the redirect is not followed, by the scraper's own client: its target
// is never asked (issue 40). While detecting, a redirect is a path the
// engine does not have.
func TestRedirectIsNotFollowed(t *testing.T) {
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "vllm:num_requests_running 1\n")
	}))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	for _, c := range []struct{ path, reason string }{{"/metrics", ReasonHTTP3xx}, {"", ReasonNoMetrics}} {
		reg := prometheus.NewRegistry()
		cfg := config.EngineDefaults()
		cfg.Path = c.path
		s := New(Options{Config: cfg, Upstream: u, Registry: reg})
		s.Scrape(context.Background())
		got := series(t, reg)
		up, ok := got["tokentap_engine_up{engine=unknown,reason="+c.reason+"}"]
		if !ok || up != 0 || got["tokentap_engine_scrape_failures_total{reason="+c.reason+"}"] != 1 {
			t.Errorf("path %q: want engine_up 0 and one failure, reason %s; %v", c.path, c.reason, got)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the redirect's target was scraped %d times", n)
	}
}

// WaitingBetween reads the waiting gauge from the last scrape at or
// before from to the last one before to.
func TestWaitingBetween(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sec := func(v float64) time.Time { return t0.Add(time.Duration(v * float64(time.Second))) }
	s := &Scraper{}
	got := func(from, to float64) string {
		var out []string
		s.WaitingBetween(sec(from), sec(to), func(at time.Time, w float64) { out = append(out, fmt.Sprintf("%v:%v", at.Sub(t0).Seconds(), w)) })
		return strings.Join(out, " ")
	}
	if g := got(0, 1); g != "" {
		t.Fatalf("no scrape: %q", g)
	}
	for i, w := range []float64{0, 3, 2, math.NaN(), 0} {
		s.hist.add(sample{t: sec(float64(i)), waiting: w, preempt: math.NaN(), kv: math.NaN()})
	}
	for _, c := range []struct {
		from, to float64
		want     string
	}{{0.5, 2.5, "0:0 1:3 2:2"}, {1.5, 4.5, "1:3 2:2 4:0"}, {2, 2, ""}, {-1, 3, ""}} {
		if g := got(c.from, c.to); g != c.want {
			t.Errorf("WaitingBetween(%v, %v) = %q, want %q", c.from, c.to, g, c.want)
		}
	}
}

// PreemptionsDuring counts a preemption inside a stall, not one at its
// end (the step after it), unless no scrape falls inside the stall.
func TestPreemptionsDuring(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(v int) time.Time { return t0.Add(time.Duration(v) * time.Millisecond) }
	s := &Scraper{}
	for i, p := range []float64{0, 0, 0, 1, 1, 2} { // scrapes every 100 ms: +1 by 300 ms, +1 by 500 ms
		s.hist.add(sample{t: ms(100 * i), preempt: p, waiting: math.NaN(), kv: math.NaN()})
	}
	for _, c := range []struct {
		from, to, want int
	}{
		{50, 290, 0},  // the preemption came after the last scrape inside: the stall's end
		{50, 310, 1},  // the scrape at 300 ms, inside, saw it
		{210, 290, 1}, // no scrape inside: the scrapes around it (200, 300)
		{150, 450, 1},
		{150, 510, 2},
	} {
		if n, ok := s.PreemptionsDuring(ms(c.from), ms(c.to)); !ok || n != c.want {
			t.Errorf("PreemptionsDuring(%d, %d) = %d, %v; want %d", c.from, c.to, n, ok, c.want)
		}
	}
}
