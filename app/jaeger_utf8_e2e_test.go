package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// lockedBuffer is a log destination a test reads while the sidecar writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// engineModels is a scripted engine that answers each request with a
// stream whose "model" (and "id") it chose: as the request named it,
// except for "bad" (invalid UTF-8: bytes 0xff 0xfe) and "long" (100
// three-byte characters, 300 bytes, which the record cuts at 256 bytes).
func engineModels(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	var req struct{ Model string }
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req)
	model := req.Model
	switch model {
	case "bad":
		model = "\xff\xfebad"
	case "long":
		model = strings.Repeat("模", 100)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < 2; i++ {
		io.WriteString(w, `data: {"id":"id-`+model+`","model":"`+model+`","choices":[{"delta":{"content":"w"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
	}
	io.WriteString(w, `data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`+"\n\ndata: [DONE]\n\n")
}

// One engine answer with an invalid-UTF-8 model, and one whose 300-byte
// model of multi-byte characters is cut at 256 bytes, among 20 ordinary
// requests: all 22 traces reach a real Jaeger, the two spans of each,
// and the sidecar logs no OpenTelemetry error. Every span is exported
// in one batch (the export delay is 60 s; the shutdown flushes), the
// batch one invalid string used to make the OTLP exporter refuse whole.
func TestInvalidUTF8ModelDoesNotDropTraces(t *testing.T) {
	otlp, query, _ := startJaeger(t)
	otelEnv(t, otlp)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
	us := httptest.NewServer(http.HandlerFunc(engineModels))
	defer us.Close()
	records := filepath.Join(t.TempDir(), "r.jsonl")
	var log lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--upstream", us.URL, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--records", records},
			Env{Getenv: os.Getenv, Stdout: io.Discard, Stderr: &log, Ready: func(a Addrs) { ready <- a }})
	}()
	var a Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("sidecar did not start: %v", err)
	}
	models := []string{"bad", "long"}
	for i := range 20 {
		models = append(models, fmt.Sprintf("ok-%d", i))
	}
	for _, m := range models {
		send(t, a.Proxy, m, "")
	}
	recs := tracedRecords(t, records, len(models))
	cancel() // what SIGTERM does in main: the shutdown exports the one batch
	if err := <-done; err != nil {
		t.Fatalf("exit: %v", err)
	}

	deadline := time.Now().Add(20 * time.Second)
	var missing []string
	var bad, long jSpan
	for _, m := range models {
		tr := getTrace(t, query, recs[m].TraceID, 2, time.Until(deadline))
		if tr == nil {
			missing = append(missing, m)
			continue
		}
		switch _, c := byKind(tr); m {
		case "bad":
			bad = c
		case "long":
			long = c
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d traces did not reach Jaeger (%s); sidecar log:\n%s", len(missing), len(models), strings.Join(missing, " "), log.String())
	}
	if got := bad.tag("gen_ai.response.model"); got != "\uFFFD\uFFFDbad" {
		t.Errorf("invalid-UTF-8 response model reached Jaeger as %q", got)
	}
	if got, _ := long.tag("gen_ai.response.model").(string); !utf8.ValidString(got) || got != strings.Repeat("模", 85) {
		t.Errorf("the cut 300-byte response model reached Jaeger as %q", got)
	}
	if strings.Contains(log.String(), "OpenTelemetry error") {
		t.Errorf("the sidecar logged an OpenTelemetry error:\n%s", log.String())
	}
}
