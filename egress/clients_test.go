package egress

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/testtool"
	"github.com/tokentap/tokentap/record"
)

// Real clients, each configured only by its environment: HTTPS_PROXY,
// and a CA file (SSL_CERT_FILE, or curl's --cacert). The upstream follows
// chatScript in real time; exact latencies are TestScriptedChatThroughEgress's
// business, these check that unmodified clients are measured and get the
// upstream's bytes.

// writes are the instants timedUpstream wrote chatScript's steps at, by
// step (zero: not written).
type writes struct {
	mu sync.Mutex
	at []time.Time
}

// timedUpstream writes chatScript's events at their instants after the
// request arrives (the usage chunk only when asked for), noting in wr the
// instant each was written: just before the write, so the sidecar cannot
// have read it earlier.
func timedUpstream(t *testing.T, auth chan<- string, wr *writes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		b, _ := io.ReadAll(r.Body)
		select {
		case auth <- r.Header.Get("Authorization"):
		default:
		}
		include := bytes.Contains(b, []byte(`"include_usage":true`))
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		wr.mu.Lock()
		wr.at = make([]time.Time, len(chatScript))
		wr.mu.Unlock()
		for i, s := range chatScript {
			if s.client == "cut" && !include {
				continue
			}
			time.Sleep(time.Until(t0.Add(s.at)))
			wr.mu.Lock()
			wr.at[i] = time.Now()
			wr.mu.Unlock()
			io.WriteString(w, s.raw)
			w.(http.Flusher).Flush()
		}
	})
}

func wantClientBytes() string {
	var b strings.Builder
	for _, s := range chatScript {
		if s.client != "cut" {
			b.WriteString(s.raw)
		}
	}
	return b.String()
}

// clientEnv is the process environment without any proxy or CA setting,
// plus the given ones.
func clientEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// checkMeasured checks the record of a real client's request: the
// script's tokens and outcome, and its instants against those at which
// the upstream wrote the events (wr), not the script's: a busy machine
// makes the upstream's sleeps late too.
func checkMeasured(t *testing.T, h *harness, target string, wr *writes) {
	t.Helper()
	rec := h.sink.wait(t, 1)[0]
	if rec.Outcome != record.Success || rec.OutputTokens != 4 || rec.TokenEvents() != 4 || rec.FinishReason != "stop" || rec.Target != target {
		line, _ := rec.MarshalJSON()
		t.Fatalf("record: %s", line)
	}
	// Real time: the clients are other processes. tol is what may pass
	// between the upstream's write and the sidecar's read of the same
	// bytes (loopback delivery and scheduling, on a loaded machine).
	const tol = 100 * time.Millisecond
	wr.mu.Lock()
	defer wr.mu.Unlock()
	ttft, _ := rec.TTFT()
	first := wr.at[1] // chatScript's steps 1-4 are its tokens
	if read := rec.Arrive.Add(ttft); read.Before(first) || read.After(first.Add(tol)) {
		t.Errorf("first token read %v after the upstream wrote it, want 0 to %v", read.Sub(first), tol)
	}
	var maxGap time.Duration
	for i := 2; i <= 4; i++ {
		maxGap = max(maxGap, wr.at[i].Sub(wr.at[i-1]))
	}
	if rec.MaxGap < maxGap-tol || rec.MaxGap > maxGap+tol {
		t.Errorf("max ITL %v, want the upstream's %v ±%v", rec.MaxGap, maxGap, tol)
	}
}

