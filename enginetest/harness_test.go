package enginetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/gguf"
	"github.com/tokentap/tokentap/internal/testtool"
)

// The model every test uses: internal/gguf's tiny llama with this seed.
// Greedy decoding never ends it early (see internal/gguf), so every answer
// is exactly as long as the request's token limit.
const (
	modelName = "tiny"
	modelSeed = 42
	// The option values of every request: a greedy decode with a fixed seed.
	seed = 7
)

// modelfile: a template that the chat, generate, Responses and Messages
// paths all render; one CPU thread for the runner, so that the client and
// the sidecar always find a free core on a two-core machine.
const modelfile = `FROM ./tiny.gguf
TEMPLATE """{{- if .System }}<|system|>{{ .System }}
{{ end }}{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{ end }}<|assistant|>"""
PARAMETER temperature 0
PARAMETER seed 42
PARAMETER num_thread 1
PARAMETER num_ctx 2048
`

var (
	setupOnce sync.Once
	shared    *world
	setupErr  error
	cleanups  []func()
)

// world is what every test shares: one ollama serve with the model created
// and loaded, and the sidecar binary.
type world struct {
	ollama  string // http://127.0.0.1:PORT
	sidecar string // the built binary
	dir     string
	log     *os.File
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(code)
}

// setup returns the shared Ollama and sidecar binary, starting them on the
// first call. A missing ollama skips the test, or fails it with CI=true.
func setup(t *testing.T) *world {
	t.Helper()
	bin := testtool.Need(t, "ollama")
	setupOnce.Do(func() {
		shared, setupErr = start(bin, engineSpec{parallel: 1, model: gguf.Config{Seed: modelSeed}, modelfile: modelfile})
	})
	if setupErr != nil {
		t.Fatalf("starting ollama: %v", setupErr)
	}
	return shared
}

// engineSpec is how one ollama serve is started: its sequences served
// at once (OLLAMA_NUM_PARALLEL), the model it serves as modelName and
// that model's Modelfile.
type engineSpec struct {
	parallel  int
	model     gguf.Config
	modelfile string
}

func start(bin string, spec engineSpec) (*world, error) {
	dir, err := os.MkdirTemp("", "tokentap-enginetest-")
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	w := &world{dir: dir}

	if w.sidecar, err = buildSidecar(dir); err != nil {
		return nil, err
	}

	if err := gguf.WriteFile(filepath.Join(dir, "tiny.gguf"), spec.model); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "Modelfile"), []byte(spec.modelfile), 0o644); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	w.ollama = "http://" + port
	env := append(cleanEnv(),
		"OLLAMA_HOST="+port,
		"OLLAMA_MODELS="+filepath.Join(dir, "models"),
		"HOME="+filepath.Join(dir, "home"),
		"OLLAMA_KEEP_ALIVE=1h",
		fmt.Sprintf("OLLAMA_NUM_PARALLEL=%d", spec.parallel),
		"OLLAMA_NO_CLOUD=1",
		"OLLAMA_NOPRUNE=1",
	)
	w.log, err = os.Create(filepath.Join(dir, "ollama.log"))
	if err != nil {
		return nil, err
	}
	serve := exec.Command(bin, "serve")
	serve.Env, serve.Dir, serve.Stdout, serve.Stderr = env, dir, w.log, w.log
	// A process group of its own: ollama serve starts a runner process per
	// loaded model, and a killed server would leave it behind.
	serve.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := serve.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	cleanups = append(cleanups, func() {
		serve.Process.Signal(syscall.SIGTERM) // stops its runners
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
		syscall.Kill(-serve.Process.Pid, syscall.SIGKILL) // whatever is left of the group
		<-exited
		if os.Getenv("ENGINETEST_OLLAMA_LOG") != "" {
			b, _ := os.ReadFile(w.log.Name())
			os.Stderr.Write(b)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(w.ollama + "/api/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("ollama serve exited:\n%s", w.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("ollama serve not up after 60 s:\n%s", w.logTail())
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	create := exec.CommandContext(ctx, bin, "create", modelName, "-f", "Modelfile")
	create.Env, create.Dir = env, dir
	if out, err := create.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ollama create: %v\n%s\n%s", err, out, w.logTail())
	}
	// Load the model now, so that no test measures a model load.
	resp, err := http.Post(w.ollama+"/api/generate", "application/json",
		strings.NewReader(`{"model":"`+modelName+`","prompt":"hi","stream":false,"options":{"num_predict":2}}`))
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("loading the model: %d %s\n%s", resp.StatusCode, b, w.logTail())
	}
	return w, nil
}

// buildSidecar builds the sidecar binary into dir and returns its path.
// It is built as the main module (its own go.mod and go.sum, so that this
// module's SDK requirements do not change its dependencies).
func buildSidecar(dir string) (string, error) {
	bin := filepath.Join(dir, "sidecar")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sidecar")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sidecar: %v\n%s", err, out)
	}
	return bin, nil
}

