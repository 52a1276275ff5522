package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process the run started, with its log in the work folder.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// start runs bin with args in its own process group, its output in
// dir/name.log, with env added to a copy of this process's environment
// from which every OTEL_ variable is removed (only the sidecar variants
// that ask for OTLP get it).
func start(dir, name, bin string, args, env []string) (*proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process, then SIGKILL to its process group
// after 5 s.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
	p.log.Close()
}

// tail returns the end of the process's log, for an error message.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log.Name())
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitStream waits until a short stream through url succeeds: HTTP 200
// and [DONE] (the upstream honours max_tokens).
func waitStream(url string, p *proc, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last = oneStream(ctx, url)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %s: %v", url, limit, last)
}

// readyBody and toolReady are short streams: two events of text, and a
// whole tool call in three events (toolBody's tool and schema).
const (
	readyBody = `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"ready?"}]}`
	toolReady = `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"the weather?"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string","minLength":1},` +
		`"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","days"],"additionalProperties":false}}}]}`
)

func oneStream(ctx context.Context, url string) error { return oneStreamBody(ctx, url, readyBody) }

// oneStreamBody posts body to url and reads the stream to its [DONE].
func oneStreamBody(ctx context.Context, url, body string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		if bytes.HasPrefix(line, done) {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("stream ended without [DONE]")
			}
			return err
		}
	}
}

// waitHTTP waits until GET url answers 200.
func waitHTTP(url string, p *proc, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %s", url, limit)
}

// fetch saves GET url to path (a profile).
func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func itoa(n int) string { return strconv.Itoa(n) }
