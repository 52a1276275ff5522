package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// reuseHand is the live reuse the test computes by hand from the
// prompts' text (docs/measurement.md §8b): a prompt's canonical form is
// "messages", NUL, its messages' JSON, NUL (the bodies are compact JSON
// with no tools, docs/capture.md); its block i stands for its first
// min((i+1)·2048, len) bytes (512 tokens of 4 bytes), a last block
// shorter than 2048 bytes its own (it ends the prompt). A block is
// reused when seen before (every request is within the hour's window);
// an ideal cache of S blocks is a list, most recent first: a request's
// hits are its leading blocks in the list, then its blocks are moved to
// the front, the last first, and the list cut to S.
type reuseHand struct {
	seen           map[string]bool
	caches         [][]string
	sizes          []int
	requests       int
	blocks, reused int
	hits           []int
}

func newReuseHand(sizes ...int) *reuseHand {
	return &reuseHand{seen: map[string]bool{}, caches: make([][]string, len(sizes)), sizes: sizes, hits: make([]int, len(sizes))}
}

func (h *reuseHand) add(messagesJSON string) {
	canon := "messages\x00" + messagesJSON + "\x00"
	var keys []string
	for end := 2048; ; end += 2048 {
		if end >= len(canon) {
			k := canon
			if len(canon)%2048 != 0 {
				k += "\x00end"
			}
			keys = append(keys, k)
			break
		}
		keys = append(keys, canon[:end])
	}
	h.requests++
	h.blocks += len(keys)
	for _, k := range keys {
		if h.seen[k] {
			h.reused++
		}
	}
	for _, k := range keys {
		h.seen[k] = true
	}
	for i, size := range h.sizes {
		for _, k := range keys {
			if !slices.Contains(h.caches[i], k) {
				break
			}
			h.hits[i]++
		}
		for j := len(keys) - 1; j >= 0; j-- {
			h.caches[i] = slices.DeleteFunc(h.caches[i], func(x string) bool { return x == keys[j] })
			h.caches[i] = slices.Insert(h.caches[i], 0, keys[j])
			h.caches[i] = h.caches[i][:min(len(h.caches[i]), size)]
		}
	}
}

