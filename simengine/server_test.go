package simengine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/stream"
)

func serve(t *testing.T, cfg Config) *httptest.Server {
	e := NewEngine(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	go e.Run(ctx)
	s := httptest.NewServer(NewServer(e))
	t.Cleanup(func() { s.Close(); cancel() })
	return s
}

func fast() Config {
	c := quiet()
	c.PrefillBase, c.PrefillPerToken, c.DecodeBase, c.DecodePerSeq = time.Millisecond, 0, time.Millisecond, 0
	return c
}

func events(t *testing.T, body string) []stream.Chunk {
	var f stream.Framer
	var out []stream.Chunk
	f.Feed([]byte(body), func(e *stream.Event) {
		var c stream.Chunk
		stream.ParseOpenAI(e.Data, &c)
		out = append(out, c)
	})
	return out
}

func TestStreamWireFormat(t *testing.T) {
	s := serve(t, fast())
	for _, c := range []struct {
		path, body string
		usage      bool
	}{
		{"/v1/chat/completions", `{"model":"x","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"/v1/chat/completions", `{"model":"x","stream":true,"max_tokens":5,"messages":[],"stream_options":{"include_usage":true}}`, true},
		{"/v1/completions", `{"model":"x","stream":true,"max_tokens":5,"prompt":"hi","stream_options":{"include_usage":true}}`, true},
	} {
		resp, err := http.Post(s.URL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		evs := events(t, string(b))
		last := evs[len(evs)-1]
		if !last.Done {
			t.Fatalf("%s: no [DONE]:\n%s", c.path, b)
		}
		tokens, usage := 0, false
		for _, e := range evs {
			if e.Output {
				tokens++
			}
			if e.UsageOnly() {
				usage = true
				if e.CompletionTokens != 5 {
					t.Fatalf("usage says %d tokens, want 5", e.CompletionTokens)
				}
			}
		}
		if tokens != 5 || usage != c.usage {
			t.Fatalf("%s: %d token events, usage %v (want 5, %v):\n%s", c.path, tokens, usage, c.usage, b)
		}
		if evs[len(evs)-2-boolInt(c.usage)].FinishReason == nil {
			t.Fatalf("%s: finish_reason not on the last content chunk:\n%s", c.path, b)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestMidStreamErrorAfter200(t *testing.T) {
	cfg := fast()
	cfg.ErrorProb = 1
	s := serve(t, cfg)
	resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true,"max_tokens":20,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	evs := events(t, string(b))
	if resp.StatusCode != 200 || !evs[len(evs)-2].Error || evs[len(evs)-2].ErrorCode != 500 || !evs[len(evs)-1].Done {
		t.Fatalf("status %d:\n%s", resp.StatusCode, b)
	}
}

func TestNonStreamingAndRejection(t *testing.T) {
	cfg := fast()
	cfg.MaxBatch, cfg.MaxQueue = 1, 0
	s := serve(t, cfg)
	e := s.Config.Handler.(*Server).Engine
	// Occupy the only slot with a request that runs until it is cancelled
	// (10,000 tokens at 1 ms): the engine's own count says when it holds
	// the slot, so no sleep guesses how long the machine takes.
	ctx, cancel := context.WithCancel(context.Background())
	long, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/v1/completions", strings.NewReader(`{"max_tokens":10000,"ignore_eos":true,"prompt":"x"}`))
	longDone := make(chan struct{})
	go func() {
		if resp, err := http.DefaultClient.Do(long); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		close(longDone)
	}()
	waitLoad(t, e, func(running, waiting int) bool { return running+waiting == 1 })
	resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"max_tokens":2,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !strings.Contains(string(b), "overloaded") {
		t.Fatalf("status %d %s, want 429 overloaded", resp.StatusCode, b)
	}
	cancel() // the long request ends: the engine aborts it and frees the slot
	<-longDone
	waitLoad(t, e, func(running, waiting int) bool { return running+waiting == 0 })
	resp, err = http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"max_tokens":2,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object string `json:"object"`
		Usage  struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out.Object != "chat.completion" || out.Usage.CompletionTokens != 2 {
		t.Fatalf("status %d %+v", resp.StatusCode, out)
	}
}

// waitLoad waits until the engine's running and waiting counts satisfy
// ok: the engine updates them after it has handed a request its last
// event, so a client can finish reading before they change. The bound
// (10 s) only stops a hang; it measures nothing.
func waitLoad(t *testing.T, e *Engine, ok func(running, waiting int) bool) {
	t.Helper()
	for i := 0; ; i++ {
		running, waiting := e.Load()
		if ok(running, waiting) {
			return
		}
		if i == 10_000 {
			t.Fatalf("the engine's load stayed at %d running, %d waiting", running, waiting)
		}
		time.Sleep(time.Millisecond)
	}
}
