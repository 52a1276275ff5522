package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
)

// A client that sends long random model names cannot grow the sidecar's
// memory or the OTLP export: with OTLP metrics on, 300 requests whose
// model names are 1 MB random strings leave the sidecar's RSS within 50 MB
// of a run whose requests are as large but name one model, and the
// metrics a real OTLP receiver (Jaeger's collector: OTLP in, Prometheus
// exposition out) received carry at most max-models + 2 distinct model
// values. Both backends take the model label from one bounded mapping.
func TestHostileModelNamesWithOTLPMetrics(t *testing.T) {
	jaeger := testtool.Need(t, "jaeger")
	bin := build(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range []string{
			`data: {"choices":[{"delta":{"content":"a"}}]}`,
			`data: {"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}`,
			`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`,
			`data: [DONE]`,
		} {
			io.WriteString(w, e+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer upstream.Close()

	const n, maxModels, size = 300, 5, 1<<20 - 4096
	run := func(name string, hostile bool) (rssMB float64, models map[string]bool, requests float64) {
		otlpAddr, promAddr := startCollector(t, jaeger)
		cmd := exec.Command(bin, "--upstream", upstream.URL, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--max-models", strconv.Itoa(maxModels), "--energy", "off")
		cmd.Env = append(os.Environ(), "OTEL_METRICS_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://"+otlpAddr+"/v1/metrics", "OTEL_METRIC_EXPORT_INTERVAL=500",
			"OTEL_TRACES_EXPORTER=none")
		proxy := startSidecar(t, cmd)
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			model, pad := "llama", randomString(size)
			if hostile {
				model, pad = randomString(size), ""
			}
			body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi %s"}]}`, model, pad)
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				resp, err := http.Post(proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
		}
		wg.Wait()
		// Let the periodic reader export, then read the receiver's view.
		var exposition string
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			exposition = get(t, "http://"+promAddr+"/metrics")
			if requests = sumSeries(exposition, "tokentap_requests_total"); requests >= n {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		rssMB = rss(t, cmd.Process.Pid)
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		models = map[string]bool{}
		for _, m := range regexp.MustCompile(`gen_ai_request_model="([^"]*)"`).FindAllStringSubmatch(exposition, -1) {
			models[m[1]] = true
		}
		t.Logf("%s: RSS %.1f MB after %d requests; the receiver saw %v requests and %d model values", name, rssMB, n, requests, len(models))
		return rssMB, models, requests
	}
	baseRSS, _, baseReq := run("one model, 1 MB bodies", false)
	hostRSS, models, hostReq := run("1 MB random model names", true)
	if baseReq != n || hostReq != n {
		t.Fatalf("the OTLP receiver counted %v and %v requests, want %d each: the export broke", baseReq, hostReq, n)
	}
	if hostRSS-baseRSS > 50 {
		t.Errorf("RSS %.1f MB with hostile model names vs %.1f MB without: more than 50 MB apart", hostRSS, baseRSS)
	}
	if len(models) > maxModels+2 {
		t.Errorf("%d distinct model values in the OTLP export, want at most %d", len(models), maxModels+2)
	}
	for m := range models {
		if len(m) > 128 {
			t.Errorf("an unbounded model value of %d bytes reached the OTLP export", len(m))
		}
	}
}

func randomString(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startCollector runs Jaeger's OTel collector with a metrics pipeline:
// OTLP/HTTP in, Prometheus exposition out. It returns both addresses.
func startCollector(t *testing.T, bin string) (otlp, prom string) {
	t.Helper()
	dir := t.TempDir()
	otlp, prom = freePort(t), freePort(t)
	cfg := filepath.Join(dir, "collector.yaml")
	os.WriteFile(cfg, []byte(testtool.MetricsCollector{OTLPHTTP: otlp, Prometheus: prom}.Config()), 0o644)
	testtool.Start(t, "collector", bin, "--config", cfg)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", otlp); err == nil {
			c.Close()
			return otlp, prom
		}
		if time.Now().After(deadline) {
			t.Fatal("the OTLP collector did not start")
		}
	}
}

// startSidecar starts cmd and returns its proxy URL, read from its log.
func startSidecar(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	re := regexp.MustCompile(`proxy=(http://\S+)`)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go io.Copy(io.Discard, stderr)
			return m[1]
		}
	}
	t.Fatal("the sidecar did not start")
	return ""
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// sumSeries sums every sample of a metric in a text exposition.
func sumSeries(exposition, name string) float64 {
	var sum float64
	for _, l := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// rss is a process's resident set size in MB, from /proc.
func rss(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
