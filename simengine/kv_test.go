package simengine

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/stream"
)

// KV capacity 30 tokens, batch 4: three sequences of prompt 5 fit at
// admission (15 + 3 new tokens), but each step adds one token per
// sequence; once 3 × (5 + generated) + 3 > 30 the newest is preempted,
// waits at the head of the queue, and when the others finish it is
// readmitted and recomputes prompt + generated tokens. Its client sees
// one long gap; every sequence still gets all its tokens.
func TestPreemptionWhenKVFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.KVCapacityTokens = 4, 30
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		var seqs []*seq
		for i := 0; i < 3; i++ {
			s, ok := e.submit(ctx, 5, nil, 8, true)
			if !ok {
				t.Fatal("rejected")
			}
			seqs = append(seqs, s)
		}
		type res struct {
			gaps   []time.Duration
			tokens int
		}
		out := make([]res, 3)
		done := make(chan struct{})
		for i, s := range seqs {
			go func() {
				_, g, n := firstAndRest(s, time.Now())
				out[i] = res{g, n}
				done <- struct{}{}
			}()
		}
		for range seqs {
			<-done
		}
		_, _, preemptions := e.KV()
		if preemptions == 0 {
			t.Fatal("no preemption with 3 × 13 tokens over a 30-token cache")
		}
		longest := time.Duration(0)
		for i, r := range out {
			if r.tokens != 8 {
				t.Errorf("seq %d got %d tokens, want 8", i, r.tokens)
			}
			for _, g := range r.gaps {
				longest = max(longest, g)
			}
		}
		// Steps are 25-40 ms; a preempted sequence waits for the others
		// to finish and recomputes: far longer than a step.
		if longest < 100*time.Millisecond {
			t.Errorf("longest gap %v: the preempted sequence did not stall", longest)
		}
		if v := testutil.ToFloat64(e.m.success.WithLabelValues("length")); v != 3 {
			t.Errorf("request_success{length} = %v", v)
		}
	})
}

// The default capacity does not preempt the default batch.
func TestDefaultCapacityDoesNotPreempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.MaxQueue = 8, 16
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		done := make(chan struct{})
		for i := 0; i < 16; i++ {
			s, _ := e.submit(ctx, 200, nil, 64, true)
			go func() { firstAndRest(s, time.Now()); done <- struct{}{} }()
		}
		for i := 0; i < 16; i++ {
			<-done
		}
		if _, _, p := e.KV(); p != 0 {
			t.Errorf("%d preemptions at the default capacity", p)
		}
	})
}

// /metrics speaks vLLM's names in the Prometheus text format.
func TestMetricsEndpoint(t *testing.T) {
	cfg := fast()
	cfg.KVCapacityTokens = 1000
	s := serve(t, cfg)
	resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"x","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitLoad(t, s.Config.Handler.(*Server).Engine, func(running, waiting int) bool { return running+waiting == 0 })
	resp, err = http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q", ct)
	}
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="tokentap-sim"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="tokentap-sim"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="tokentap-sim"} 0`,
		`vllm:num_preemptions_total{engine="0",model_name="tokentap-sim"} 0`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="tokentap-sim"} 1`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="tokentap-sim"} 1`,
		`vllm:inter_token_latency_seconds_count{engine="0",model_name="tokentap-sim"} 2`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s\n%s", want, b)
		}
	}
}

// A prompt that cannot fit the KV cache is refused, as an engine refuses
// one longer than its context.
func TestPromptLargerThanKV(t *testing.T) {
	cfg := fast()
	cfg.KVCapacityTokens = 10
	s := serve(t, cfg)
	resp, err := http.Post(s.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"`+strings.Repeat("x", 400)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// A max_tokens of 2^63-1 is a claim, not a size: the simulator streams
// (the room for its events is bounded by the KV cache) instead of its
// handler panicking on the channel's size (issue 40, item 1).
func TestHugeMaxTokensStreams(t *testing.T) {
	s := serve(t, fast())
	resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"x","stream":true,"max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var f stream.Framer
	buf := make([]byte, 4096)
	tokens := 0
	for tokens < 3 {
		n, err := resp.Body.Read(buf)
		f.Feed(buf[:n], func(e *stream.Event) {
			var c stream.Chunk
			stream.ParseOpenAI(e.Data, &c)
			if c.Output {
				tokens++
			}
		})
		if err != nil {
			t.Fatalf("after %d tokens: %v", tokens, err)
		}
	}
}
