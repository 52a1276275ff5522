package dashboards_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/dashboards"
	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/slo"
)

// Every query must return data but those that need a feature this test
// cannot turn on: GPU energy without cgo (energyQueries). The engine
// panels were exceptions until the engine scraper landed, and the
// prefix-cache hit ratio until the simulator had a prefix cache (issue
// 37): the run below turns it on.

// energyQueries are the queries that need GPU energy: without cgo (no
// NVML, not even its mock) they are the exceptions.
var energyQueries = regexp.MustCompile(`tokentap_gpu_|tokentap_energy_(attributed|unattributed|idle|sampling|cost)|tokentap_request_energy|tokentap_decode_|energy:tokentap_`)

const sidecarConfig = `
simulator:
  seed: 7
  prefix_cache_blocks: 64
slo:
  stall_threshold: 100ms
  objectives:
    - name: interactive
      target: 0.9
      window: 30s
      thresholds: {ttft: 150ms, tpot: 30ms, max_itl: 200ms, fluidity: 0.8}
      fluidity: {deadline: 300ms, cadence: 40ms}
      count_cancelled: false
    - name: batch
      target: 0.99
      window: 30s
      thresholds: {e2e: 3s, min_output_tokens: 1}
    # The knee panels need a load bucket with 20 requests whose attainment
    # lower bound meets the target. The two SLOs above find one on an idle
    # machine and lose it on a loaded one (the simulator's latencies grow
    # with the machine's load); this one meets its target on any machine.
    - name: relaxed
      target: 0.5
      window: 30s
      thresholds: {e2e: 10s}
      count_cancelled: false
    # The breach forecast's panels need a forecast: an SLO no request
    # meets (the simulator takes more than 1 ms) is proven missed in every
    # load bucket with 20 requests, so the load is in its breach bucket
    # now (0 s) once the forecast's fit has its samples: 10 of at least 10
    # requests spanning 30 s of capacity.forecast_window below.
    - name: never
      target: 0.5
      window: 30s
      thresholds: {e2e: 1ms}
      count_cancelled: false
    # The structure panels: every fifth request asks for a JSON output,
    # which the simulator's words are not (output_invalid_json, or
    # truncated_json when cut by max_tokens).
    - name: structured
      target: 0.9
      window: 30s
      structure: required
      thresholds: {e2e: 10s}
probes:
  probes:
    - name: sim-canary
      interval: 1s
      max_tokens: 8
      ignore_eos: true
      prompt: "tokentap canary: say eight words."
      expect: {finish_reason: length, output_tokens_min: 8, output_tokens_max: 8}
    - name: quality-canary
      interval: 2s
      max_tokens: 4
      prompt: "What is the capital of France?"
      expect: {contains: Paris}
# The breach forecast's shortest window: its fit within the 40 s of load.
capacity:
  forecast_window: 1m
# Tenants on (their panels need the per-tenant series): with no key
# sent, every request is tenant _none.
tenant:
  from: api_key
# The live prefix reuse (its panels), without a capture file.
reuse:
  enabled: on
  cache_blocks: [4, 64]
# The example price (deploy/examples/tokentap.yaml): the cost rules need
# a declared price, and the energy share an energy price.
cost:
  currency: EUR
  per_gpu_hour: 2.75
  gpus: 4
  energy_per_kwh: 0.25
`