func (w *world) logTail() string {
	b, _ := os.ReadFile(w.log.Name())
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// cleanEnv is the environment without proxy settings and OLLAMA_ variables
// of the machine, so that nothing reaches past 127.0.0.1.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "OLLAMA_"), strings.EqualFold(k, "HTTP_PROXY"), strings.EqualFold(k, "HTTPS_PROXY"),
			strings.EqualFold(k, "ALL_PROXY"), strings.EqualFold(k, "NO_PROXY"), strings.HasPrefix(k, "TOKENTAP_"), strings.HasPrefix(k, "OTEL_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// sidecar is one running tokentap in front of the shared Ollama.
type sidecar struct {
	proxy, admin string // http://127.0.0.1:PORT
	records      string // the records file
	stderr       *bytes.Buffer
	mu           *sync.Mutex
	seen         int // records already handed out by next
}

var upRe = regexp.MustCompile(`proxy=(http://\S+) .*metrics=(http://\S+)/metrics`)

// startSidecar starts the sidecar binary in front of the shared Ollama,
// with --records in a temporary file and the given extra arguments.
// ioModes are the sidecar's two I/O paths for streamed answers: the
// event loop's (the default, docs/design.md "The event loop") and
// net/http's (--event-loop=false). The format and SDK tests run through
// both.
var ioModes = []struct {
	name string
	args []string
	loop bool // the event loop carries the streams
}{{"event_loop", nil, true}, {"net_http", []string{"--event-loop=false"}, false}}

// loopCarried fails t when the event loop should have carried s's
// streams (loop) and relayed none, or should not have and did: the
// sidecar logs the first it relays.
func loopCarried(t *testing.T, s *sidecar, loop bool) {
	t.Helper()
	if carried := strings.Contains(s.log(), "event loop: relaying streamed answers"); carried != loop {
		t.Errorf("the event loop relayed streams: %v, want %v; the sidecar's log:\n%s", carried, loop, s.log())
	}
}

func startSidecar(t *testing.T, w *world, args ...string) *sidecar {
	t.Helper()
	s := &sidecar{records: filepath.Join(t.TempDir(), "records.jsonl"), stderr: &bytes.Buffer{}, mu: &sync.Mutex{}}
	cmd := exec.Command(w.sidecar, append([]string{"--upstream", w.ollama, "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--records", s.records, "--energy", "off"}, args...)...)
	cmd.Env = cleanEnv()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("sidecar log:\n%s", s.stderr)
			s.mu.Unlock()
		}
	})
	sc := bufio.NewScanner(pipe)
	up := make(chan []string, 1)
	go func() {
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.stderr.WriteString(line + "\n")
			s.mu.Unlock()
			if m := upRe.FindStringSubmatch(line); m != nil {
				select {
				case up <- m:
				default:
				}
			}
		}
	}()
	select {
	case m := <-up:
		s.proxy, s.admin = m[1], m[2]
	case <-time.After(30 * time.Second):
		s.mu.Lock()
		defer s.mu.Unlock()
		t.Fatalf("the sidecar did not come up in 30 s:\n%s", s.stderr)
	}
	return s
}

