package app

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/slo"
)

// fleetSLOs are the fleet test's SLOs and targets: one that the slow
// simulator's TPOT misses, one that every answer meets.
var fleetSLOs = []struct {
	name   string
	target float64
}{{"interactive", 0.9}, {"relaxed", 0.5}}

// fleetMember is one sidecar of the fleet: its simulator's decode step,
// its declared price, and its bounded load (clients × requests each).
type fleetMember struct {
	name              string
	decodeBase        time.Duration
	price             float64 // EUR per hour
	clients, requests int

	admin, proxy, records string
}

// fleetCounts are one sidecar's counts, from its records, by SLO (and by
// SLO and load bucket).
type fleetCounts struct {
	offered, qualified, tokens map[string]float64
	offeredByLoad, qualByLoad  map[[2]string]float64
	n                          int
}

// The fleet: three sidecars in front of three simulators of different
// speeds (decode steps of 4, 12 and 40 ms; TPOT about that), with
// different declared prices, scraped by one real Prometheus that
// evaluates the shipped rules (deploy/prometheus/tokentap-rules.yaml,
// windows as shipped). After a bounded load (2 × 30, 1 × 30 and 1 × 20
// streamed requests) the fleet's attainment, its 95% Wilson lower bound,
// goodput, cost per 1M goodput tokens and the knee, as the recording
// rules give them and as the dashboards' fleet panels read them, equal
// the values computed here from the three sidecars' records pooled.
//
// Prometheus' increase() and rate() extrapolate each sidecar's counter
// from its samples to the window's edges (by up to 1.1 scrape intervals,
// a factor that differs per sidecar with its scrape offset), and a series
// created by the first request counted (the by-load counters) loses the
// count its first scrape saw. The test therefore reads each sidecar's raw
// samples at the evaluation instant, checks that their values are the
// records' counts, and applies Prometheus' extrapolation (extrapolated,
// below) to them: the rules' values are then equal to 1e-9. It reports
// the pooled figures of the records alone beside them.
func TestFleetOnOnePrometheus(t *testing.T) {
	promBin := testtool.Need(t, "prometheus")
	fleet := []*fleetMember{
		{name: "fast", decodeBase: 4 * time.Millisecond, price: 2, clients: 2, requests: 30},
		{name: "medium", decodeBase: 12 * time.Millisecond, price: 3, clients: 1, requests: 30},
		{name: "slow", decodeBase: 40 * time.Millisecond, price: 5, clients: 1, requests: 20},
	}
	dir := t.TempDir()
	var targets []string
	for i, m := range fleet {
		cfg := filepath.Join(dir, m.name+".yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf(`
simulator:
  seed: %d
  decode_base: %s
  decode_per_seq: 1ms
  prefill_base: 2ms
  jitter: 0.05
  stall_prob: 0
  error_prob: 0.02
  eos_prob: 0
slo:
  objectives:
    - name: interactive
      target: 0.9
      window: 1h
      thresholds: {tpot: 25ms}
    - name: relaxed
      target: 0.5
      window: 1h
      thresholds: {e2e: 30s}
cost:
  currency: EUR
  per_hour: %g
`, i+1, m.decodeBase, m.price)), 0o644)
		a, records := startSidecar(t, "", "--config", cfg, "--upstream", "", "--energy", "off")
		if !a.Simulated {
			t.Fatal("expected the built-in simulator")
		}
		m.admin, m.proxy, m.records = a.Admin, a.Proxy, records
		targets = append(targets, a.Admin)
	}
	prom := startFleetPrometheus(t, promBin, targets)
	api := promAPI{t: t, addr: prom}
	commits := api.watchCommits()
	t.Cleanup(commits.close)

	// Every sidecar is scraped, its SLO counters at 0, before any request:
	// each counter's first sample in any window is 0.
	fleetWait(t, "the first scrape of the three sidecars", func() bool {
		return len(api.vector(`tokentap_slo_requests_total{slo="relaxed"} == 0`, 0)) == len(fleet)
	})

	// Bounded load: every client sends its requests one after the other.
	var wg sync.WaitGroup
	for _, m := range fleet {
		for range m.clients {
			wg.Go(func() {
				client := &http.Client{Timeout: 60 * time.Second}
				body := `{"model":"tokentap-sim","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"How fast is this replica?"}]}`
				for range m.requests {
					resp, err := client.Post("http://"+m.proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	wg.Wait()

	// The records, per sidecar.
	counts := map[string]*fleetCounts{} // by admin address (Prometheus' instance)
	for _, m := range fleet {
		counts[m.admin] = readFleetRecords(t, m.records, m.clients*m.requests)
	}
	// Prometheus has scraped every sidecar's final counts.
	fleetWait(t, "Prometheus to scrape the final counts", func() bool {
		for _, m := range fleet {
			v := api.vector(fmt.Sprintf(`tokentap_slo_requests_total{slo="relaxed", instance=%q}`, m.admin), 0)
			if len(v) != 1 || v[0].v != counts[m.admin].offered["relaxed"] {
				return false
			}
		}
		return true
	})
	// A sample is stored some time after its timestamp (the scrape's
	// start): the scrape's own duration (scrape_duration_seconds), then
	// the parse, append and commit, which commits (watchCommits) bounds
	// by measuring them throughout the test. A rule evaluation is checked
	// only when every sidecar's last sample before it was stored before
	// it: older than that scrape's duration plus twice the longest commit
	// measured, at least 0.1 s (settled). The rules run every 7.8 s and
	// the scrapes every 6 s, so the gap between them turns through ten
	// phases 0.6 s apart: on a busy machine whose scrapes take long, more
	// evaluations are skipped, none is misread (startFleetPrometheus).
	// margin, three times the longest scrape, bounds the cost check's
	// tolerance for the price's slope.
	margin := 0.05
	for _, s := range api.vector(`max_over_time(scrape_duration_seconds[10m])`, 0) {
		margin = math.Max(margin, 3*s.v)
	}
	t.Logf("scrapes took up to %.3f s; %s", margin/3, commits)
	final := time.Now()

	// The pooled figures of the records alone.
	var pure strings.Builder
	for _, s := range fleetSLOs {
		var o, q, tok float64
		for _, c := range counts {
			o, q, tok = o+c.offered[s.name], q+c.qualified[s.name], tok+c.tokens[s.name]
		}
		fmt.Fprintf(&pure, "%s: %v/%v qualified = %.4f (Wilson 95%% lower %.4f), %v goodput tokens; ", s.name, q, o, q/o,
			slo.WilsonLower(q, o, slo.Z95), tok)
	}
	t.Logf("records pooled: %s", pure.String())

	// Each rule group at two of its evaluations after the final scrape
	// whose inputs were all stored before it (the last sample of every
	// sidecar older than the margin).
	groups := []struct {
		name, probe string
		check       func(at int64) map[string]float64 // recorded series → expected value
	}{
		{"tokentap-slo-recording", `slo:tokentap_attainment:ratio1h{slo="relaxed"}`, func(at int64) map[string]float64 {
			return expectSLOGroup(t, api, at, counts)
		}},
		{"tokentap-cost-recording", `slo:tokentap_cost_per_million_goodput_tokens:ratio1h{slo="relaxed"}`, func(at int64) map[string]float64 {
			return expectCostGroup(t, api, at, margin, fleet, counts)
		}},
		{"tokentap-knee-recording", `slo_load:tokentap_offered:increase1d{slo="relaxed"}`, func(at int64) map[string]float64 {
			return expectKneeGroup(t, api, at, counts)
		}},
	}
	panels := fleetPanelQueries(t)
	shown := map[string]bool{}
	check := func(group string, at int64, want map[string]float64) {
		for series, w := range want {
			got := api.vector(series, at)
			switch {
			case math.IsNaN(w) && len(got) != 0:
				t.Errorf("%s at %s: %s = %v, want none (from the records)", group, msTime(at), series, got)
			case !math.IsNaN(w) && (len(got) != 1 || !fleetNear(got[0].v, w)):
				t.Errorf("%s at %s: %s = %v, want %v (from the records)", group, msTime(at), series, got, w)
			}
			// The dashboards' fleet panels read the same values.
			name, sloName := splitSeries(series)
			for _, q := range panels[name] {
				for _, r := range api.vector(strings.ReplaceAll(q, "$slo", ".*"), at) {
					if r.labels["slo"] != sloName {
						continue
					}
					shown[name] = true
					if !fleetNear(r.v, w) {
						t.Errorf("dashboard query %s at %s: slo %s = %v, want %v", q, msTime(at), sloName, r.v, w)
					}
				}
			}
		}
	}
	for _, g := range groups {
		checked := map[int64]bool{}
		for deadline := time.Now().Add(2 * time.Minute); len(checked) < 2 && time.Now().Before(deadline); time.Sleep(time.Second) {
			for _, at := range api.evalTimes(g.probe, final) {
				if len(checked) == 2 || checked[at] || !api.settled(at, commits.bound()) {
					continue
				}
				want := g.check(at)
				check(g.name, at, want)
				if len(checked) == 0 {
					var keys []string
					for k := range want {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					for _, k := range keys {
						t.Logf("%s at %s: %s = %.6g", g.name, msTime(at), k, want[k])
					}
				}
				checked[at] = true
			}
		}
		if len(checked) < 2 {
			t.Errorf("%s: %d evaluations with every input stored checked, want 2; evaluated at %v; the rule groups: %s",
				g.name, len(checked), api.evalTimes(g.probe, final), api.ruleHealth())
		}
	}
	for _, name := range []string{"slo:tokentap_attainment:ratio1h", "slo:tokentap_attainment_lower95:ratio1h", "slo:tokentap_goodput_tokens:rate5m",
		"slo:tokentap_goodput_requests:rate5m", "slo:tokentap_cost_per_million_goodput_tokens:ratio1h", "slo:tokentap_knee_load:max1d"} {
		if !shown[name] {
			t.Errorf("no dashboard fleet panel shows %s", name)
		}
	}
}

// readFleetRecords reads a sidecar's records file once it holds want
// records, and counts them as the SLO and knee counters count.
func readFleetRecords(t *testing.T, path string, want int) *fleetCounts {
	t.Helper()
	type verdict struct {
		Name      string `json:"name"`
		Qualified bool   `json:"qualified"`
		Excluded  bool   `json:"excluded"`
	}
	type rec struct {
		OutputTokens *float64  `json:"output_tokens"`
		LoadBucket   string    `json:"load_bucket"`
		SLO          []verdict `json:"slo"`
	}
	var lines []string
	fleetWait(t, fmt.Sprintf("%d records in %s", want, path), func() bool {
		b, _ := os.ReadFile(path)
		lines = strings.Split(strings.TrimSpace(string(b)), "\n")
		return len(b) > 0 && len(lines) >= want
	})
	c := &fleetCounts{offered: map[string]float64{}, qualified: map[string]float64{}, tokens: map[string]float64{},
		offeredByLoad: map[[2]string]float64{}, qualByLoad: map[[2]string]float64{}, n: len(lines)}
	for _, l := range lines {
		var r rec
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("record %q: %v", l, err)
		}
		for _, v := range r.SLO {
			if v.Excluded {
				continue
			}
			c.offered[v.Name]++
			if r.LoadBucket != "" {
				c.offeredByLoad[[2]string{v.Name, r.LoadBucket}]++
			}
			if v.Qualified {
				c.qualified[v.Name]++
				if r.LoadBucket != "" {
					c.qualByLoad[[2]string{v.Name, r.LoadBucket}]++
				}
				if r.OutputTokens != nil && *r.OutputTokens > 0 {
					c.tokens[v.Name] += *r.OutputTokens
				}
			}
		}
	}
	return c
}

// expectSLOGroup returns the SLO recording rules' values at the instant
// at, from the records' counts and Prometheus' extrapolation of each
// sidecar's samples.
func expectSLOGroup(t *testing.T, api promAPI, at int64, counts map[string]*fleetCounts) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range fleetSLOs {
		sel := fmt.Sprintf(`{slo=%q}`, s.name)
		off := api.pooled("tokentap_slo_requests_total"+sel, time.Hour, at, false, func(inst string) float64 { return counts[inst].offered[s.name] })
		qual := api.pooled("tokentap_slo_qualified_requests_total"+sel, time.Hour, at, false, func(inst string) float64 { return counts[inst].qualified[s.name] })
		out["slo:tokentap_attainment:ratio1h"+sel] = qual / off
		out["slo:tokentap_attainment_lower95:ratio1h"+sel] = promWilson(qual, off)
		out["slo:tokentap_goodput_requests:rate5m"+sel] = api.pooled("tokentap_slo_qualified_requests_total"+sel, 5*time.Minute, at, true,
			func(inst string) float64 { return counts[inst].qualified[s.name] })
		out["slo:tokentap_goodput_tokens:rate5m"+sel] = api.pooled("tokentap_slo_qualified_output_tokens_total"+sel, 5*time.Minute, at, true,
			func(inst string) float64 { return counts[inst].tokens[s.name] })
	}
	return out
}

// expectCostGroup returns the cost per 1M goodput tokens at at: every
// sidecar is priced and serves both SLOs, so it is 10⁶ × the fleet's
// cost per second ÷ its goodput tokens per second.
func expectCostGroup(t *testing.T, api promAPI, at int64, margin float64, fleet []*fleetMember, counts map[string]*fleetCounts) map[string]float64 {
	t.Helper()
	// The cost counters accrue each sidecar's declared price: checked
	// against the price, to within the scrape's own duration.
	price := map[string]float64{}
	for _, m := range fleet {
		price[m.admin] = m.price
	}
	var cost float64
	for _, s := range api.matrix(`tokentap_replica_cost_total`, time.Hour, at) {
		first, last := s.samples[0], s.samples[len(s.samples)-1]
		slope := (last.v - first.v) / (float64(last.t-first.t) / 1000) * 3600
		// The counter is read when scraped, its sample stamped when the
		// scrape began: each end is off by at most a scrape's duration.
		if p, span := price[s.labels["instance"]], float64(last.t-first.t)/1000; math.Abs(slope/p-1) > 2*margin/3/span {
			t.Errorf("%s accrues %v EUR/h, declared %v", s.labels["instance"], slope, p)
		}
		cost += extrapolated(s.samples, at-time.Hour.Milliseconds(), at, true) / time.Hour.Seconds()
	}
	out := map[string]float64{}
	for _, s := range fleetSLOs {
		sel := fmt.Sprintf(`{slo=%q}`, s.name)
		good := api.pooled("tokentap_slo_qualified_output_tokens_total"+sel, time.Hour, at, true, func(inst string) float64 { return counts[inst].tokens[s.name] })
		out[fmt.Sprintf(`slo:tokentap_cost_per_million_goodput_tokens:ratio1h{slo=%q, currency="EUR"}`, s.name)] = 1e6 * cost / good
	}
	return out
}

// expectKneeGroup returns the knee and its evidence at at: per SLO and
// load bucket, the pooled offered and qualified counts (by-load counters
// that every sidecar pre-creates for every bucket), their
// Wilson lower bound, and the highest bucket with at least 20 requests
// whose bound meets the target.
func expectKneeGroup(t *testing.T, api promAPI, at int64, counts map[string]*fleetCounts) map[string]float64 {
	t.Helper()
	bound := map[string]float64{}
	for _, s := range api.vector(`max by (load) (tokentap_slo_load_bucket_bound)`, at) {
		bound[s.labels["load"]] = s.v
	}
	out := map[string]float64{}
	var pure []string
	for _, s := range fleetSLOs {
		byLoad := func(metric string, want func(inst, load string) float64) map[string]float64 {
			sum := map[string]float64{}
			series := api.matrix(fmt.Sprintf(`%s{slo=%q}`, metric, s.name), 24*time.Hour, at)
			// Every (sidecar, load bucket) pair: the counters exist from
			// the start, at 0 where the records have none.
			if buckets := len(counts) * len(bound); len(series) != buckets {
				t.Errorf("%s{slo=%q}: %d series, want one per sidecar and load bucket, %d", metric, s.name, len(series), buckets)
			}
			for _, m := range series {
				inst, load := m.labels["instance"], m.labels["load"]
				if last := m.samples[len(m.samples)-1].v; last != want(inst, load) {
					t.Errorf("%s{slo=%q, load=%q} of %s: %v, the records count %v", metric, s.name, load, inst, last, want(inst, load))
				}
				if len(m.samples) >= 2 {
					sum[load] += extrapolated(m.samples, at-(24*time.Hour).Milliseconds(), at, true)
				}
			}
			return sum
		}
		off := byLoad("tokentap_slo_requests_by_load_total", func(inst, load string) float64 { return counts[inst].offeredByLoad[[2]string{s.name, load}] })
		qual := byLoad("tokentap_slo_qualified_requests_by_load_total", func(inst, load string) float64 { return counts[inst].qualByLoad[[2]string{s.name, load}] })
		knee, evidence, found := 0.0, 0.0, false
		for load, o := range off {
			q, ok := qual[load]
			if ok && promWilson(q, o) >= s.target && o >= slo.KneeMinRequests && (!found || bound[load] > knee) {
				knee, evidence, found = bound[load], o, true
			}
		}
		// The same from the records alone.
		pk, pe := "none", 0.0
		pooled := map[string][2]float64{}
		for _, c := range counts {
			for k, v := range c.offeredByLoad {
				if k[0] == s.name {
					p := pooled[k[1]]
					pooled[k[1]] = [2]float64{p[0] + v, p[1] + c.qualByLoad[k]}
				}
			}
		}
		for load, p := range pooled {
			if slo.WilsonLower(p[1], p[0], slo.Z95) >= s.target && p[0] >= slo.KneeMinRequests && (pk == "none" || bound[load] > bound[pk]) {
				pk, pe = load, p[0]
			}
		}
		pure = append(pure, fmt.Sprintf("%s: load ≤ %s, %v requests (%v)", s.name, pk, pe, pooled))
		if !found { // no knee: the rules record none
			knee, evidence = math.NaN(), math.NaN()
		}
		out[fmt.Sprintf(`slo:tokentap_knee_load:max1d{slo=%q}`, s.name)] = knee
		out[fmt.Sprintf(`slo:tokentap_knee_evidence:increase1d{slo=%q}`, s.name)] = evidence
		if s.name == "relaxed" && (!found || pk == "none" || bound[pk] != knee) {
			t.Errorf("relaxed: the knee from Prometheus' counts (%v, found %v) is not the records' (%s)", knee, found, pk)
		}
	}
	t.Logf("knee from the records pooled: %s", strings.Join(pure, "; "))
	return out
}

// promWilson is the one-sided 95% Wilson lower bound as the shipped
// rules compute it: slo's wilsonExpr, its constants written with six
// decimals.
func promWilson(k, n float64) float64 {
	c := func(v float64) float64 { f, _ := strconv.ParseFloat(fmt.Sprintf("%.6f", v), 64); return f }
	z, z2 := c(slo.Z95), slo.Z95*slo.Z95
	p := k / n
	return math.Max((p+c(z2/2)/n-z*math.Sqrt(p*(1-p)/n+c(z2/4)/(n*n)))/(1+c(z2)/n), 0)
}

// extrapolated is Prometheus 2's increase() (or, divided by the window,
// rate()) of a counter's samples in the window (start, end] in
// milliseconds (promql/functions.go, extrapolatedRate): the samples'
// increase, extrapolated to the window's edges by at most 1.1 average
// sample intervals (else half an interval), and towards the start no
// further than where the counter would have been 0.
func extrapolated(s []promSample, start, end int64, counter bool) float64 {
	if len(s) < 2 {
		return math.NaN()
	}
	first, last := s[0], s[len(s)-1]
	result := last.v - first.v
	if counter {
		prev := 0.0
		for _, p := range s {
			if p.v < prev {
				result += prev
			}
			prev = p.v
		}
	}
	toStart, toEnd := float64(first.t-start)/1000, float64(end-last.t)/1000
	sampled := float64(last.t-first.t) / 1000
	avg := sampled / float64(len(s)-1)
	if counter && result > 0 && first.v >= 0 {
		if toZero := sampled * (first.v / result); toZero < toStart {
			toStart = toZero
		}
	}
	threshold, interval := avg*1.1, sampled
	if toStart < threshold {
		interval += toStart
	} else {
		interval += avg / 2
	}
	if toEnd < threshold {
		interval += toEnd
	} else {
		interval += avg / 2
	}
	return result * interval / sampled
}

// fleetPanelQueries returns the queries of the dashboards' panels that
// read a recording rule by SLO alone (the fleet panels), by rule name.
func fleetPanelQueries(t *testing.T) map[string][]string {
	t.Helper()
	files, _ := filepath.Glob("../dashboards/*.json")
	re := regexp.MustCompile(`^(slo:[a-z0-9_:]+)\{slo=~"\$slo"\}$`)
	out := map[string][]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				if m := re.FindStringSubmatch(tg.Expr); m != nil {
					out[m[1]] = append(out[m[1]], tg.Expr)
				}
			}
		}
	}
	return out
}

// splitSeries returns a series selector's metric name and its slo label.
func splitSeries(s string) (name, sloName string) {
	name, rest, _ := strings.Cut(s, "{")
	if m := regexp.MustCompile(`slo="([^"]*)"`).FindStringSubmatch(rest); m != nil {
		sloName = m[1]
	}
	return name, sloName
}

func fleetNear(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func msTime(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05.000") }

// startFleetPrometheus runs a Prometheus that scrapes the given sidecars
// (one job, tokentap) every 6 s and evaluates the shipped rules file
// every 7.8 s; it returns its address. An evaluation is checked only
// when every sidecar's last scrape before it had ended and been stored
// (settled), and Prometheus spreads the three sidecars' scrapes over
// the interval: each blocks the evaluations for its scrape's duration
// and commit. At 2 s a busy run's scrapes (0.8 s and 0.1 s, with -race
// beside two busy loops) blocked every instant of the interval, and no
// evaluation could be checked; at 6 s about half of it stays clear.
func startFleetPrometheus(t *testing.T, bin string, targets []string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs("../deploy/prometheus/tokentap-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(targets))
	for i, a := range targets {
		quoted[i] = strconv.Quote(a)
	}
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fmt.Sprintf(`
global:
  scrape_interval: 6s
  evaluation_interval: 7800ms
rule_files: [%q]
scrape_configs:
  - job_name: tokentap
    static_configs: [{targets: [%s]}]
`, rules, strings.Join(quoted, ", "))), 0o644)
	prom := freePort(t)
	testtool.Start(t, "prometheus", bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+prom, "--log.level=warn")
	// Until its storage is open, Prometheus answers its API with a plain
	// "Service Unavailable": wait for /-/ready.
	fleetWait(t, "Prometheus to be ready", func() bool {
		resp, err := http.Get("http://" + prom + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return prom
}

// fleetWait checks cond every 200 ms until it holds, for at most two
// minutes (a bound on a wait, not a measurement).
func fleetWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// promAPI queries a Prometheus' HTTP API.
type promAPI struct {
	t    *testing.T
	addr string
}

type promSample struct {
	t int64 // milliseconds
	v float64
}

type promSeries struct {
	labels  map[string]string
	samples []promSample
}

type promValue struct {
	labels map[string]string
	v      float64
}

// query runs an instant query at the instant at (milliseconds; 0: now)
// and decodes its result.
func (p promAPI) query(q string, at int64) (string, json.RawMessage) {
	p.t.Helper()
	v := url.Values{"query": {q}}
	if at != 0 {
		v.Set("time", strconv.FormatFloat(float64(at)/1000, 'f', 3, 64))
	}
	resp, err := http.PostForm("http://"+p.addr+"/api/v1/query", v)
	if err != nil {
		return "", nil
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
		p.t.Fatalf("query %s: %v %s", q, err, r.Error)
	}
	return r.Data.ResultType, r.Data.Result
}

func parsePoint(p [2]any) promSample {
	ts, _ := p[0].(float64)
	s, _ := p[1].(string)
	v, _ := strconv.ParseFloat(s, 64)
	return promSample{t: int64(math.Round(ts * 1000)), v: v}
}

// vector runs an instant query whose result is a vector.
func (p promAPI) vector(q string, at int64) []promValue {
	p.t.Helper()
	typ, raw := p.query(q, at)
	if typ == "" {
		return nil
	}
	var res []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	json.Unmarshal(raw, &res)
	out := make([]promValue, len(res))
	for i, r := range res {
		out[i] = promValue{labels: r.Metric, v: parsePoint(r.Value).v}
	}
	return out
}

// matrix returns the samples of selector over the window ending at at,
// as a rule evaluated at at reads them.
func (p promAPI) matrix(selector string, window time.Duration, at int64) []promSeries {
	p.t.Helper()
	_, raw := p.query(fmt.Sprintf("%s[%dms]", selector, window.Milliseconds()), at)
	var res []struct {
		Metric map[string]string `json:"metric"`
		Values [][2]any          `json:"values"`
	}
	json.Unmarshal(raw, &res)
	out := make([]promSeries, 0, len(res))
	for _, r := range res {
		s := promSeries{labels: r.Metric}
		for _, v := range r.Values {
			s.samples = append(s.samples, parsePoint(v))
		}
		if len(s.samples) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// pooled is sum(increase(selector[window])) (rate with perSecond) over
// the sidecars at at, after checking that each sidecar's samples start
// at 0 in the window and end at the records' count want(instance).
func (p promAPI) pooled(selector string, window time.Duration, at int64, perSecond bool, want func(instance string) float64) float64 {
	p.t.Helper()
	sum := 0.0
	series := p.matrix(selector, window, at)
	if len(series) != 3 {
		p.t.Errorf("%s at %s: %d series, want one per sidecar", selector, msTime(at), len(series))
	}
	for _, s := range series {
		inst := s.labels["instance"]
		if first, last := s.samples[0].v, s.samples[len(s.samples)-1].v; first != 0 || last != want(inst) {
			p.t.Errorf("%s of %s over %v at %s: from %v to %v, want from 0 (scraped before any request) to the records' %v",
				selector, inst, window, msTime(at), first, last, want(inst))
		}
		v := extrapolated(s.samples, at-window.Milliseconds(), at, true)
		if perSecond {
			v /= window.Seconds()
		}
		sum += v
	}
	return sum
}

// evalTimes returns the instants (milliseconds) at which the rule that
// records series was evaluated since after, newest first.
func (p promAPI) evalTimes(series string, after time.Time) []int64 {
	p.t.Helper()
	var out []int64
	for _, s := range p.matrix(series, 2*time.Minute, 0) {
		for _, v := range s.samples {
			if v.t > after.UnixMilli() {
				out = append(out, v.t)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] > out[j] })
	return slices.Compact(out)
}

// ruleHealth returns each rule group's last evaluation and any rule's
// last error, for a failure message.
func (p promAPI) ruleHealth() string {
	resp, err := http.Get("http://" + p.addr + "/api/v1/rules?type=record")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Name           string  `json:"name"`
				LastEvaluation string  `json:"lastEvaluation"`
				EvaluationTime float64 `json:"evaluationTime"`
				Rules          []struct {
					Name      string `json:"name"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	var out []string
	for _, g := range r.Data.Groups {
		out = append(out, fmt.Sprintf("%s last %s (%.3fs)", g.Name, g.LastEvaluation, g.EvaluationTime))
		for _, rl := range g.Rules {
			if rl.LastError != "" {
				out = append(out, rl.Name+": "+rl.LastError)
			}
		}
	}
	return strings.Join(out, "; ")
}

// settled reports whether every sidecar's last scrape at or before at
// was stored before at: its timestamp older than its own duration plus
// commit seconds, so that a rule evaluated at at read it.
func (p promAPI) settled(at int64, commit float64) bool {
	p.t.Helper()
	series := p.matrix(`scrape_duration_seconds`, 10*time.Second, at)
	if len(series) == 0 {
		return false
	}
	for _, s := range series {
		last := s.samples[len(s.samples)-1]
		if float64(at-last.t)/1000 < last.v+commit {
			return false
		}
	}
	return true
}

// commitWatch measures how long after a scrape's end (its timestamp
// plus scrape_duration_seconds) Prometheus first answers with that
// scrape's report, polling every 50 ms: an upper bound on the time the
// scrape's samples took to be committed, since Prometheus appends the
// report (scrape_duration_seconds) after it commits the scraped samples.
type commitWatch struct {
	stop, done chan struct{}

	mu       sync.Mutex
	max      float64 // seconds
	observed int     // scrapes whose report appeared between two polls
}

// watchCommits starts a commitWatch on p; close stops it.
func (p promAPI) watchCommits() *commitWatch {
	w := &commitWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ends := map[string]float64{} // the last report's scrape end, by instance
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			vs := p.vector(`timestamp(scrape_duration_seconds) + scrape_duration_seconds`, 0)
			answered := float64(time.Now().UnixMicro()) / 1e6
			w.mu.Lock()
			for _, v := range vs {
				inst := v.labels["instance"]
				// A report first seen before this watch began is not
				// timed: when it appeared is not known.
				if prev, ok := ends[inst]; ok && v.v != prev {
					w.max = math.Max(w.max, answered-v.v)
					w.observed++
				}
				ends[inst] = v.v
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// bound is the commit allowance settled uses: twice the longest commit
// measured so far, at least 0.1 s.
func (w *commitWatch) bound() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return math.Max(0.1, 2*w.max)
}

func (w *commitWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("scrape reports answered up to %.3f s after the scrape ended (%d scrapes timed)", w.max, w.observed)
}

func (w *commitWatch) close() {
	close(w.stop)
	<-w.done
}
