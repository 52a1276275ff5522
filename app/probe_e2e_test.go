package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/probe"
)

func getJSON(t *testing.T, u string, v any) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		json.NewDecoder(resp.Body).Decode(v)
	}
	return resp.StatusCode
}

func scrape(t *testing.T, admin string) string {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Two probes against the simulator: one straight to the engine, one
// through the sidecar's own listener. Both feed the canary series and
// /probes; neither shows up as live traffic.
func TestProbesAgainstSimulator(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte(`
simulator: {error_prob: 0, stall_prob: 0}
probes:
  probes:
    - {name: direct, interval: 300ms, max_tokens: 6, ignore_eos: true, expect: {finish_reason: length, output_tokens_min: 6, output_tokens_max: 6}}
    - {name: whole-path, target: sidecar, api: completions, interval: 300ms, max_tokens: 4, prompt_tokens: 200, ignore_eos: true, expect: {output_tokens_min: 4}}
`), 0o644)
	a, records := startSidecar(t, "", "--config", cfg)
	var page probe.Page
	waitUntil(t, "both probes to succeed three times", 15*time.Second, func() bool {
		getJSON(t, "http://"+a.Admin+"/probes?format=json", &page)
		ok := 0
		for _, p := range page.Probes {
			n := 0
			for _, r := range p.Recent {
				if r.Result == probe.ResultSuccess {
					n++
				}
			}
			if n >= 3 {
				ok++
			}
		}
		return ok == 2
	})
	if len(page.Probes) != 2 || page.Probes[0].Target != "upstream" || page.Probes[1].Target != "sidecar" {
		t.Fatalf("/probes: %+v", page.Probes)
	}
	m := scrape(t, a.Admin)
	for _, want := range []string{
		`tokentap_requests_total{gen_ai_operation_name="chat",gen_ai_request_model="tokentap-sim",outcome="success",probe="direct",traffic="canary"}`,
		`tokentap_requests_total{gen_ai_operation_name="text_completion",gen_ai_request_model="tokentap-sim",outcome="success",probe="whole-path",traffic="canary"}`,
		`gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="tokentap-sim",probe="direct",traffic="canary"}`,
		`probe_success{probe="direct"} 1`,
		`probe_success{probe="whole-path"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(m, `traffic="live"`) {
		t.Errorf("probe traffic leaked into live series:\n%s", grepLines(m, `traffic="live"`))
	}
	b, _ := os.ReadFile(records)
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Traffic string `json:"traffic"`
			Probe   struct {
				Name string `json:"name"`
			} `json:"probe"`
		}
		json.Unmarshal([]byte(line), &r)
		seen[r.Traffic+"/"+r.Probe.Name]++
	}
	if seen["canary/direct"] < 3 || seen["canary/whole-path"] < 3 || len(seen) != 2 {
		t.Fatalf("records by traffic/probe: %v; want only canary records of both probes", seen)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// An engine whose health check says fine while every completion fails
// after HTTP 200: the canary fails, and with ready_after_failures the
// sidecar's /readyz says so too.
func TestCanaryFailsWhileUpstreamHealthy(t *testing.T) {
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			io.WriteString(w, "ok")
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"error": {"message": "CUDA error: an illegal memory access", "type": "InternalServerError", "param": null, "code": 500}}`+"\n\ndata: [DONE]\n\n")
	}))
	defer us.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte(`
probes:
  ready_after_failures: 2
  probes:
    - {name: canary, interval: 200ms, model: llama}
`), 0o644)
	a, _ := startSidecar(t, us.URL, "--config", cfg)
	waitUntil(t, "two failed probes", 10*time.Second, func() bool {
		return strings.Contains(scrape(t, a.Admin), `tokentap_probe_results_total{probe="canary",result="failed"} 2`) ||
			strings.Contains(scrape(t, a.Admin), `tokentap_probe_consecutive_failures{probe="canary"} 3`)
	})
	if code := getJSON(t, us.URL+"/health", nil); code != 200 {
		t.Fatalf("upstream /health %d", code)
	}
	m := scrape(t, a.Admin)
	if !strings.Contains(m, `probe_success{probe="canary"} 0`) {
		t.Errorf("probe_success is not 0:\n%s", grepLines(m, "probe_success"))
	}
	var page probe.Page
	getJSON(t, "http://"+a.Admin+"/probes?format=json", &page)
	lf := page.Probes[0].LastFailure
	if lf == nil || lf.HTTPStatus != 200 || lf.ErrorType != "stream_error" || !strings.Contains(lf.Detail, "illegal memory access") {
		t.Fatalf("last failure %+v; want HTTP 200, stream_error and the engine's message", lf)
	}
	resp, err := http.Get("http://" + a.Admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "probe canary failed") {
		t.Fatalf("/readyz %d %q; want 503 naming the failing probe", resp.StatusCode, b)
	}
}
