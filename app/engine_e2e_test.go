package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// scrapeAdmin returns the sidecar's /metrics text.
func scrapeAdmin(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// The default run (the built-in simulator, default configuration) shows
// every tokentap_engine_* series the simulator's vLLM-style /metrics
// maps to, labelled engine="simulator", and the upstream as up.
func TestDefaultRunShowsEngineSeries(t *testing.T) {
	a, _ := startSidecar(t, "")
	if !a.Simulated {
		t.Fatal("expected the built-in simulator")
	}
	want := []string{
		`tokentap_engine_up{engine="simulator",reason="ok"} 1`,
		`tokentap_engine_requests_running{engine="simulator"} `,
		`tokentap_engine_requests_waiting{engine="simulator"} `,
		`tokentap_engine_kv_cache_usage_ratio{engine="simulator"} `,
		`tokentap_engine_preemptions_total{engine="simulator"} `,
		`tokentap_engine_requests_aborted_total{engine="simulator"} `,
		`tokentap_engine_time_to_first_token_seconds_count{engine="simulator"} `,
		`tokentap_engine_inter_token_latency_seconds_count{engine="simulator"} `,
		`tokentap_engine_scrape_duration_seconds `,
		`tokentap_engine_scrape_failures_total{reason="timeout"} 0`,
		`tokentap_upstream_up 1`,
	}
	var text string
	deadline := time.Now().Add(10 * time.Second)
	for {
		text = scrapeAdmin(t, a.Admin)
		missing := 0
		for _, w := range want {
			if !strings.Contains(text, w) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, w := range want {
				if !strings.Contains(text, w) {
					t.Errorf("/metrics lacks %q", w)
				}
			}
			var eng []string
			for _, l := range strings.Split(text, "\n") {
				if strings.HasPrefix(l, "tokentap_engine_") || strings.HasPrefix(l, "tokentap_upstream") {
					eng = append(eng, l)
				}
			}
			t.Fatalf("engine series now:\n%s", strings.Join(eng, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Engine passthrough is off by default: the engine's own names stay out.
	if strings.Contains(text, "vllm:num_requests_running") {
		t.Error("vllm:* passed through without engine.passthrough")
	}
}

// engineRecord is the part of a record line this test reads.
type engineRecord struct {
	Traffic           string `json:"traffic"`
	Outcome           string `json:"outcome"`
	Stalls            int    `json:"stalls"`
	PreemptionsDuring *int   `json:"preemptions_during"`
	StallCause        string `json:"stall_cause"`
}

func readEngineRecords(t *testing.T, path string) []engineRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []engineRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r engineRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// TestEnginePreemptionAlertWithRealPrometheus drives the simulator into
// preemption (a KV cache of 200 tokens for a batch of 8 sequences of up
// to 70), scrapes the sidecar with a real Prometheus evaluating the
// shipped rules with every window divided by 60 (10m → 10 s), and sees
// the sustained-preemption alert fire under the load and resolve once it
// stops; the records of stalled requests carry preemptions_during > 0.
func TestEnginePreemptionAlertWithRealPrometheus(t *testing.T) {
	a, records := startSimulator(t, `
simulator:
  max_batch: 8
  max_queue: 1000
  kv_capacity_tokens: 200
  prefill_base: 1ms
  prefill_per_token: 200us
  decode_base: 5ms
  decode_per_seq: 0s
  jitter: 0
  stall_prob: 0
  error_prob: 0
  eos_prob: 0
  multi_token_prob: 0
slo:
  stall_threshold: 50ms
engine:
  interval: 100ms
`)
	prom := startRulesPrometheus(t, a.Admin, 60)
	const alert = "TokentapEnginePreemptionsSustained"
	start := time.Now()
	waitFor := promWaiter(t, prom, alert, 250*time.Millisecond, `tokentap_engine_preemptions_total`, `rate(tokentap_engine_preemptions_total[10s])`,
		`tokentap_engine_kv_cache_usage_ratio`, `tokentap_engine_requests_waiting`, `tokentap_engine_up`)

	// Phase 1: one client, short answers: no preemption, no alert.
	phases := newPhases(t, a.Proxy)
	phases.startLight(1, 8)
	waitFor("Prometheus to scrape the engine series", 30*time.Second, func() bool {
		v, ok := promQuery(t, prom, `tokentap_engine_up{engine="simulator",reason="ok"}`)
		return ok && v == 1
	})
	if v, _ := promQuery(t, prom, `tokentap_engine_preemptions_total{engine="simulator"}`); v != 0 {
		t.Fatalf("%v preemptions under light load", v)
	}
	if s := alertState(prom, alert); s != "" {
		t.Fatalf("alert %s under light load", s)
	}

	// Phase 2: 16 clients, 64 tokens each, against a 200-token cache: the
	// batch fills, sequences outgrow the cache and are preempted.
	phases.startHeavy(16, 64)
	sawPending := false
	waitFor("the preemption alert to fire", 60*time.Second, func() bool {
		s := alertState(prom, alert)
		sawPending = sawPending || s == "pending"
		return s == "firing"
	})
	fired := time.Since(start)
	rate, _ := promQuery(t, prom, `sum(rate(tokentap_engine_preemptions_total[10s]))`)
	kv, _ := promQuery(t, prom, `max(max_over_time(tokentap_engine_kv_cache_usage_ratio[10s]))`)
	burst := alertState(prom, "TokentapEnginePreemptionBurst")
	t.Logf("firing after %v (pending seen: %v): %.1f preemptions/s, KV cache up to %.2f; burst warning %q", fired.Round(time.Second), sawPending, rate, kv, burst)

	// Phase 3: the load stops: the rate falls to 0 and the alert resolves.
	phases.stopHeavy()
	waitFor("the preemption alert to resolve", 60*time.Second, func() bool { return alertState(prom, alert) == "" })
	resolved := time.Since(start)
	phases.stopLight()
	phases.wait()
	total := 0.0
	for _, l := range strings.Split(scrapeAdmin(t, a.Admin), "\n") {
		if v, ok := strings.CutPrefix(l, `tokentap_engine_preemptions_total{engine="simulator"} `); ok {
			fmt.Sscan(v, &total)
		}
	}

	// The records: stalled requests carry the engine's preemptions.
	var recs []engineRecord
	waitFor("the records to be written", 10*time.Second, func() bool {
		recs = readEngineRecords(t, records)
		return int64(len(recs)) >= phases.sent.Load()/2
	})
	stalled, withPreemptions, causedByPreemption, absent := 0, 0, 0, 0
	causes := map[string]int{}
	for _, r := range recs {
		if r.Traffic != "live" {
			continue
		}
		if r.PreemptionsDuring == nil {
			absent++
		}
		if r.Stalls == 0 {
			continue
		}
		stalled++
		causes[r.StallCause]++
		if r.PreemptionsDuring != nil && *r.PreemptionsDuring > 0 {
			withPreemptions++
		}
		if r.StallCause == "preemption" {
			causedByPreemption++
			if r.PreemptionsDuring == nil || *r.PreemptionsDuring == 0 {
				t.Errorf("stall_cause preemption with preemptions_during %v", r.PreemptionsDuring)
			}
		}
	}
	t.Logf("requests sent %d, records %d; %.0f preemptions; fired at %v, resolved at %v; stalled live records %d, with preemptions_during > 0: %d, stall causes %v; records without preemptions_during: %d",
		phases.sent.Load(), len(recs), total, fired.Round(time.Second), resolved.Round(time.Second), stalled, withPreemptions, causes, absent)
	if stalled == 0 || withPreemptions == 0 || causedByPreemption == 0 {
		t.Fatalf("stalled %d, with preemptions_during > 0: %d, stall_cause preemption: %d", stalled, withPreemptions, causedByPreemption)
	}
	if withPreemptions*2 < stalled {
		t.Errorf("only %d of %d stalled records saw the engine preempt", withPreemptions, stalled)
	}
}
