package enginetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Repeated prompts with a shared prefix, through the sidecar in front of
// Ollama with the live reuse on (no capture file): the first request's
// blocks are all new, and each later one reuses the shared system
// prompt's blocks, live on /metrics (tokentap_prefix_blocks_total
// {outcome="reused"} grows) and on /slo (docs/capture.md, "Live reuse").
// Blocks of 256 tokens of 1 byte (the tiny model's vocabulary is mostly
// bytes; num_ctx is 2048), so that the system prompt of 1,200 bytes spans
// four whole blocks.
func TestPrefixReuseLive(t *testing.T) {
	w := setup(t)
	cfg := filepath.Join(t.TempDir(), "tokentap.yaml")
	os.WriteFile(cfg, []byte("reuse:\n  enabled: on\n  cache_blocks: [16, 256]\ncapture:\n  block_size: 256\n  bytes_per_token: 1\n  settle: 100ms\n"), 0o644)
	s := startSidecar(t, w, "--config", cfg)
	system := strings.Repeat("Answer in one short sentence. ", 40) // 1,200 bytes
	metric := func(name string) (float64, bool) {
		resp, err := http.Get(s.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				var f float64
				fmt.Sscan(v, &f)
				return f, true
			}
		}
		return 0, false
	}
	// waitRequests waits until the live reuse has counted n requests
	// (each is counted once its line settles, 100 ms after it ends).
	waitRequests := func(n float64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if v, _ := metric("tokentap_prefix_requests_total"); v >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the live reuse did not count %v requests in 20 s:\n%s", n, s.log())
			}
		}
	}
	var reused []float64
	for i := range 4 {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"seed":%d,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question %d: what is %d plus %d?"}]}`,
			modelName, seed, system, i, i, i)
		x := post(t, s.proxy, "/v1/chat/completions", body, nil)
		if x.status != 200 {
			t.Fatalf("request %d: %d %s", i, x.status, x.body)
		}
		waitRequests(float64(i + 1))
		v, ok := metric(`tokentap_prefix_blocks_total{outcome="reused"}`)
		if !ok {
			t.Fatal("no tokentap_prefix_blocks_total on /metrics")
		}
		reused = append(reused, v)
	}
	fresh, _ := metric(`tokentap_prefix_blocks_total{outcome="new"}`)
	t.Logf("reused blocks after each request: %v; new blocks: %v", reused, fresh)
	if reused[0] != 0 {
		t.Errorf("the first request reused %v blocks", reused[0])
	}
	for i := 1; i < len(reused); i++ {
		if reused[i]-reused[i-1] < 4 {
			t.Errorf("request %d reused %v blocks, want at least the system prompt's 4", i, reused[i]-reused[i-1])
		}
	}
	resp, err := http.Get(s.admin + "/slo?format=json")
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		PrefixReuse *struct {
			Requests int64    `json:"requests"`
			Reused   int64    `json:"reused_blocks"`
			Reuse    *float64 `json:"reuse"`
			Engine   any      `json:"engine"`
		} `json:"prefix_reuse"`
	}
	json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if p := page.PrefixReuse; p == nil || p.Requests != 4 || float64(p.Reused) != reused[3] || p.Reuse == nil || *p.Reuse <= 0 || p.Engine != nil {
		t.Errorf("/slo prefix_reuse %+v", page.PrefixReuse)
	}
}
