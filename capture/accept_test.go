package capture_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/workload"
)

// The scripted workload of the acceptance test (docs/capture.md,
// "What the test shows"): 250 conversations of 2 turns each under 3
// system prompts, 500 requests at known instants (a conversation begins
// every 20 ms, its second turn 5 to 5.5 s later: about 50 requests/s
// for 10.5 s), each answered by a scripted engine that streams a known
// number of tokens and reports known usage; a few fail (HTTP 503), and 5
// canary requests pass through a canary proxy on the same pipeline.
//
// The capture it writes is kept as testdata/scripted.jsonl (a golden
// file: the test fails when its capture differs; go test -run
// TestCaptureScriptedWorkload -update rewrites it), and package replay's
// acceptance test replays that file against the simulator.
// update rewrites testdata/scripted.jsonl with the capture the test
// writes.
var update = flag.Bool("update", false, "rewrite testdata/scripted.jsonl")

// golden is the capture the acceptance test writes, kept.
const golden = "testdata/scripted.jsonl"

const (
	conversations = 250
	apiKey        = "sk-test-Zq9vW2mK7pL4xR8nT3bY"
	sessionHeader = "X-Session-Id"
)

type scripted struct {
	at       time.Duration // arrival, from the start
	body     []byte
	messages []map[string]string
	system   int
	conv     int
	turn     int
	in, out  int64 // the usage the engine reports
	fail     bool  // the engine answers 503
	cancel   bool  // the client goes away 25 ms after sending, mid-stream
}

// words returns n pseudo-random lower-case words from r: text no file
// line contains 8 characters of by chance.
func words(r *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		for range 3 + r.IntN(7) {
			b.WriteByte(byte('a' + r.IntN(26)))
		}
	}
	return b.String()
}

func script(t *testing.T) ([]scripted, []string) {
	r := rand.New(rand.NewPCG(22, 7))
	systems := []string{words(r, 900), words(r, 1200), words(r, 700)} // 4 to 8 KiB: several blocks each
	var texts []string
	texts = append(texts, systems...)
	var reqs []scripted
	for c := range conversations {
		sys := c % 3
		u1, a1, u2 := words(r, 20+r.IntN(200)), words(r, 30+r.IntN(60)), words(r, 10+r.IntN(100))
		texts = append(texts, u1, a1, u2)
		start := time.Duration(c)*20*time.Millisecond + time.Duration(r.IntN(20000))*time.Microsecond
		for turn := 1; turn <= 2; turn++ {
			msgs := []map[string]string{{"role": "system", "content": systems[sys]}, {"role": "user", "content": u1}}
			at := start
			if turn == 2 {
				msgs = append(msgs, map[string]string{"role": "assistant", "content": a1}, map[string]string{"role": "user", "content": u2})
				at += 5*time.Second + time.Duration(r.IntN(500))*time.Millisecond
			}
			body, err := json.Marshal(map[string]any{"model": "m1", "messages": msgs, "stream": true, "max_tokens": 64})
			if err != nil {
				t.Fatal(err)
			}
			in := int64(len(body))/4 + int64(r.IntN(40))
			if c%25 == 0 {
				in = int64(512 * (2 + r.IntN(3))) // a whole number of blocks
			}
			s := scripted{at: at, body: body, messages: msgs, system: sys, conv: c, turn: turn,
				in: in, out: int64(1 + r.IntN(40)), fail: len(reqs)%97 == 50}
			if c%50 == 7 && turn == 1 {
				s.cancel, s.out = true, 30 // 20 ms to the first token, 2 ms apart: cut after about 3
			}
			reqs = append(reqs, s)
		}
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].at < reqs[j].at })
	for i := 1; i < len(reqs); i++ {
		if reqs[i].at == reqs[i-1].at {
			t.Fatal("two arrivals at the same instant: the test matches lines to requests by arrival")
		}
	}
	return reqs, texts
}

// engine is the scripted upstream: it answers each request with its
// script's tokens, 2 ms apart, then its usage.
type engine struct {
	mu   sync.Mutex
	byIn map[string]*scripted
}

func (e *engine) RoundTrip(r *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	s := e.byIn[string(b)]
	e.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("unscripted request")
	}
	time.Sleep(20 * time.Millisecond) // queue and prefill
	if s.fail {
		return &http.Response{StatusCode: 503, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"error":"overloaded"}`)), Request: r}, nil
	}
	pr, pw := io.Pipe()
	go func() {
		for range s.out {
			select {
			case <-r.Context().Done(): // as net/http's transport does
				pw.CloseWithError(r.Context().Err())
				return
			case <-time.After(2 * time.Millisecond):
			}
			pw.Write([]byte(`data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"))
		}
		fmt.Fprintf(pw, `data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n")
		fmt.Fprintf(pw, `data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", s.in, s.out, s.in+s.out)
		pw.Write([]byte("data: [DONE]\n\n"))
		pw.Close()
	}()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: r}, nil
}

