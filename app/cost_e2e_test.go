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
		var cost, perM float64
		var ok1, ok2 bool
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !(ok1 && ok2) {
			cost, ok1 = promQuery(t, prom, `cost:tokentap_replica_cost:rate5m{currency="EUR"}`)
			perM, ok2 = promQuery(t, prom, `slo:tokentap_cost_per_million_goodput_tokens:ratio5m{slo="interactive",currency="EUR"}`)
			time.Sleep(500 * time.Millisecond)
		}
		if !ok1 || math.Abs(cost*3600/11-1) > 0.05 || !ok2 || perM <= 0 {
			t.Errorf("Prometheus: replica cost %v EUR/s (%v), want 11/3600; cost per 1M goodput tokens %v (%v)", cost, ok1, perM, ok2)
		}
		t.Logf("Prometheus: %.4f EUR/h, %.4g EUR per 1M goodput tokens", cost*3600, perM)
	}
	wg.Wait()

	page := sloPage(t, a.Admin)
	if len(page.SLOs) != 1 || page.SLOs[0].Scorecard == nil {
		t.Fatalf("/slo: %+v", page)
	}
	c := page.SLOs[0].Scorecard
	t.Logf("scorecard: goodput %.1f tok/s, %v EUR per 1M goodput tokens, TTFT p99 %v s, ITL p99 %v s, energy %s, knee %+v",
		c.GoodputTokensRate, optValue(c.CostPerMillionGoodputTokens), optValue(c.TTFTP99Seconds), optValue(c.ITLP99Seconds), c.Energy, c.Knee)
	if c.Currency != "EUR" || c.PricePerHour == nil || *c.PricePerHour != 11 || c.CostPerMillionGoodputTokens == nil ||
		math.Abs(*c.CostPerMillionGoodputTokens-11.0/3600*1e6/c.GoodputTokensRate) > 1e-6*(*c.CostPerMillionGoodputTokens) ||
		c.TTFTP99Seconds == nil || c.ITLP99Seconds == nil || len(c.Curve) == 0 || c.Knee.State == "" {
		t.Errorf("scorecard %+v", c)
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
