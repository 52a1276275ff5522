package main

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func build(t *testing.T, env ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sidecar")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// terminate sends the sidecar SIGTERM and requires it to exit with
// status 0 within limit.
func terminate(t *testing.T, cmd *exec.Cmd, limit time.Duration) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(limit):
		t.Fatalf("no exit %v after SIGTERM", limit)
	}
}

func TestBadConfigExits2NamingEveryProblem(t *testing.T) {
	bin := build(t, "CGO_ENABLED=0")
	cmd := exec.Command(bin, "--upstream", "ftp://x", "--max-models", "0", "--log-level", "loud")
	cmd.Env = append(os.Environ(), "TOKENTAP_SIM_ERROR_PROB=2")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2\n%s", err, out)
	}
	for _, want := range []string{
		`upstream: scheme must be http or https, got "ftp"`,
		"max_models: must be at least 1, got 0",
		`log_level: must be debug, info, warn or error, got "loud"`,
		"simulator.error_prob must be in [0,1]",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %q:\n%s", want, out)
		}
	}
}

// With no upstream the binary runs in front of its simulated engine, says
// so loudly, serves a streaming chat completion and fills /metrics; on
// SIGTERM it exits 0. On a machine without an NVIDIA driver it says once
// why energy is off and exports that exact state: nvml_unavailable for a
// cgo build with the nvml tag (NVML's library is missing), no_cgo for a
// CGO_ENABLED=0 one.
func TestDefaultRunsSimulator(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("an NVIDIA driver is present: energy is on here (scripts/gpu-check.sh covers that case)")
	}
	for _, c := range []struct {
		name   string
		env    []string
		reason string
	}{{"cgo", []string{"CGO_ENABLED=1", "GOFLAGS=-tags=nvml"}, "nvml_unavailable"}, {"static", []string{"CGO_ENABLED=0"}, "no_cgo"}} {
		t.Run(c.name, func(t *testing.T) { runDefault(t, build(t, c.env...), c.reason) })
	}
}

func runDefault(t *testing.T, bin, energyReason string) {
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--sim.error-prob", "0")
	cmd.Env = os.Environ()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stderr)
	var proxy, metrics string
	sawSim := false
	re := regexp.MustCompile(`proxy=(http://\S+) .*metrics=(http://\S+)`)
	energyOff := 0
	for proxy == "" && sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "BUILT-IN SIMULATED ENGINE") {
			sawSim = true
		}
		if strings.Contains(line, "energy off") {
			energyOff++
		}
		if m := re.FindStringSubmatch(line); m != nil {
			proxy, metrics = m[1], m[2]
		}
	}
	go io.Copy(io.Discard, stderr)
	if !sawSim || proxy == "" {
		t.Fatalf("did not announce the simulator (%v) or its address (%q)", sawSim, proxy)
	}
	if energyOff != 1 {
		t.Errorf("said %d times that energy is off, want once", energyOff)
	}
	resp, err := http.Post(proxy+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"demo","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || strings.Count(string(body), `"content"`) < 5 {
		t.Fatalf("stream:\n%s", body)
	}
	// The request's record is published just after its response ends
	// (its end stages run after it: proxy.Options.Ends), beside the
	// first run's demo load, and a scrape is not one instant: it may
	// gather the request counter after its observation and the TTFT
	// histogram before it. /metrics is read until it shows every line.
	want := []string{
		`gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_operation_name="chat",gen_ai_request_model="demo",probe="",traffic="live",le="0.001"}`,
		`tokentap_inter_token_latency_seconds_count{gen_ai_operation_name="chat",gen_ai_request_model="demo",probe="",traffic="live"} `,
		`tokentap_requests_total{gen_ai_operation_name="chat",gen_ai_request_model="demo",outcome="success",probe="",traffic="live"} 1`,
		"tokentap_energy_enabled 0",
		`tokentap_energy_info{reason="` + energyReason + `",state="off"} 1`,
	}
	var lacks []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err = http.Get(metrics)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lacks = lacks[:0]
		for _, w := range want {
			if !strings.Contains(string(m), w) {
				lacks = append(lacks, w)
			}
		}
		if len(lacks) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range lacks {
		t.Errorf("/metrics lacks %s", w)
	}
	terminate(t, cmd, 10*time.Second)
}

// "sidecar capture merge|stats" reach capture/cli: a merge of two files
// writes their lines; a bad line is named FILE:LINE and exits 2.
func TestCaptureCommands(t *testing.T) {
	bin := build(t, "CGO_ENABLED=0")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	os.WriteFile(a, []byte(`{"timestamp":0,"input_length":512,"hash_ids":[7]}`+"\n"), 0o644)
	os.WriteFile(b, []byte(`{"timestamp":0,"input_length":512,"hash_ids":[7]}`+"\n{oops\n"), 0o644)
	merged := filepath.Join(dir, "m.jsonl")
	if out, err := exec.Command(bin, "capture", "merge", "-o", merged, a).CombinedOutput(); err != nil {
		t.Fatalf("merge: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "capture", "stats", "--json", merged).Output()
	if err != nil || !strings.Contains(string(out), `"requests": 1`) {
		t.Errorf("stats: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "capture", "merge", a, b).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), b+":2: not a JSON object") {
		t.Errorf("bad line: exit %v\n%s", err, out)
	}
}