// TestCaptureScriptedWorkload is the acceptance test of the capture
// (issue 22): see docs/capture.md, "What the test shows".
func TestCaptureScriptedWorkload(t *testing.T) {
	reqs, texts := script(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "capture.jsonl")
	secretPath := filepath.Join(dir, "capture.key")
	secret, err := capture.LoadSecret(secretPath)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		c, err := capture.Open(capture.Options{Path: path, Secret: secret, SessionHeader: sessionHeader})
		if err != nil {
			t.Fatal(err)
		}
		judge := slo.NewJudge(slo.Config{Objectives: []slo.Objective{{Name: "ttft", Target: 0.9, Thresholds: slo.Thresholds{TTFT: 25 * time.Millisecond}}}})
		pipe := pipeline.New(pipeline.Options{Judge: judge, Capture: c})
		eng := &engine{byIn: map[string]*scripted{}}
		for i := range reqs {
			eng.byIn[string(reqs[i].body)] = &reqs[i]
		}
		up, _ := url.Parse("http://engine.invalid")
		live, err := proxy.New(proxy.Options{Upstream: up, Transport: eng, Pipeline: pipe})
		if err != nil {
			t.Fatal(err)
		}
		canary, err := proxy.New(proxy.Options{Upstream: up, Transport: eng, Pipeline: pipe, Traffic: "canary"})
		if err != nil {
			t.Fatal(err)
		}
		send := func(p *proxy.Proxy, s *scripted) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(s.body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer "+apiKey)
			r.Header.Set(sessionHeader, "conversation-"+strconv.Itoa(s.conv)+"-of-user@example.com")
			if s.cancel && p == live {
				ctx, cancel := context.WithCancel(r.Context())
				defer cancel()
				time.AfterFunc(25*time.Millisecond, cancel)
				r = r.WithContext(ctx)
			}
			if p == canary { // as the prober sends its probes (proxy.Hook)
				r = r.WithContext(proxy.WithHook(r.Context(), &proxy.Hook{Probe: "p1"}))
			}
			w := httptest.NewRecorder()
			p.ServeHTTP(w, r)
			io.Copy(io.Discard, w.Result().Body)
		}
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() {
				time.Sleep(reqs[i].at)
				send(live, &reqs[i])
			})
		}
		for i := range 5 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 777 * time.Millisecond)
				send(canary, &reqs[i*50])
			})
		}
		wg.Wait()
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := c.Stats(); st.Written != uint64(len(reqs)) || st.Late != 0 || st.FileDropped != 0 {
			t.Errorf("stats %+v, want %d written, none dropped", st, len(reqs))
		}
	})
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := readTrace(t, path)
	if len(lines) != len(reqs) {
		t.Fatalf("%d lines, want %d (one per live request, no canary)", len(lines), len(reqs))
	}
	first := reqs[0].at
	sessions := map[string]int{}
	cancelled := 0
	for i, l := range lines {
		s := reqs[i]
		// Timestamps: the arrival, in whole ms since the first.
		exact := float64(s.at-first) / float64(time.Millisecond)
		if d := exact - float64(l.Timestamp); d < 0 || d >= 1 {
			t.Errorf("line %d: timestamp %d, arrival %.3f ms after the first", i+1, l.Timestamp, exact)
		}
		m := l.Tokentap
		if m == nil {
			t.Fatalf("line %d: no tokentap member", i+1)
		}
		switch {
		case s.cancel:
			// A client that went away: flagged, its line written all the
			// same, its lengths not the engine's (no usage came).
			if m.Outcome != "cancelled" || m.InputLengthFrom == "engine" || m.OutputLengthFrom == "engine" || l.OutputLength >= s.out {
				t.Errorf("line %d (cancelled request): %+v, output_length %d", i+1, m, l.OutputLength)
			}
			cancelled++
		case s.fail:
			// A 503 is the engine refusing the request (docs/records.md):
			// flagged, its lengths not the engine's and said so.
			if m.Outcome != "rejected" || m.ErrorType != "rejected" || m.InputLengthFrom == "engine" || m.OutputLengthFrom != "none" {
				t.Errorf("line %d (failed request): %+v", i+1, m)
			}
		default:
			if l.InputLength != s.in || l.OutputLength != s.out || m.InputLengthFrom != "engine" || m.OutputLengthFrom != "engine" {
				t.Errorf("line %d: lengths %d/%d (%s/%s), want the usage %d/%d", i+1, l.InputLength, l.OutputLength, m.InputLengthFrom, m.OutputLengthFrom, s.in, s.out)
			}
			if m.Outcome != "success" || m.TTFTMs == nil || m.SLO["ttft"] == "" || m.HashIDsFrom != "prompt" {
				t.Errorf("line %d: meta %+v", i+1, m)
			}
		}
		// The id rule.
		if want := (l.InputLength + 511) / 512; int64(len(l.HashIDs)) != want {
			t.Errorf("line %d: %d hash_ids for input_length %d, want %d", i+1, len(l.HashIDs), l.InputLength, want)
		}
		// Sessions: one id per conversation, renumbered.
		if prev, ok := sessions[l.SessionID]; ok && prev != s.conv {
			t.Errorf("line %d: session %q names conversations %d and %d", i+1, l.SessionID, prev, s.conv)
		}
		sessions[l.SessionID] = s.conv
	}
	if cancelled != 5 {
		t.Errorf("%d cancelled requests, want 5", cancelled)
	}
	if len(sessions) != conversations {
		t.Errorf("%d session ids, want %d", len(sessions), conversations)
	}
	// The prefix rule, on every pair of requests 1 to 30 lines apart and
	// every conversation's two turns.
	const block = 512 * 4
	pairs, shared := 0, 0
	byConv := map[int][]int{}
	for i := range lines {
		byConv[reqs[i].conv] = append(byConv[reqs[i].conv], i)
		for j := i + 1; j < min(i+31, len(lines)); j++ {
			checkPrefix(t, lines, reqs, i, j, block, &shared)
			pairs++
		}
	}
	for _, ij := range byConv {
		checkPrefix(t, lines, reqs, ij[0], ij[1], block, &shared)
		pairs++
	}
	if shared < conversations {
		t.Errorf("only %d of %d pairs share a prefix id", shared, pairs)
	}
	t.Logf("%d lines, %d bytes; prefix rule checked on %d pairs, %d sharing", len(lines), len(file), pairs, shared)
	// No text: no 8-byte window of any prompt, and no key.
	windows := map[string]bool{}
	for i := 0; i+8 <= len(file); i++ {
		windows[string(file[i:i+8])] = true
	}
	sb, _ := os.ReadFile(secretPath)
	secretHex := strings.TrimSpace(string(sb))
	for _, s := range append(texts, apiKey, secretHex, hex.EncodeToString(secret), "user@example.com", "conversation-") {
		for i := 0; i+8 <= len(s); i++ {
			if windows[s[i:i+8]] {
				t.Fatalf("the capture holds %q, 8 bytes of a prompt or key", s[i:i+8])
			}
		}
	}
	if bytes.Contains(file, secret) {
		t.Fatal("the capture holds the raw secret")
	}
	for _, r := range readers {
		t.Run(r.name, func(t *testing.T) { r.check(t, path) })
	}
	// The file is the same on every run: the ids are renumbered per file
	// by first appearance, whatever the secret, and the fake clock makes
	// every instant exact.
	if *update {
		if err := os.WriteFile(golden, file, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if kept, err := os.ReadFile(golden); err != nil || !bytes.Equal(kept, file) {
		t.Errorf("the capture differs from %s (%v): rerun with -update if the change is meant, and review its diff", golden, err)
	}
}

// checkPrefix: requests i and j share exactly the leading ids that the
// blocks of their canonical prompts (docs/capture.md) they share imply,
// and none at all when their first blocks differ.
func checkPrefix(t *testing.T, lines []workload.Request, reqs []scripted, i, j, block int, shared *int) {
	t.Helper()
	a, b := canonicalOf(reqs[i]), canonicalOf(reqs[j])
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	la, lb := lines[i], lines[j]
	want := 0
	for k := 0; k < common/block && k < len(la.HashIDs) && k < len(lb.HashIDs); k++ {
		if (k == len(la.HashIDs)-1 && la.InputLength%512 != 0) || (k == len(lb.HashIDs)-1 && lb.InputLength%512 != 0) {
			break // a last, partial block is another block
		}
		want++
	}
	got := 0
	for got < len(la.HashIDs) && got < len(lb.HashIDs) && la.HashIDs[got] == lb.HashIDs[got] {
		got++
	}
	if got != want {
		t.Errorf("lines %d and %d share %d leading ids, want %d (%d bytes of prompt in common)", i+1, j+1, got, want, common)
	}
	if common < block {
		seen := map[int64]bool{}
		for _, id := range la.HashIDs {
			seen[id] = true
		}
		for _, id := range lb.HashIDs {
			if seen[id] {
				t.Errorf("lines %d and %d differ in their first block but share id %d", i+1, j+1, id)
			}
		}
	}
	if got > 0 {
		*shared++
	}
}

// canonicalOf is the test's own canonical prompt of a chat request: the
// messages member, compact as json.Marshal writes it.
func canonicalOf(s scripted) []byte {
	m, _ := json.Marshal(s.messages)
	return append(append([]byte("messages\x00"), m...), 0)
}

func readTrace(t *testing.T, path string) []workload.Request {
	t.Helper()
	r, closer, err := workload.Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	var out []workload.Request
	for {
		req, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, req)
	}
}
