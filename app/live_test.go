package app

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
)

func applyDemoCfg(upstream string) config.Config {
	c := config.Defaults()
	c.Upstream = upstream
	return c
}

func adminGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// With --demo=off the simulator runs alone: no SLO, no price, no demo
// load; the pages still say the numbers are synthetic, and the index at
// / lists every admin endpoint, each answering.
func TestDemoOffAndIndex(t *testing.T) {
	a, _ := startSidecar(t, "", "--demo", "off")
	base := "http://" + a.Admin
	code, index := adminGet(t, base+"/")
	if code != 200 || !strings.Contains(index, "SYNTHETIC: every number comes from the built-in simulated engine") || strings.Contains(index, "demo load") {
		t.Fatalf("/: HTTP %d\n%s", code, index)
	}
	links := regexp.MustCompile(`<li><a href="([^"]+)">`).FindAllStringSubmatch(index, -1)
	want := []string{"/metrics", "/healthz", "/readyz", "/slo", "/probes", "/live", "/live/data"}
	if len(links) != len(want) {
		t.Fatalf("the index lists %d endpoints, want %d (%v)", len(links), len(want), want)
	}
	for i, l := range links {
		if l[1] != want[i] {
			t.Errorf("line %d links %s, want %s", i+1, l[1], want[i])
		}
		path := l[1]
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			// /readyz waits for the canary's first success.
			if code, _ = adminGet(t, base+path); code == 200 || time.Now().After(deadline) {
				break
			}
		}
		if code != 200 {
			t.Errorf("%s: HTTP %d", path, code)
		}
	}
	_, body := adminGet(t, base+"/slo?format=json")
	var slo struct {
		Synthetic string            `json:"synthetic"`
		SLOs      []json.RawMessage `json:"slos"`
	}
	if err := json.Unmarshal([]byte(body), &slo); err != nil {
		t.Fatal(err)
	}
	if len(slo.SLOs) != 0 || strings.Contains(slo.Synthetic, "demo") || slo.Synthetic == "" {
		t.Errorf("/slo with the demo off: %d SLOs, synthetic %q", len(slo.SLOs), slo.Synthetic)
	}
	time.Sleep(2 * time.Second) // the demo would have sent about 6 requests by now
	_, body = adminGet(t, base+"/live/data")
	if strings.Contains(body, `"traffic":"live"`) {
		t.Errorf("live traffic with the demo off:\n%.400s", body)
	}
}

// In front of a real engine nothing is flagged synthetic and no demo
// runs, whatever demo.enabled says.
func TestNoDemoInFrontOfAnEngine(t *testing.T) {
	cfg := applyDemoCfg("http://127.0.0.1:1")
	if s := applyDemo(&cfg); s != "" || len(cfg.SLO.Objectives) != 0 || cfg.Cost.Declared() || cfg.DemoOn() {
		t.Errorf("in front of an engine: synthetic %q, %d SLOs, price %v, demo %v", s, len(cfg.SLO.Objectives), cfg.Cost.Declared(), cfg.DemoOn())
	}
	cfg = applyDemoCfg("")
	if s := applyDemo(&cfg); !strings.Contains(s, "demo") || len(cfg.SLO.Objectives) != 1 || !cfg.Cost.Declared() || !cfg.DemoOn() {
		t.Errorf("the first run: synthetic %q, %d SLOs, price %v, demo %v", s, len(cfg.SLO.Objectives), cfg.Cost.Declared(), cfg.DemoOn())
	}
}
