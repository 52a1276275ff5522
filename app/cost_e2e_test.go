package app

import (
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestExampleScorecard runs the shipped example configuration
// (deploy/examples/tokentap.yaml: the built-in simulator with its
// defaults, one SLO, 4 GPUs at 2.75 EUR/h) under a short stepped
// open-loop load (2, 4 and 6 requests/s for 6 s each). /slo shows the
// scorecard and the knee; a real Prometheus scraping the sidecar and
// evaluating the shipped rules (windows divided by 30: 5m → 10 s) reads
// the replica's cost (11 EUR/h) and a cost per million goodput tokens,
// joined on the sidecar's job and instance.
//
// Goodput is what met the example's SLO (TTFT 300 ms, TPOT 30 ms) in real
// time, so it depends on the machine: beside six busy loops it fell from
// 75 to 4 tok/s (1 request of 72). The cost per goodput token is checked
// against the goodput the same component measured, and checked absent
// when nothing qualified (it was required, and failed on a busy machine).
func TestExampleScorecard(t *testing.T) {
	a, _ := startSidecar(t, "", "--config", "../deploy/examples/tokentap.yaml", "--upstream", "")
	prom := ""
	if _, err := exec.LookPath("prometheus"); err == nil || os.Getenv("CI") != "" {
		prom = startRulesPrometheus(t, a.Admin, 30)
	}
	body := `{"model":"tokentap-sim","stream":true,"max_tokens":32,"messages":[{"role":"user","content":"How far can this replica be loaded?"}]}`
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for _, rate := range []int{2, 4, 6} {
		for range 6 * rate {
			wg.Go(func() {
				resp, err := client.Post("http://"+a.Proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			time.Sleep(time.Second / time.Duration(rate))
		}
	}
	if prom != "" {
		var cost, good, perM float64
		var ok1, okGood, ok2 bool
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !(ok1 && okGood && (ok2 || good == 0)) {
			cost, ok1 = promQuery(t, prom, `cost:tokentap_replica_cost:rate5m{currency="EUR"}`)
			good, okGood = promQuery(t, prom, `slo:tokentap_goodput_tokens:rate5m{slo="interactive"}`)
			perM, ok2 = promQuery(t, prom, `slo:tokentap_cost_per_million_goodput_tokens:ratio5m{slo="interactive",currency="EUR"}`)
			time.Sleep(500 * time.Millisecond)
		}
		// The accrued cost is computed when the sidecar answers a scrape,
		// Prometheus stamps the sample when it began the scrape: each
		// sample is early by up to one scrape's duration, so rate() over
		// the 10 s window (9 samples apart or more at 1 s) is off by up to
		// the longest scrape over that span, beyond 5%.
		slow, _ := promQuery(t, prom, `max(max_over_time(scrape_duration_seconds[15s]))`)
		tolCost := 0.05 + slow/9
		if !ok1 || math.Abs(cost*3600/11-1) > tolCost || !okGood || (good > 0) != (ok2 && perM > 0) {
			t.Errorf("Prometheus: replica cost %v EUR/s (%v), want 11/3600 within %.1f%% (scrapes took up to %.3f s); goodput %v tok/s (%v); cost per 1M goodput tokens %v (%v), want one when there is goodput",
				cost, ok1, 100*tolCost, slow, good, okGood, perM, ok2)
		}
		t.Logf("Prometheus: %.4f EUR/h, goodput %.4g tok/s, %.4g EUR per 1M goodput tokens (%v)", cost*3600, good, perM, ok2)
	}
	wg.Wait()

	page := sloPage(t, a.Admin)
	if len(page.SLOs) != 1 || page.SLOs[0].Scorecard == nil {
		t.Fatalf("/slo: %+v", page)
	}
	c := page.SLOs[0].Scorecard
	t.Logf("scorecard: goodput %.1f tok/s, %v EUR per 1M goodput tokens, TTFT p99 %v s, ITL p99 %v s, energy %s, knee %+v",
		c.GoodputTokensRate, optValue(c.CostPerMillionGoodputTokens), optValue(c.TTFTP99Seconds), optValue(c.ITLP99Seconds), c.Energy, c.Knee)
	if c.Currency != "EUR" || c.PricePerHour == nil || *c.PricePerHour != 11 ||
		c.TTFTP99Seconds == nil || c.ITLP99Seconds == nil || len(c.Curve) == 0 || c.Knee.State == "" {
		t.Errorf("scorecard %+v", c)
	}
	switch perM := c.CostPerMillionGoodputTokens; {
	case c.GoodputTokensRate > 0 && (perM == nil || math.Abs(*perM-11.0/3600*1e6/c.GoodputTokensRate) > 1e-6*(*perM)):
		t.Errorf("cost per 1M goodput tokens %v at %v goodput tok/s, want 11 EUR/h over it", optValue(perM), c.GoodputTokensRate)
	case c.GoodputTokensRate == 0 && perM != nil:
		t.Errorf("cost per 1M goodput tokens %v with no goodput", *perM)
	case c.GoodputTokensRate == 0:
		t.Log("no request met the example's SLO on this machine: no cost per 1M goodput tokens, as it should be")
	}
	resp, err := http.Get("http://" + a.Admin + "/slo")
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"Scorecard: interactive", "cost per 1M goodput tokens", "EUR", "knee", "<svg"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("/slo lacks %q", want)
		}
	}
}

func optValue(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}
