package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// promQuery returns the first sample value of an instant query, or NaN.
func promQuery(t *testing.T, prom, q string) (float64, bool) {
	resp, err := http.Get("http://" + prom + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&r) != nil || len(r.Data.Result) == 0 {
		return 0, false
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// alertState returns "firing", "pending" or "" for an alert name.
func alertState(prom, name string) string {
	resp, err := http.Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	state := ""
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] == name && (state == "" || a.State == "firing") {
			state = a.State
		}
	}
	return state
}

// load runs n closed-loop clients against the proxy until stop closes.
func load(proxy string, n, maxTokens int, stop <-chan struct{}, wg *sync.WaitGroup, sent *atomic.Int64) {
	body := fmt.Sprintf(`{"model":"sim","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, maxTokens)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post("http://"+proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				sent.Add(1)
			}
		}()
	}
}

// TestSLOAlertWithRealPrometheus drives the simulator past its batch size
// with a bounded load so that TTFT climbs past the SLO (to about 10 s,
// against a 1 s threshold that one client meets by three orders of
// magnitude: the verdicts do not depend on how busy the machine is); a real Prometheus
// scrapes the sidecar every second and evaluates the shipped rules, with
// every window divided by 120 (1h → 30 s, 5m → 2.5 s) so that the test
// takes about a minute. It sees attainment fall below target and the
// attainment alert go pending and firing, then recover when the load
// stops.
func TestSLOAlertWithRealPrometheus(t *testing.T) {
	a, _ := startSimulator(t, `
simulator:
  max_batch: 2
  max_queue: 1000
  prefill_base: 2ms
  prefill_per_token: 0s
  decode_base: 40ms
  decode_per_seq: 1ms
  jitter: 0
  stall_prob: 0
  error_prob: 0
  eos_prob: 0
  multi_token_prob: 0
slo:
  objectives:
    - name: interactive
      target: 0.9
      window: 30s
      thresholds:
        ttft: 1s
`)
	prom := startRulesPrometheus(t, a.Admin, 120)
	waitFor := promWaiter(t, prom, "TokentapSLOAttainmentBelowTarget", 500*time.Millisecond,
		`slo:tokentap_attainment:ratio5m`, `slo:tokentap_attainment:ratio1h`, `slo:tokentap_error_lower95:ratio1h`, `slo:tokentap_offered:increase1h`)
	phases := newPhases(t, a.Proxy)

	// Phase 1: light load (one client) meets the SLO.
	phases.startLight(1, 8)
	waitFor("Prometheus to scrape the sidecar and record attainment", 60*time.Second, func() bool {
		v, ok := promQuery(t, prom, `slo:tokentap_attainment:ratio1h{slo="interactive"}`)
		return ok && v >= 0.9
	})
	if s := alertState(prom, "TokentapSLOAttainmentBelowTarget"); s != "" {
		t.Fatalf("alert %s under light load", s)
	}

	// Phase 2: 24 clients against a batch of 2: each request decodes for
	// about 1 s (24 tokens of 41 ms), so a request waits for about 11
	// others' turns and TTFT climbs to about 10 s, far past 1 s.
	phases.startHeavy(24, 24)
	var low float64
	sawLow, sawPending := false, false
	waitFor("attainment to fall below target and the alert to fire", 90*time.Second, func() bool {
		if v, ok := promQuery(t, prom, `slo:tokentap_attainment:ratio5m{slo="interactive"}`); ok && v < 0.9 {
			low, sawLow = v, true
		}
		s := alertState(prom, "TokentapSLOAttainmentBelowTarget")
		sawPending = sawPending || s == "pending"
		return sawLow && s == "firing"
	})
	t.Logf("under load: 5m-window attainment %.3f, alert firing (pending seen first: %v)", low, sawPending)
	if v, ok := promQuery(t, prom, `slo:tokentap_error_lower95:ratio1h{slo="interactive"}`); !ok || v <= 0.1 {
		t.Errorf("error ratio lower bound %v while firing, want > 0.1 (1 - target)", v)
	}

	// Phase 3: the load stops (light traffic continues); attainment
	// recovers and the alert resolves.
	phases.stopHeavy()
	waitFor("the alert to resolve after the load stopped", 120*time.Second, func() bool {
		v, ok := promQuery(t, prom, `slo:tokentap_attainment:ratio5m{slo="interactive"}`)
		return ok && v >= 0.9 && alertState(prom, "TokentapSLOAttainmentBelowTarget") == ""
	})
	phases.stopLight()

	// The sidecar's own /slo view agrees that requests were judged.
	page := sloPage(t, a.Admin)
	if len(page.SLOs) != 1 || page.SLOs[0].Offered == 0 || !strings.Contains(page.Scope, "this sidecar instance") {
		t.Fatalf("/slo: %+v", page)
	}
	t.Logf("requests sent: %d; /slo now: %+v", phases.sent.Load(), page.SLOs[0])
	if v, ok := promQuery(t, prom, `sum(tokentap_time_to_first_token_by_class_seconds_count{prompt_class="short",output_class="short"})`); !ok || v == 0 {
		t.Errorf("no TTFT-by-class series in Prometheus (%v, %v)", v, ok)
	}
	if v, ok := promQuery(t, prom, `sum(tokentap_slo_failures_total{slo="interactive",threshold="ttft"})`); !ok || v == 0 {
		t.Errorf("no ttft failures counted (%v, %v)", v, ok)
	}
}
