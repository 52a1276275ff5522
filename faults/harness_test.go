//go:build linux

package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
)

// sidecarBin is the sidecar binary TestMain built.
var sidecarBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "faults-sidecar-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "sidecar")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sidecar")
	build.Dir = ".." // the repository root: this test runs in faults/
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "faults: go build ./cmd/sidecar: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	sidecarBin = bin
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// ciOrSkip ends a test that cannot run here: with CI=true it fails
// (an integration test never passes by not running), otherwise it skips
// loudly, as internal/testtool does for missing tools.
func ciOrSkip(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("FAILED: %s, and CI=true: run the suite as root (scripts/test.sh)", why)
	}
	t.Skipf("\n"+
		"    ************************************************************\n"+
		"    SKIPPED: %s\n"+
		"    (this fault test did not run; with CI=true it fails)\n"+
		"    ************************************************************", why)
}

// logBuf keeps everything the sidecar wrote to stderr.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) add(s string) {
	l.mu.Lock()
	l.b.WriteString(s)
	l.mu.Unlock()
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until the log contains substr.
func (l *logBuf) waitFor(substr string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if strings.Contains(l.String(), substr) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sidecar is the real binary, running.
type sidecar struct {
	t      *testing.T
	cmd    *exec.Cmd
	pid    int
	proxy  string // http://127.0.0.1:PORT
	admin  string // http://127.0.0.1:PORT (the admin listener)
	log    *logBuf
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

var upLine = regexp.MustCompile(`tokentap is up.*proxy=(http://\S+) .*metrics=(http://\S+)`)

// startSidecar runs the sidecar with args after --listen and
// --admin-listen on loopback ports, and waits for its "tokentap is up"
// line. The test's cleanup kills it if it still runs, and prints its log
// when the test failed.
func startSidecar(t *testing.T, args ...string) *sidecar {
	t.Helper()
	return startSidecarVia(t, nil, args...)
}

// startSidecarVia is startSidecar with the binary started by wrap (a
// command and its arguments, given the sidecar's path and arguments
// after them; nil: none): a shell that sets a limit and execs it, say,
// so that the pid is the sidecar's.
func startSidecarVia(t *testing.T, wrap []string, args ...string) *sidecar {
	t.Helper()
	return startSidecarFull(t, wrap, io.Discard, args...)
}

// startSidecarOut is startSidecar with the sidecar's stdout given (an
// *os.File is its descriptor 1 itself).
func startSidecarOut(t *testing.T, stdout io.Writer, args ...string) *sidecar {
	t.Helper()
	return startSidecarFull(t, nil, stdout, args...)
}

// startSidecarFull is startSidecar with wrap (startSidecarVia) and stdout
// (startSidecarOut).
func startSidecarFull(t *testing.T, wrap []string, stdout io.Writer, args ...string) *sidecar {
	t.Helper()
	full := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)
	argv := append(append(append([]string(nil), wrap...), sidecarBin), full...)
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, kv := range os.Environ() { // hermetic: no TOKENTAP_* or OTEL_* from the caller
		if !strings.HasPrefix(kv, "TOKENTAP_") && !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sidecar{t: t, cmd: cmd, pid: cmd.Process.Pid, log: &logBuf{}, exited: make(chan struct{})}
	up := make(chan [2]string, 1)
	go func() {
		br := bufio.NewReader(stderr)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				s.log.add(line)
				if m := upLine.FindStringSubmatch(line); m != nil {
					select {
					case up <- [2]string{m[1], m[2]}:
					default:
					}
				}
			}
			if err != nil {
				break
			}
		}
		s.err = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			l := s.log.String()
			if len(l) > 16<<10 {
				l = "...\n" + l[len(l)-16<<10:]
			}
			t.Logf("sidecar log:\n%s", l)
		}
	})
	select {
	case a := <-up:
		s.proxy, s.admin = a[0], strings.TrimSuffix(a[1], "/metrics")
	case <-s.exited:
		t.Fatalf("the sidecar exited before it was up (%v):\n%s", s.err, s.log.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("the sidecar did not say it was up within 20 s:\n%s", s.log.String())
	}
	return s
}

// running reports whether the process has not exited.
func (s *sidecar) running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