func TestPythonClient(t *testing.T) {
	py := testtool.Need(t, "python3")
	h := newHarness(t, harnessOpts{})
	auth := make(chan string, 1)
	var wr writes
	_, port := hosted(t, h.hosted, timedUpstream(t, auth, &wr), "api.openai.test")
	cmd := exec.Command(py, "testdata/client.py", "https://api.openai.test:"+port+"/v1/chat/completions", chatBody)
	cmd.Env = clientEnv("HTTPS_PROXY=http://"+h.addr, "SSL_CERT_FILE="+h.caFile, "TEST_API_KEY=sk-py-0123")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python client: %v\n%s", err, stderr.String())
	}
	if string(out) != wantClientBytes() {
		t.Fatalf("python client got\n%q\nwant\n%q", out, wantClientBytes())
	}
	if a := <-auth; a != "Bearer sk-py-0123" {
		t.Errorf("upstream got Authorization %q", a)
	}
	checkMeasured(t, h, "api.openai.test:"+port, &wr)
}

// curl over HTTP/2 to the sidecar (ALPN h2 inside the tunnel).
func TestCurlClientHTTP2(t *testing.T) {
	curl := testtool.Need(t, "curl")
	h := newHarness(t, harnessOpts{})
	auth := make(chan string, 1)
	var wr writes
	_, port := hosted(t, h.hosted, timedUpstream(t, auth, &wr), "api.openai.test")
	body := t.TempDir() + "/body"
	cmd := exec.Command(curl, "-sS", "-N", "--http2", "--cacert", h.caFile, "-o", body, "-w", "%{http_version} %{http_code}",
		"-H", "Content-Type: application/json", "-H", "Authorization: Bearer sk-curl-0123", "--data-binary", chatBody,
		"https://api.openai.test:"+port+"/v1/chat/completions")
	cmd.Env = clientEnv("HTTPS_PROXY=http://" + h.addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, stderr.String())
	}
	if string(out) != "2 200" {
		t.Errorf("curl reports %q, want HTTP/2 and 200", out)
	}
	got, _ := os.ReadFile(body)
	if string(got) != wantClientBytes() {
		t.Fatalf("curl got\n%q\nwant\n%q", got, wantClientBytes())
	}
	if a := <-auth; a != "Bearer sk-curl-0123" {
		t.Errorf("upstream got Authorization %q", a)
	}
	checkMeasured(t, h, "api.openai.test:"+port, &wr)
}

// A Go program with no code for it at all: http.DefaultClient, which
// reads HTTPS_PROXY, and the system roots, which SSL_CERT_FILE replaces.
// It runs as a child process so that both are read fresh.
func TestGoClientFromEnvironment(t *testing.T) {
	if os.Getenv("EGRESS_TEST_CHILD_URL") != "" {
		t.Skip("the child's own run")
	}
	h := newHarness(t, harnessOpts{})
	auth := make(chan string, 1)
	var wr writes
	_, port := hosted(t, h.hosted, timedUpstream(t, auth, &wr), "api.openai.test")
	cmd := exec.Command(os.Args[0], "-test.run=^TestGoChildClient$", "-test.count=1")
	cmd.Env = clientEnv("HTTPS_PROXY=http://"+h.addr, "SSL_CERT_FILE="+h.caFile,
		"EGRESS_TEST_CHILD_URL=https://api.openai.test:"+port+"/v1/chat/completions")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	got, err := os.ReadFile(h.caFile + ".child-body")
	if err != nil {
		t.Fatalf("the child wrote no body: %v\n%s", err, stdout.String())
	}
	if string(got) != wantClientBytes() {
		t.Fatalf("Go client got\n%q\nwant\n%q", got, wantClientBytes())
	}
	if a := <-auth; a != "Bearer sk-go-0123" {
		t.Errorf("upstream got Authorization %q", a)
	}
	checkMeasured(t, h, "api.openai.test:"+port, &wr)
}

// TestGoChildClient is the child of TestGoClientFromEnvironment.
func TestGoChildClient(t *testing.T) {
	u := os.Getenv("EGRESS_TEST_CHILD_URL")
	if u == "" {
		t.Skip("runs only as TestGoClientFromEnvironment's child")
	}
	req, _ := http.NewRequest("POST", u, strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-go-0123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("SSL_CERT_FILE")+".child-body", b, 0o600); err != nil {
		t.Fatal(err)
	}
}
