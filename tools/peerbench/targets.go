package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
)

// target is one path the client can take to the upstream.
type target struct {
	name string
	port int
	// launch starts the proxy (nil for direct) and returns its process,
	// whose tree's CPU and RSS are the proxy's.
	launch func() (*proc, error)
	p      *proc
	// pprof is the address of the profiling endpoint (profile mode).
	pprof string
	// admin is the sidecar's admin address (host:port), whose live page
	// the browser stand-in polls; empty for the other paths.
	admin string
	// gen counts the target's launches; a sidecar's records and capture
	// files are named by it, so that each process's pair is audited
	// alone (audit, when the process has stopped).
	gen int
	// audit, when set, reads the files of launch gen once its process
	// has stopped; audits keeps what it found.
	audit  func(gen int) audit
	audits []audit
}

func (t *target) url() string {
	return fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", t.port)
}

// up starts the target and waits until a stream passes through it.
func (t *target) up() error {
	if t.launch == nil || (t.p != nil && !t.p.exited()) {
		return nil
	}
	t.gen++
	p, err := t.launch()
	if err != nil {
		return err
	}
	t.p = p
	err = waitStream(t.url(), p, 30*time.Second)
	if err == nil && t.audit != nil {
		// One tool call through it, whole (3 events), so that each
		// sidecar's audit sees at least one structure check.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = oneStreamBody(ctx, t.url(), toolReady)
		cancel()
	}
	if err != nil {
		t.down()
		return fmt.Errorf("%s: %w", t.name, err)
	}
	return nil
}

// down stops the target's process, then audits its files.
func (t *target) down() {
	if t.p == nil {
		return
	}
	t.p.stop()
	t.p = nil
	if t.audit != nil {
		t.audits = append(t.audits, t.audit(t.gen))
	}
}

// sidecarEnv is the environment that turns OTLP on: traces to tracesURL
// (Jaeger, or the sink), metrics to metricsURL (the sink), exported
// every 10 s (the SDK's default is 60 s: a window of the run sees an
// export).
func sidecarEnv(tracesURL, metricsURL string) []string {
	return []string{
		"OTEL_SERVICE_NAME=tokentap-peerbench",
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_METRICS_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + tracesURL,
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=" + metricsURL,
		"OTEL_METRIC_EXPORT_INTERVAL=10000",
	}
}

// sidecarConfig is the sidecar's YAML for the run: two SLOs, so every
// request is judged (classes, stalls, fluidity, a verdict) and every
// request that declares a tool has its tool call checked against the
// tool's schema (structure: required); tenants from the API key, hashed
// with a key file in dir; a canary probe every 5 s straight to the
// upstream (16 tokens).
func sidecarConfig(dir string) string {
	return `slo:
  stall_threshold: 1s
  objectives:
    - name: interactive
      target: 0.9
      window: 1h
      scope:
        apis: [chat]
      thresholds:
        ttft: 500ms
        tpot: 50ms
        max_itl: 1s
      fluidity: {deadline: 1s, cadence: 100ms}
    - name: agents
      target: 0.9
      window: 1h
      scope:
        apis: [chat]
      thresholds:
        ttft: 500ms
        e2e: 10s
      structure: required
tenant:
  from: api_key
  max_tenants: 20
  hash_key_file: ` + filepath.Join(dir, "tenant.key") + `
probes:
  probes:
    - name: peerbench-canary
      api: chat
      stream: true
      model: m
      prompt: "peerbench canary"
      max_tokens: 16
      interval: 5s
      timeout: 10s
      target: upstream
`
}

// sidecarFiles are the records and capture files of a sidecar's launch.
func sidecarFiles(dir, name string, gen int) (records, capture string) {
	base := filepath.Join(dir, name+"-"+itoa(gen))
	return base + ".records.jsonl", base + ".capture.jsonl"
}