func (s *sidecar) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits at most d for the process to exit and returns its exit
// code, or fails the test.
func (s *sidecar) wait(d time.Duration) int {
	s.t.Helper()
	select {
	case <-s.exited:
	case <-time.After(d):
		s.t.Fatalf("the sidecar did not exit within %v", d)
	}
	var ee *exec.ExitError
	switch {
	case s.err == nil:
		return 0
	case errors.As(s.err, &ee):
		return ee.ExitCode()
	}
	s.t.Fatalf("wait: %v", s.err)
	return -1
}

// stop sends SIGTERM and waits for the exit.
func (s *sidecar) stop() int {
	s.t.Helper()
	s.signal(syscall.SIGTERM)
	return s.wait(20 * time.Second)
}

// metrics returns the text of /metrics.
func (s *sidecar) metrics() string {
	s.t.Helper()
	resp, err := http.Get(s.admin + "/metrics")
	if err != nil {
		s.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		s.t.Fatalf("GET /metrics: %v %v", resp.Status, err)
	}
	return string(b)
}

// metric sums the samples of the named metric on /metrics whose labels
// include every name/value pair of match (0 when none does).
func (s *sidecar) metric(name string, match ...string) float64 {
	s.t.Helper()
	v, _ := metricSum(s.metrics(), name, match...)
	return v
}

// goroutines is the sidecar's go_goroutines.
func (s *sidecar) goroutines() int {
	s.t.Helper()
	v, ok := metricSum(s.metrics(), "go_goroutines")
	if !ok {
		s.t.Fatal("no go_goroutines on /metrics")
	}
	return int(v)
}

// rss is the sidecar's resident set (VmRSS) in bytes.
func (s *sidecar) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return -1
}

// fds is the number of the sidecar's open descriptors.
func (s *sidecar) fds() int {
	s.t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid))
	if err != nil {
		s.t.Fatalf("reading /proc/%d/fd: %v", s.pid, err)
	}
	return len(ents)
}

// metricSum sums, in Prometheus text, the samples of metric name whose
// labels include every name/value pair of match (given flat: "outcome",
// "success", ...).
func metricSum(text, name string, match ...string) (float64, bool) {
	sum, found := 0.0, false
	for line := range strings.SplitSeq(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		labels := map[string]string{}
		switch {
		case strings.HasPrefix(rest, "{"):
			l, after, ok := parseLabels(rest[1:])
			if !ok {
				continue
			}
			labels, rest = l, after
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		all := true
		for i := 0; i+1 < len(match); i += 2 {
			if labels[match[i]] != match[i+1] {
				all = false
			}
		}
		if all {
			sum += v
			found = true
		}
	}
	return sum, found
}

// parseLabels parses `a="x",b="y"}` and returns what follows the brace.
func parseLabels(s string) (map[string]string, string, bool) {
	m := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return m, s[1:], true
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, "", false
		}
		key := s[:eq]
		s = s[eq+2:]
		var b strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					b.WriteByte('\n')
				} else {
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, "", false
		}
		m[key] = b.String()
		s = s[i+1:]
	}
}

// rec is the part of a record the tests read.
type rec struct {
	ID             string   `json:"id"`
	Traffic        string   `json:"traffic"`
	API            string   `json:"api"`
	Model          string   `json:"model"`
	ModelTruncated bool     `json:"model_truncated"`
	Stream         bool     `json:"stream"`
	Outcome        string   `json:"outcome"`
	HTTPStatus     int      `json:"http_status"`
	ErrorType      string   `json:"error_type"`
	FinishReason   string   `json:"finish_reason"`
	OutputTokens   *int     `json:"output_tokens"`
	TokenSource    string   `json:"token_source"`
	Events         int      `json:"events"`
	TokenEvents    int      `json:"token_events"`
	UsageInjected  bool     `json:"usage_injected"`
	TapFailed      string   `json:"tap_failed"`
	E2EMs          *float64 `json:"e2e_ms"`
	lineBytes      int
}

// readRecords reads a records file and fails the test unless every line
// is one whole JSON object and the file ends with a line end. A missing
// file has no records.
func readRecords(t *testing.T, path string) []rec {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return parseRecords(t, path, b)
}

// parseRecords is readRecords on the bytes b read from path.
func parseRecords(t *testing.T, path string, b []byte) []rec {
	t.Helper()
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("%s ends inside a line (a truncated record): ...%q", path, tail(b, 200))
	}
	if len(b) == 0 {
		return nil
	}
	var out []rec
	for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var r rec
		var all map[string]any
		if err := json.Unmarshal(line, &all); err != nil {
			t.Fatalf("%s line %d is not whole JSON (%v): %q", path, i+1, err, head(line, 300))
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%s line %d: %v", path, i+1, err)
		}
		r.lineBytes = len(line)
		out = append(out, r)
	}
	return out
}

