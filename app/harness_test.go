package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/slo"
)

// startSimulator runs the sidecar in front of its built-in simulator with
// the configuration cfg (YAML) and returns its addresses and records file.
func startSimulator(t *testing.T, cfg string) (Addrs, string) {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "tokentap.yaml")
	os.WriteFile(cfgFile, []byte(cfg), 0o644)
	a, records := startSidecar(t, "", "--config", cfgFile, "--upstream", "")
	if !a.Simulated {
		t.Fatal("expected the built-in simulator")
	}
	return a, records
}

// startRulesPrometheus runs a Prometheus that scrapes the sidecar every
// second and evaluates the shipped rules with every window divided by
// scale; it returns its address. The test's cleanup stops it.
func startRulesPrometheus(t *testing.T, admin string, scale int) string {
	t.Helper()
	promBin := testtool.Need(t, "prometheus")
	dir := t.TempDir()
	rules, err := slo.PlainRules(slo.RuleParams{Scale: scale})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644)
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fmt.Sprintf(`
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: tokentap
    static_configs: [{targets: ["%s"]}]
`, admin)), 0o644)
	prom := freePort(t)
	testtool.Start(t, "prometheus", promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+prom, "--log.level=warn")
	return prom
}

// promWaiter returns the waitFor of a test against the Prometheus at
// prom: it checks cond every poll until it holds; past limit it logs the
// value of each query and the state of alert, and ends the test.
func promWaiter(t *testing.T, prom, alert string, poll time.Duration, queries ...string) func(what string, limit time.Duration, cond func() bool) {
	return func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				for _, q := range queries {
					v, ok := promQuery(t, prom, q)
					t.Logf("%s = %v (%v)", q, v, ok)
				}
				t.Logf("alert state %q", alertState(prom, alert))
				t.Fatalf("gave up after %v waiting for %s", limit, what)
			}
			time.Sleep(poll)
		}
	}
}

// phases are a test's two closed-loop loads against the proxy: a light
// one and a heavy one on top. Each stops once, by the test or at the
// latest by its cleanup, which stops the heavy one first and then waits
// for every client.
type phases struct {
	proxy        string
	sent         atomic.Int64 // requests sent by both loads
	wg           sync.WaitGroup
	light, heavy chan struct{}
	once         [2]sync.Once
}

func newPhases(t *testing.T, proxy string) *phases {
	p := &phases{proxy: proxy, light: make(chan struct{}), heavy: make(chan struct{})}
	t.Cleanup(func() {
		p.stopHeavy()
		p.stopLight()
		p.wg.Wait()
	})
	return p
}

// startLight and startHeavy start n clients asking for maxTokens each.
func (p *phases) startLight(n, maxTokens int) { load(p.proxy, n, maxTokens, p.light, &p.wg, &p.sent) }
func (p *phases) startHeavy(n, maxTokens int) { load(p.proxy, n, maxTokens, p.heavy, &p.wg, &p.sent) }

func (p *phases) stopLight() { p.once[0].Do(func() { close(p.light) }) }
func (p *phases) stopHeavy() { p.once[1].Do(func() { close(p.heavy) }) }

// wait waits for the clients of both loads, once both were stopped.
func (p *phases) wait() { p.wg.Wait() }

// sloPage reads the sidecar's /slo page as JSON.
func sloPage(t *testing.T, admin string) slo.Page {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/slo?format=json")
	if err != nil {
		t.Fatal(err)
	}
	var page slo.Page
	json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	return page
}