// sidecarArgs are the sidecar's flags for a launch: records and the
// workload capture on (files of their own per launch), the engine
// scraper off (the stand-in has no metrics), a short shutdown grace.
func sidecarArgs(dir, name string, gen, upstream, port, admin int) []string {
	records, capture := sidecarFiles(dir, name, gen)
	return []string{
		"--upstream", fmt.Sprintf("http://127.0.0.1:%d", upstream),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", admin),
		"--records", records,
		"--capture", capture,
		"--config", filepath.Join(dir, "tokentap.yaml"),
		"--engine", "off",
		"--shutdown-grace", "1s",
		"--log-level", "warn",
	}
}

// peer is a proxy from the distribution, when installed.
type peer struct {
	name, bin string
	write     func(dir string, port, upstream int) (args []string, env []string, err error)
}

var peers = []peer{
	{name: "nginx", bin: "nginx", write: nginxConf},
	{name: "haproxy", bin: "haproxy", write: haproxyConf},
	{name: "caddy", bin: "caddy", write: caddyConf},
}

// nginx: proxy_buffering off, keep-alive to the upstream, no access log;
// one worker per core.
func nginxConf(dir string, port, upstream int) ([]string, []string, error) {
	sub := filepath.Join(dir, "nginx")
	if err := os.MkdirAll(filepath.Join(sub, "logs"), 0o755); err != nil {
		return nil, nil, err
	}
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/logs/error.log;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  upstream up { server 127.0.0.1:%[3]d; keepalive 1024; }
  server {
    listen 127.0.0.1:%[2]d;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, sub, port, upstream)
	path := filepath.Join(sub, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, nil, err
	}
	return []string{"-p", sub, "-e", filepath.Join(sub, "logs", "error.log"), "-c", path}, nil, nil
}

// haproxy: option http-no-delay (without it haproxy coalesces SSE and
// adds ~100 ms per event).
func haproxyConf(dir string, port, upstream int) ([]string, []string, error) {
	conf := fmt.Sprintf(`global
  maxconn 9000
defaults
  mode http
  option http-no-delay
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend f
  bind 127.0.0.1:%d
  default_backend b
backend b
  server s1 127.0.0.1:%d
`, port, upstream)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, nil, err
	}
	return []string{"-f", path}, nil, nil
}

// caddy: flush_interval -1 (flush every write), no admin endpoint, logs
// discarded; its state folders in the work folder.
func caddyConf(dir string, port, upstream int) ([]string, []string, error) {
	conf := fmt.Sprintf(`{
	admin off
	auto_https off
	log default {
		output discard
	}
}
http://127.0.0.1:%d {
	reverse_proxy 127.0.0.1:%d {
		flush_interval -1
	}
}
`, port, upstream)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, nil, err
	}
	home := filepath.Join(dir, "caddy-home")
	env := []string{"HOME=" + home, "XDG_DATA_HOME=" + filepath.Join(home, "data"), "XDG_CONFIG_HOME=" + filepath.Join(home, "config")}
	return []string{"run", "--config", path, "--adapter", "caddyfile"}, env, nil
}

// installed returns the peers whose binary is on PATH among names.
func installed(names map[string]bool) (out []peer, missing []string) {
	for _, p := range peers {
		if !names[p.name] {
			continue
		}
		if bin, err := exec.LookPath(p.bin); err == nil {
			p.bin = bin
			out = append(out, p)
		} else {
			missing = append(missing, p.name+" (not installed)")
		}
	}
	return out, missing
}

// jaegerConf is a Jaeger v2 with memory storage and its OTLP receiver
// (the configuration the tests run it with, internal/testtool.Jaeger).
func jaegerConf(otlp, otlpGRPC, query, queryGRPC int) string {
	addr := func(port int) string { return "127.0.0.1:" + itoa(port) }
	return testtool.Jaeger{OTLPHTTP: addr(otlp), OTLPGRPC: addr(otlpGRPC), QueryHTTP: addr(query), QueryGRPC: addr(queryGRPC),
		MaxTraces: 20000, Batch: time.Second}.Config()
}