// waitRecords waits until the records file has at least n records and
// returns them.
func waitRecords(t *testing.T, path string, n int, d time.Duration) []rec {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		// The writer may be mid-batch (a batch larger than its buffer is
		// more than one write, and a read may see a write in part): a
		// file that ends inside a line is read again, and fails only at
		// the deadline. The bytes checked are the bytes parsed: a second
		// read could find the next write begun.
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 && b[len(b)-1] != '\n' && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var rs []rec
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			t.Fatal(err)
		default:
			rs = parseRecords(t, path, b)
		}
		if len(rs) >= n {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d records after %v, want %d", path, len(rs), d, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// countBy counts records by "outcome/error_type".
func countBy(rs []rec) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.Outcome+"/"+r.ErrorType]++
	}
	return m
}

// upstream starts a test upstream that gives its POSTs to h and answers
// anything else (the sidecar's GET /v1/models, /health) with a 404.
func upstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	return upstreamRaw(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
}

// upstreamRaw starts a test upstream that gives every request to h. It
// is closed after the sidecar (the cleanups run in reverse), so handlers
// waiting on their request context are released when the sidecar goes.
func upstreamRaw(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// newClient is a client that sends no Accept-Encoding of its own and
// leaves the bytes it receives as they came.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute}
}

// chatBody is a chat request body.
func chatBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
}

// post sends a chat completion request.
func post(ctx context.Context, c *http.Client, base, body string, hdr ...string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.Do(req)
}

// postAll sends a chat request and reads the whole answer; it fails the
// test on an error (call it from the test's goroutine).
func postAll(t *testing.T, c *http.Client, base, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := postRead(c, base, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// postRead sends a chat request and reads the whole answer.
func postRead(c *http.Client, base, body string, hdr ...string) (*http.Response, []byte, error) {
	resp, err := post(context.Background(), c, base, body, hdr...)
	if err != nil {
		return nil, nil, fmt.Errorf("POST: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, b, fmt.Errorf("reading the answer: %w (after %d bytes)", err, len(b))
	}
	return resp, b, nil
}

// The upstream's SSE, in vLLM's shape.

func tokenEvent(i int, finish string) string {
	fr := "null"
	if finish != "" {
		fr = strconv.Quote(finish)
	}
	return fmt.Sprintf(`data: {"id":"chatcmpl-f","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t%d "},"finish_reason":%s}]}`+"\n\n", i, fr)
}

func usageEvent(prompt, completion int) string {
	return fmt.Sprintf(`data: {"id":"chatcmpl-f","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", prompt, completion, prompt+completion)
}

const doneEvent = "data: [DONE]\n\n"

// streamText is the whole stream of n tokens, the last with finish
// reason finish (none if empty), then [DONE] if done.
func streamText(n int, finish string, done bool) string {
	var b strings.Builder
	for i := range n {
		f := ""
		if i == n-1 {
			f = finish
		}
		b.WriteString(tokenEvent(i, f))
	}
	if done {
		b.WriteString(doneEvent)
	}
	return b.String()
}

func sseHeader(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

// streamTokens writes n token events every `every`, the last with finish
// reason finish, then [DONE] if done; it stops early when the request's
// context ends and reports whether it wrote everything.
func streamTokens(w http.ResponseWriter, r *http.Request, n int, every time.Duration, finish string, done bool) bool {
	sseHeader(w)
	fl := w.(http.Flusher)
	for i := range n {
		if i > 0 && every > 0 {
			select {
			case <-r.Context().Done():
				return false
			case <-time.After(every):
			}
		}
		f := ""
		if i == n-1 {
			f = finish
		}
		if _, err := io.WriteString(w, tokenEvent(i, f)); err != nil {
			return false
		}
		fl.Flush()
	}
	if done {
		if _, err := io.WriteString(w, doneEvent); err != nil {
			return false
		}
		fl.Flush()
	}
	return true
}

// requestModel reads the request body's model (and the body).
func requestModel(r *http.Request) (string, []byte) {
	b, _ := io.ReadAll(r.Body)
	var v struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(b, &v)
	return v.Model, b
}

// waitUntil polls cond every 20 ms for at most d.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
