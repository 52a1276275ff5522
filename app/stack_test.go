//go:build !race

// The race detector's instrumentation deepens every goroutine's stack, so
// the bound below holds only without it: scripts/test.sh runs this file in
// a step of its own ("stacks"), without -race.

package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The goroutine stack a stream in flight adds to the sidecar, with
// tracing and OTLP metrics on and usage injected, each stream on a
// keep-alive connection that has already carried a whole request (so
// that the set-up and the end of a request both ran on it before). The
// sidecar runs in a process of its own (TestStackChild), so that its
// stack memory (go_memstats_stack_inuse_bytes on /metrics) holds nothing
// but its own goroutines. The figure is over the idle keep-alive
// connections: what a stream adds to the connection goroutine, its
// background read and the transport's loops.
//
// With the set-up and the end of each request on goroutines of their own
// (proxy.ServeHTTP's design note) that is 11 KiB; before, when they ran on
// the connection goroutine, 18-19 KiB: its stack grew to 16 KiB and
// stayed there for the stream's life.
func TestStackPerStream(t *testing.T) {
	const (
		streams = 100
		bound   = 16 << 10 // bytes of stack a stream adds to its connection
	)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" t"},"finish_reason":null}]}` + "\n\n"
		long := strings.Contains(string(body), `"long"`)
		for i := 0; i < 2 || long; i++ {
			io.WriteString(w, chunk)
			w.(http.Flusher).Flush()
			if !long {
				continue
			}
			select {
			case <-release:
				long = false
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		if strings.Contains(string(body), `"include_usage":true`) {
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	var once sync.Once
	end := func() { once.Do(func() { close(release) }) }
	defer end()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()

	cmd := exec.Command(os.Args[0], "-test.run", "^TestStackChild$", "-test.v")
	cmd.Env = append(os.Environ(),
		"TOKENTAP_STACK_CHILD="+up.URL,
		"TOKENTAP_STACK_RECORDS="+filepath.Join(t.TempDir(), "records.jsonl"),
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_METRICS_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+sink.URL+"/v1/traces",
		"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="+sink.URL+"/v1/metrics",
		"OTEL_METRIC_EXPORT_INTERVAL=1000")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sidecar's stderr:\n%s", stderr.String())
		}
	}()
	addrs := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "ADDRS" {
				addrs <- f[1:]
			}
		}
	}()
	var proxyAddr, admin string
	select {
	case a := <-addrs:
		proxyAddr, admin = a[0], a[1]
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not start in 30 s")
	}

	post := func(c *http.Client, model string) (*http.Response, error) {
		body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		return c.Post("http://"+proxyAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	}
	stack := func() float64 {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_stack_inuse_bytes "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				return f
			}
		}
		t.Fatal("no go_memstats_stack_inuse_bytes on /metrics")
		return 0
	}

	// A whole request on each connection first: its set-up and its end.
	clients := make([]*http.Client, streams)
	for i := range clients {
		clients[i] = &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
		resp, err := post(clients[i], "short")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	idle := stack()

	var wg sync.WaitGroup
	first := make(chan error, streams)
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := post(c, "long")
			if err != nil {
				first <- err
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			_, err = br.ReadString('\n')
			first <- err
			io.Copy(io.Discard, br)
		}()
	}
	for range streams {
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // a few events through every stream
	busy := stack()
	per := (busy - idle) / streams
	t.Logf("goroutine stacks: %.0f KiB idle, %.0f KiB with %d streams in flight: %.1f KiB per stream (bound %d KiB)",
		idle/1024, busy/1024, streams, per/1024, bound>>10)
	if per > bound {
		t.Errorf("%.1f KiB of goroutine stack per stream in flight, want at most %d KiB", per/1024, bound>>10)
	}
	end()
	wg.Wait()
}

// TestStackChild is the sidecar of TestStackPerStream, in a process of its
// own; it does nothing unless that test started it.
func TestStackChild(t *testing.T) {
	upstream := os.Getenv("TOKENTAP_STACK_CHILD")
	if upstream == "" {
		t.Skip("run by TestStackPerStream")
	}
	args := []string{"--upstream", upstream, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--records", os.Getenv("TOKENTAP_STACK_RECORDS"), "--engine", "off", "--log-level", "warn"}
	env := Env{Getenv: os.Getenv, Stdout: io.Discard, Stderr: os.Stderr, Ready: func(a Addrs) {
		fmt.Printf("ADDRS %s %s\n", a.Proxy, a.Admin)
	}}
	if err := Run(context.Background(), args, env); err != nil {
		t.Fatal(err)
	}
}