// A scripted workload with known sharing (a system prompt shared by
// everyone, conversations whose turns extend the previous one, a prompt
// sent again) through two sidecars sharing the capture's secret file:
// each sidecar's live reuse, on /metrics and /slo, equals the test's
// hand computation over the requests it saw, and its ideal caches at two
// sizes equal the test's own LRU; /slo sets the engine's own ratio (its
// vLLM counters) beside them.
func TestLiveReuseTwoSidecars(t *testing.T) {
	// The engine answers without usage: the capture counts the prompt's
	// tokens from its bytes (4 a token), so the blocks are the hand's.
	// Its /metrics are vLLM's prefix-cache counters: a quarter of the
	// queried tokens hit, which /slo sets beside the workload's reuse.
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			io.WriteString(w, "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:prefix_cache_hits_total{model_name=\"m\"} 30\nvllm:prefix_cache_queries_total{model_name=\"m\"} 120\n")
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	defer engine.Close()
	dir := t.TempDir()
	secret := filepath.Join(dir, "fleet.key")
	start := func(name string) Addrs {
		cfg := filepath.Join(dir, name+".yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("capture:\n  file: %s\n  secret_file: %s\n  settle: 50ms\nreuse:\n  cache_blocks: [3, 8]\n",
			filepath.Join(dir, name+".jsonl"), secret)), 0o644)
		a, _ := startSidecarEnv(t, engine.URL, nil, "--config", cfg)
		return a
	}
	sidecars := []Addrs{start("a"), start("b")}
	hands := []*reuseHand{newReuseHand(3, 8), newReuseHand(3, 8)}

	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	send := func(k int, msgs []msg) {
		m, _ := json.Marshal(msgs)
		resp, err := http.Post("http://"+sidecars[k].Proxy+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":`+string(m)+`}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		hands[k].add(string(m))
	}
	system := msg{"system", strings.Repeat("You are a careful assistant; cite sources. ", 80)} // 3440 bytes
	convs := make([][]msg, 4)
	for turn := range 3 {
		for c := range convs {
			if turn == 0 {
				convs[c] = []msg{system}
			} else {
				convs[c] = append(convs[c], msg{"assistant", strings.Repeat(fmt.Sprintf("answer %d.%d ", c, turn), 130)})
			}
			convs[c] = append(convs[c], msg{"user", strings.Repeat(fmt.Sprintf("question %d.%d ", c, turn), 100+40*c)})
			send(c%2, convs[c]) // conversations 0 and 2 to a, 1 and 3 to b
		}
	}
	send(0, convs[2]) // the same prompt again
	send(1, convs[0]) // another conversation's prompt on the other sidecar
	if _, err := os.Stat(secret); err != nil {
		t.Fatal(err)
	}

	for k, a := range sidecars {
		h := hands[k]
		if h.reused == 0 || h.reused == h.blocks || h.hits[0] >= h.hits[1] {
			t.Fatalf("sidecar %d: the workload's sharing is not what the test means: %+v", k, h)
		}
		want := []string{
			fmt.Sprintf("tokentap_prefix_requests_total %d", h.requests),
			fmt.Sprintf(`tokentap_prefix_blocks_total{outcome="reused"} %d`, h.reused),
			fmt.Sprintf(`tokentap_prefix_blocks_total{outcome="new"} %d`, h.blocks-h.reused),
			fmt.Sprintf(`tokentap_prefix_ideal_cache_blocks_total{cache_blocks="3",outcome="hit"} %d`, h.hits[0]),
			fmt.Sprintf(`tokentap_prefix_ideal_cache_blocks_total{cache_blocks="3",outcome="miss"} %d`, h.blocks-h.hits[0]),
			fmt.Sprintf(`tokentap_prefix_ideal_cache_blocks_total{cache_blocks="8",outcome="hit"} %d`, h.hits[1]),
			fmt.Sprintf(`tokentap_prefix_ideal_cache_blocks_total{cache_blocks="8",outcome="miss"} %d`, h.blocks-h.hits[1]),
			"tokentap_prefix_ids_forgotten_total 0",
			"tokentap_prefix_window_seconds 3600",
		}
		var m string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			resp, err := http.Get("http://" + a.Admin + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			m = string(b)
			if strings.Contains(m, want[0]+"\n") || time.Now().After(deadline) {
				break
			}
		}
		for _, w := range want {
			if !strings.Contains(m, w+"\n") {
				t.Errorf("sidecar %d: /metrics has no %q", k, w)
			}
		}
		t.Logf("sidecar %d: %d requests, %d blocks, %d reused, ideal-cache hits %v at 3 and 8 blocks", k, h.requests, h.blocks, h.reused, h.hits)
		// The engine's ratio comes with its first scrape.
		p := sloPage(t, a.Admin).PrefixReuse
		for deadline := time.Now().Add(10 * time.Second); p != nil && p.Engine == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			p = sloPage(t, a.Admin).PrefixReuse
		}
		if p == nil || p.Requests != int64(h.requests) || p.Blocks != int64(h.blocks) || p.Reused != int64(h.reused) || p.Reuse == nil ||
			*p.Reuse != float64(h.reused)/float64(h.blocks) || len(p.IdealCaches) != 2 || p.IdealCaches[0].Hits != int64(h.hits[0]) ||
			p.IdealCaches[1].Hits != int64(h.hits[1]) || p.IdealCaches[1].Tokens != 8*512 || p.Engine == nil || p.Engine.Engine != "vllm" ||
			p.Engine.HitRatio != 0.25 || p.Engine.From != "increase(vllm:prefix_cache_hits_total) / increase(vllm:prefix_cache_queries_total)" {
			t.Errorf("sidecar %d: /slo prefix reuse %+v", k, p)
		}
	}
}

// The live reuse alone (no capture file): counted, with a secret drawn in
// memory and nothing written beside the config.
func TestLiveReuseWithoutCaptureFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("reuse:\n  enabled: on\ncapture:\n  settle: 50ms\n"), 0o644)
	a, _ := startSidecar(t, "", "--config", cfg)
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("the same question ", 200) + `"}]}`
	for range 2 {
		resp, err := http.Post("http://"+a.Proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var m string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + a.Admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m = string(b)
		if strings.Contains(m, "tokentap_prefix_requests_total 2\n") || time.Now().After(deadline) {
			break
		}
	}
	// The simulator counts the prompt's tokens: its blocks are whatever
	// they are, and the second request's are all reused.
	var reused, fresh int
	for _, l := range strings.Split(m, "\n") {
		fmt.Sscanf(l, `tokentap_prefix_blocks_total{outcome="reused"} %d`, &reused)
		fmt.Sscanf(l, `tokentap_prefix_blocks_total{outcome="new"} %d`, &fresh)
	}
	if !strings.Contains(m, "tokentap_prefix_requests_total 2\n") || reused == 0 || reused != fresh || strings.Contains(m, "tokentap_capture_lines_written_total") {
		t.Errorf("/metrics: reused %d new %d\n%s", reused, fresh, grepLines(m, "tokentap_prefix_"))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files beside the config: %v", entries)
	}
}