// TestEveryPanelQueryReturnsData runs the sidecar binary in front of its
// simulator, with SLOs, probes and the example price declared, plus (with cgo and the nvml tag) a second sidecar in-process whose GPUs are
// go-nvml's mock (SYNTHETIC energy), drives bounded load through both,
// lets two real Prometheus servers scrape them every second (one
// ingesting classic buckets, one native histograms) with the shipped
// rules loaded (windows divided by 120), and runs every panel query of
// every dashboard through the HTTP API, with the variables at their
// defaults and $__rate_interval expanded as Grafana would. Each query must
// parse and return data on both servers, except the documented
// exceptions.
func TestEveryPanelQueryReturnsData(t *testing.T) {
	promBin := testtool.Need(t, "prometheus")
	dir := t.TempDir()
	started := time.Now()

	// The sidecar binary: the default run (the built-in simulator), with
	// SLOs and two probes declared, and a records file.
	bin := filepath.Join(dir, "tokentap")
	build := exec.Command("go", "build", "-o", bin, "../cmd/sidecar")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building the sidecar: %v", err)
	}
	cfg := filepath.Join(dir, "tokentap.yaml")
	os.WriteFile(cfg, []byte(sidecarConfig), 0o644)
	proxy, admin := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc := exec.CommandContext(ctx, bin, "--config", cfg, "--listen", proxy, "--admin-listen", admin,
		"--records", filepath.Join(dir, "records.jsonl"))
	sclog, _ := os.Create(filepath.Join(dir, "sidecar.log"))
	sc.Stdout, sc.Stderr = sclog, sclog
	if err := sc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); sc.Wait() }()
	waitUp(t, "http://"+admin+"/healthz")

	targets := []scrapeTarget{{job: "tokentap", addr: admin}}
	proxies := []string{proxy}
	// The second sidecar, with synthetic GPU energy (cgo builds with the nvml tag only).
	gpuTarget, gpuProxy := startSyntheticGPUSidecar(t, dir)
	if gpuTarget != "" {
		targets = append(targets, scrapeTarget{job: "tokentap-SYNTHETIC-gpu-mock", addr: gpuTarget})
		proxies = append(proxies, gpuProxy)
	}

	// Rules as shipped, windows divided by 120 (1h → 30s, 1d → 12m).
	rules, err := slo.PlainRules(slo.RuleParams{Scale: 120})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644)
	proms := map[string]string{
		"classic": startPrometheus(t, ctx, promBin, filepath.Join(dir, "classic"), targets),
		"native":  startPrometheus(t, ctx, promBin, filepath.Join(dir, "native"), targets, "--enable-feature=native-histograms"),
	}

	// Bounded load: 40 s of a few closed-loop clients per sidecar, some
	// of which give up mid-stream (cancellations), two models.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range proxies {
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				drive(p, i, stop)
			}(i)
		}
	}
	loadFor := 40 * time.Second
	time.Sleep(loadFor)
	close(stop)
	wg.Wait()
	// Let the last requests be scraped and the rules run.
	time.Sleep(3 * time.Second)

	// Each server holds the histograms in the form it claims: the native
	// one as native histograms (no _bucket series), the classic one as
	// buckets; so the native side of every histogram query was exercised
	// on one and the classic fallback on the other.
	for name, prom := range proms {
		native, _ := query(prom, `gen_ai_server_time_to_first_token_seconds`, true, time.Time{}, time.Now())
		classic, _ := query(prom, `gen_ai_server_time_to_first_token_seconds_bucket`, true, time.Time{}, time.Now())
		if (name == "native") != (native > 0 && classic == 0) || (name == "classic") != (classic > 0 && native == 0) {
			t.Errorf("%s Prometheus: %d native histogram series, %d classic bucket series", name, native, classic)
		}
	}

	// The default run exports the engine signals for its simulator.
	if m := scrapeText(t, admin); !strings.Contains(m, "tokentap_engine_requests_running") {
		t.Errorf("the default run's /metrics has no tokentap_engine_* series")
	}

	var ok, failed, excepted []string
	total := 0
	end := time.Now()
	window := 60 * time.Second
	for _, f := range dashboards.Files() {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Templating struct {
				List []struct {
					Name       string `json:"name"`
					Type       string `json:"type"`
					Definition string `json:"definition"`
					AllValue   string `json:"allValue"`
					Current    struct {
						Value string `json:"value"`
					} `json:"current"`
				} `json:"list"`
			} `json:"templating"`
			Panels []struct {
				Type    string `json:"type"`
				Title   string `json:"title"`
				Targets []struct {
					RefID   string `json:"refId"`
					Expr    string `json:"expr"`
					Instant bool   `json:"instant"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			switch {
			case v.Type == "datasource":
			case v.Current.Value == "$__all":
				vars[v.Name] = v.AllValue
			default:
				vars[v.Name] = v.Current.Value
			}
			// The variable's own query must run; its values must exist
			// except for the Kubernetes labels, absent here.
			if v.Type == "query" {
				for name, prom := range proms {
					vals, err := labelValues(prom, substitute(v.Definition, vars, window))
					if err != nil || (len(vals) == 0 && v.Name != "namespace" && v.Name != "pod") {
						t.Errorf("%s: variable %s on %s: %v values, %v", f, v.Name, name, vals, err)
					}
				}
			}
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				total++
				q := substitute(tg.Expr, vars, window)
				id := fmt.Sprintf("%s / %s / %s", f, p.Title, tg.RefID)
				if strings.Contains(q, "$") {
					t.Errorf("%s: unsubstituted variable in %s", id, q)
				}
				reason := ""
				if gpuTarget == "" && energyQueries.MatchString(q) {
					reason = "needs GPU energy: the NVML mock needs cgo"
				}
				var problems []string
				for _, name := range []string{"classic", "native"} {
					n, err := query(proms[name], q, tg.Instant, end.Add(-window), end)
					switch {
					case err != nil:
						problems = append(problems, name+": "+err.Error())
					case n == 0 && reason == "":
						problems = append(problems, name+": no data")
					}
				}
				switch {
				case len(problems) > 0:
					failed = append(failed, fmt.Sprintf("%s: %s\n      %s", id, strings.Join(problems, "; "), q))
				case reason != "":
					excepted = append(excepted, id+": "+reason)
				default:
					ok = append(ok, id)
				}
			}
		}
	}
	sort.Strings(excepted)
	for _, e := range excepted {
		t.Logf("exception: %s", e)
	}
	for _, f := range failed {
		t.Errorf("query failed: %s", f)
	}
	t.Logf("%d of %d panel queries returned data on both Prometheus servers (classic buckets and native histograms); %d documented exceptions; %d failed (%.0fs)",
		len(ok), total, len(excepted), len(failed), time.Since(started).Seconds())
	if len(ok)+len(excepted) != total || len(ok) == 0 {
		t.Errorf("counted %d ok + %d exceptions of %d", len(ok), len(excepted), total)
	}
}

// substitute does what Grafana does before a query leaves it: template
// variables (regex values, as multi-value variables with All are sent)
// and the interval macros. $__rate_interval is Grafana's
// max($__interval + scrape interval, 4 × scrape interval) for a 1 s
// scrape interval and the step used here.
func substitute(q string, vars map[string]string, window time.Duration) string {
	r := []string{"$__rate_interval", "4s", "$__interval", "2s", "$__range", fmt.Sprintf("%ds", int(window.Seconds()))}
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	for _, k := range names {
		r = append(r, "${"+k+"}", vars[k], "$"+k, vars[k])
	}
	return strings.NewReplacer(r...).Replace(q)
}

type scrapeTarget struct{ job, addr string }

func startPrometheus(t *testing.T, ctx context.Context, bin, dir string, targets []scrapeTarget, flags ...string) string {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	var sb strings.Builder
	sb.WriteString("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [../rules.yaml]\nscrape_configs:\n")
	for _, tg := range targets {
		fmt.Fprintf(&sb, "  - job_name: %s\n    static_configs: [{targets: [%q]}]\n", tg.job, tg.addr)
	}
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(sb.String()), 0o644)
	addr := freePort(t)
	args := append([]string{"--config.file=" + filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr, "--log.level=warn"}, flags...)
	cmd := exec.CommandContext(ctx, bin, args...)
	logf, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("%s log:\n%s", dir, b)
		}
	})
	waitUp(t, "http://"+addr+"/-/ready")
	return addr
}

// drive sends requests until stop closes: streamed chats of a few
// lengths for two models; every fourth request is cancelled after its
// first bytes, every seventh is not streamed.
func drive(proxy string, worker int, stop <-chan struct{}) {
	client := &http.Client{Timeout: 20 * time.Second}
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		model := []string{"llama", "qwen"}[(worker+n)%2]
		stream := n%7 != 6
		format := ""
		if n%5 == 4 {
			format = `,"response_format":{"type":"json_object"}`
		}
		prompt := strings.Repeat("hello ", 1+(n*13)%300)
		if n%8 == 5 {
			// A long prompt, its own from its first block (the prefix
			// cache holds none of it): about 6,000 tokens, 310 ms of
			// the simulator's prefill, so that the slow-first-token
			// panels have a slow first token however fast or loaded the
			// machine (a busy run's short prompts once had none).
			prompt = fmt.Sprintf("w%d n%d ", worker, n) + strings.Repeat("x ", 12000)
		}
		body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%q}]%s}`,
			model, stream, 4+(n*7)%40, prompt, format)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			if n%4 == 3 && stream {
				buf := make([]byte, 64)
				resp.Body.Read(buf)
				cancel()
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
	}
}

// query runs a range query (or an instant one) and counts the finite
// sample values that came back. A query that does not parse is an error.
func query(prom, q string, instant bool, start, end time.Time) (int, error) {
	v := url.Values{"query": {q}}
	path := "/api/v1/query_range"
	if instant {
		path = "/api/v1/query"
		v.Set("time", strconv.FormatInt(end.Unix(), 10))
	} else {
		v.Set("start", strconv.FormatInt(start.Unix(), 10))
		v.Set("end", strconv.FormatInt(end.Unix(), 10))
		v.Set("step", "2")
	}
	resp, err := http.PostForm("http://"+prom+path, v)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value      []any   `json:"value"`
				Values     [][]any `json:"values"`
				Histogram  []any   `json:"histogram"`
				Histograms [][]any `json:"histograms"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	n := 0
	finite := func(p []any) {
		if len(p) == 2 {
			if s, ok := p[1].(string); ok {
				if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
					n++
				}
			}
		}
	}
	for _, s := range r.Data.Result {
		finite(s.Value)
		for _, p := range s.Values {
			finite(p)
		}
		n += len(s.Histograms)
		if len(s.Histogram) > 0 {
			n++
		}
	}
	return n, nil
}

// labelValues runs a Grafana label_values(selector, label) variable query
// as Grafana does, through the series API.
func labelValues(prom, def string) ([]string, error) {
	m := regexp.MustCompile(`^label_values\((.*), *(\w+)\)$`).FindStringSubmatch(def)
	if m == nil {
		return nil, fmt.Errorf("not a label_values query: %s", def)
	}
	resp, err := http.Get("http://" + prom + "/api/v1/series?" + url.Values{"match[]": {m[1]}}.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string              `json:"status"`
		Error  string              `json:"error"`
		Data   []map[string]string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range r.Data {
		if v, ok := s[m[2]]; ok && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out, nil
}

func scrapeText(t *testing.T, admin string) string {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitUp(t *testing.T, u string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(u); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 in 30 s", u)
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