func (s *sidecar) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// rec is a record line: the fields the tests assert on, and all of it.
type rec struct {
	ID           string   `json:"id"`
	Start        string   `json:"start"`
	Traffic      string   `json:"traffic"`
	API          string   `json:"api"`
	Model        string   `json:"model"`
	Stream       bool     `json:"stream"`
	Outcome      string   `json:"outcome"`
	HTTPStatus   int      `json:"http_status"`
	ErrorType    string   `json:"error_type"`
	ErrorCode    int      `json:"error_code"`
	FinishReason string   `json:"finish_reason"`
	InputTokens  *int     `json:"input_tokens"`
	OutputTokens *int     `json:"output_tokens"`
	TokenSource  string   `json:"token_source"`
	TokenEvents  int      `json:"token_events"`
	Injected     bool     `json:"usage_injected"`
	TapFailed    string   `json:"tap_failed"`
	Malformed    bool     `json:"malformed"`
	TTFTms       *float64 `json:"ttft_ms"`
	E2Ems        *float64 `json:"e2e_ms"`
	TPOTms       *float64 `json:"tpot_ms"`
	ResponseID   string   `json:"response_id"`
	Probe        *struct {
		Name        string `json:"name"`
		Result      string `json:"result"`
		FailedCheck string `json:"failed_check"`
		Failure     string `json:"failure"`
	} `json:"probe"`
	raw map[string]any
}

func (r rec) String() string {
	b, _ := json.Marshal(r.raw)
	return string(b)
}

// all reads every record in the file.
func (s *sidecar) all(t *testing.T) []rec {
	t.Helper()
	b, err := os.ReadFile(s.records)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []rec
	for line := range bytes.Lines(b) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // still being written
		}
		var r rec
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("record %s: %v", line, err)
		}
		json.Unmarshal(line, &r.raw)
		out = append(out, r)
	}
	return out
}

// next waits (5 s at most) for the next live record after those already
// returned, and returns it.
func (s *sidecar) next(t *testing.T) rec {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var live []rec
		for _, r := range s.all(t) {
			if r.Traffic == "live" {
				live = append(live, r)
			}
		}
		if len(live) > s.seen {
			s.seen++
			return live[s.seen-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record %d after 5 s (have %d)", s.seen+1, len(live))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exchange is one request as this client saw it: every body byte, and the
// wall-clock instants of sending, of the first line that carries
// generated text, of the last line and of the end of the body.
type exchange struct {
	status int
	header http.Header
	body   []byte
	sent   time.Time // the request was written
	first  time.Time // the first token-bearing line arrived (zero: none)
	last   time.Time // the last non-empty line arrived
	end    time.Time // EOF
	tokens int       // token-bearing lines
	lines  int
}

// post sends body to base+path and reads the answer line by line. isToken
// says whether a line carries generated text (nil: no line does).
func post(t *testing.T, base, path, body string, isToken func([]byte) bool) exchange {
	t.Helper()
	req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return do(t, req, isToken)
}

var client = &http.Client{Transport: &http.Transport{DisableCompression: true}}

func do(t *testing.T, req *http.Request, isToken func([]byte) bool) exchange {
	t.Helper()
	var x exchange
	// sent: the request is written (a new connection's setup is not part
	// of any latency the sidecar could see).
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { x.sent = time.Now().Round(0) },
	}))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	x.status, x.header = resp.StatusCode, resp.Header
	// The loop only reads and stamps: each byte gets the instant of the
	// read that returned it, and lines are looked at after EOF, so that
	// parsing (slow under -race) never delays a later stamp.
	var stamps []time.Time // stamps[i]: the instant body[i] was read
	buf := make([]byte, 1<<16)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			now := time.Now().Round(0)
			x.body = append(x.body, buf[:n]...)
			for range n {
				stamps = append(stamps, now)
			}
		}
		if err == io.EOF {
			x.end = time.Now().Round(0)
			break
		}
		if err != nil {
			t.Fatalf("reading %s: %v", req.URL, err)
		}
	}
	// A line arrived when its last byte (its newline) did.
	off := 0
	for line := range bytes.Lines(x.body) {
		off += len(line)
		at := stamps[off-1]
		if len(bytes.TrimSpace(line)) > 0 {
			x.lines++
			x.last = at
		}
		if isToken != nil && isToken(line) {
			x.tokens++
			if x.first.IsZero() {
				x.first = at
			}
		}
	}
	return x
}

// execCommand is exec.Command with the clean environment.
func execCommand(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = cleanEnv()
	return c
}
