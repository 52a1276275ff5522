package simengine

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// quiet has no randomness in timing: no jitter, stalls, errors, EOS or
// coalescing, so every instant is computable by hand.
func quiet() Config {
	return Config{MaxBatch: 2, MaxQueue: 4, PrefillBase: 10 * time.Millisecond, PrefillPerToken: time.Millisecond,
		DecodeBase: 20 * time.Millisecond, DecodePerSeq: 5 * time.Millisecond, StallDuration: time.Second}
}

func firstAndRest(s *seq, start time.Time) (ttft time.Duration, gaps []time.Duration, tokens int) {
	last := time.Time{}
	for ev := range s.out {
		now := time.Now()
		if last.IsZero() {
			ttft = now.Sub(start)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
		tokens += len(ev.tokens)
	}
	return
}

// TTFT = the admitting step: decode (20 + 5×running) + prefill (10 + 1 ms
// per prompt token). A 100-token prompt alone: 25 + 110 = 135 ms; a
// 1,000-token prompt: 25 + 1010 = 1035 ms. Later steps: 25 ms.
func TestTTFTGrowsWithPromptLength(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewEngine(quiet())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		for _, c := range []struct {
			prompt int
			ttft   time.Duration
		}{{100, 135 * time.Millisecond}, {1000, 1035 * time.Millisecond}} {
			start := time.Now()
			s, ok := e.submit(ctx, c.prompt, nil, 3, true)
			if !ok {
				t.Fatal("rejected")
			}
			ttft, gaps, n := firstAndRest(s, start)
			if ttft != c.ttft || n != 3 || len(gaps) != 2 || gaps[0] != 25*time.Millisecond {
				t.Fatalf("prompt %d: ttft %v gaps %v tokens %d; want ttft %v, gaps 25ms, 3 tokens", c.prompt, ttft, gaps, n, c.ttft)
			}
		}
	})
}

// MaxBatch 2: four requests of 10 prompt tokens and 2 output tokens
// arrive together. Step 1 admits A and B: 20+5×2 + 2×(10+10) = 70 ms, their
// first token. Step 2 (30 ms, t=100) gives their second token and ends them.
// Step 3 admits C and D: 70 ms, t=170 ms. So C and D wait 100 ms in queue.
func TestQueueingPastBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewEngine(quiet())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		start := time.Now()
		var seqs []*seq
		for i := 0; i < 4; i++ {
			s, ok := e.submit(ctx, 10, nil, 2, true)
			if !ok {
				t.Fatal("rejected")
			}
			seqs = append(seqs, s)
		}
		want := []time.Duration{70, 70, 170, 170}
		res := make([]time.Duration, 4)
		done := make(chan struct{})
		for i, s := range seqs {
			go func() { res[i], _, _ = firstAndRest(s, start); done <- struct{}{} }()
		}
		for range seqs {
			<-done
		}
		for i := range want {
			if res[i] != want[i]*time.Millisecond {
				t.Fatalf("TTFTs %v, want %v ms", res, want)
			}
		}
	})
}

// The decode step grows with batch occupancy: alone, 25 ms per token; with
// a second sequence running, 30 ms.
func TestDecodeTimeGrowsWithOccupancy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewEngine(quiet())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		a, _ := e.submit(ctx, 1, nil, 5, true)
		b, _ := e.submit(ctx, 1, nil, 5, true)
		go firstAndRest(b, time.Now())
		_, gaps, _ := firstAndRest(a, time.Now())
		for _, g := range gaps {
			if g != 30*time.Millisecond {
				t.Fatalf("gaps %v with two running, want 30ms each", gaps)
			}
		}
	})
}

func TestRejectsWhenQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.MaxBatch, cfg.MaxQueue = 1, 1
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		if _, ok := e.submit(ctx, 1, nil, 50, true); !ok {
			t.Fatal("first rejected")
		}
		synctest.Wait() // the engine admits it
		if _, ok := e.submit(ctx, 1, nil, 50, true); !ok {
			t.Fatal("second (queued) rejected")
		}
		if _, ok := e.submit(ctx, 1, nil, 50, true); ok {
			t.Fatal("third accepted with batch 1 running and queue 1 full")
		}
	})
}

func TestStallAndCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := quiet()
		cfg.StallProb, cfg.MultiTokenProb = 1, 1
		e := NewEngine(cfg)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go e.Run(ctx)
		start := time.Now()
		s, _ := e.submit(ctx, 0, nil, 4, true)
		ttft, gaps, n := firstAndRest(s, start)
		// Every token is coalesced into the last event; every step stalls 1 s:
		// 4 steps of (25 ms + 1 s) + 10 ms prefill (prompt counted as 0).
		if n != 4 || len(gaps) != 0 || ttft != 4*1025*time.Millisecond+10*time.Millisecond {
			t.Fatalf("ttft %v gaps %v tokens %d", ttft, gaps, n)
		}
	})
}
