package enginetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/internal/gguf"
	"github.com/tokentap/tokentap/internal/testtool"
)

// The slow causes against a real Ollama (docs/measurement.md §6b, "Why
// slow"): with two sequences served at once, a long prompt arriving
// while another request streams stalls it, and the stall is put down to
// prefill_interference naming the long request; with one sequence at a
// time, a request sent while another streams gets its first token late,
// put down to the queue (or to a long prefill ahead).
//
// The thresholds are not guessed: each test first measures this
// machine's Ollama directly (its own prompt_eval and eval durations) and
// sets the stall threshold and slow_ttft between what a normal gap or
// first token takes and what the effect takes, failing with the figures
// when the two are not far enough apart to tell.

// A larger random model than the shared one, for the two-sequence
// engine: its prefill must take long enough per batch to stall a decode
// visibly (0.8 M parameters, about 3 MB of F32; still no download).
var bigModel = gguf.Config{Seed: modelSeed, Embedding: 128, Layers: 3, Heads: 4, KVHeads: 2, FeedForward: 512, ContextLength: 8192}

const bigModelfile = `FROM ./tiny.gguf
TEMPLATE """{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{ end }}<|assistant|>"""
PARAMETER temperature 0
PARAMETER seed 42
PARAMETER num_thread 1
PARAMETER num_ctx 4096
`

var (
	parallelOnce sync.Once
	parallelW    *world
	parallelErr  error
)

// setupParallel returns a second ollama serve, OLLAMA_NUM_PARALLEL=2,
// serving bigModel, started on the first call.
func setupParallel(t *testing.T) *world {
	t.Helper()
	bin := testtool.Need(t, "ollama")
	parallelOnce.Do(func() {
		parallelW, parallelErr = start(bin, engineSpec{parallel: 2, model: bigModel, modelfile: bigModelfile})
	})
	if parallelErr != nil {
		t.Fatalf("starting ollama (2 sequences): %v", parallelErr)
	}
	return parallelW
}

// generated is what Ollama says of a non-streamed /api/generate.
type generated struct {
	PromptEvalCount    int   `json:"prompt_eval_count"`
	PromptEvalDuration int64 `json:"prompt_eval_duration"`
	EvalCount          int   `json:"eval_count"`
	EvalDuration       int64 `json:"eval_duration"`
}

func generate(t *testing.T, base, prompt string, predict int) generated {
	t.Helper()
	g, err := generateErr(base, prompt, predict)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// generateErr is generate for another goroutine than the test's.
func generateErr(base, prompt string, predict int) (generated, error) {
	var g generated
	body, _ := json.Marshal(map[string]any{"model": modelName, "prompt": prompt, "stream": false,
		"options": map[string]any{"num_predict": predict, "seed": seed}})
	resp, err := http.Post(base+"/api/generate", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return g, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&g); err != nil || resp.StatusCode != 200 {
		return g, fmt.Errorf("/api/generate: %d %v", resp.StatusCode, err)
	}
	return g, nil
}

// text is n bytes of lowercase text from a seed: different seeds share
// no prefix, so that Ollama's prompt cache never serves one for another.
func text(seedChar byte, n int) string {
	b := make([]byte, n)
	x := uint32(seedChar)*2654435761 + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = "abcdefghijklmnopqrstuvwxyz "[x>>24%27]
	}
	b[0] = seedChar
	return string(b)
}

// causesRec is the part of a record the slow-cause tests read.
type causesRec struct {
	ID           string    `json:"id"`
	Start        time.Time `json:"start"`
	Traffic      string    `json:"traffic"`
	OutputTokens *int      `json:"output_tokens"`
	InputTokens  *int      `json:"input_tokens"`
	TTFTms       *float64  `json:"ttft_ms"`
	Stalls       int       `json:"stalls"`
	Causes       []struct {
		What, Cause, Ref string
		Ms               float64
		AtMs             float64 `json:"at_ms"`
	} `json:"causes"`
}

// causesRecords waits (30 s at most) for n live records and returns them.
func causesRecords(t *testing.T, s *sidecar, n int) []causesRec {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(s.records)
		var out []causesRec
		for _, line := range strings.Split(string(b), "\n") {
			var r causesRec
			if json.Unmarshal([]byte(line), &r) == nil && r.Traffic == "live" {
				out = append(out, r)
			}
		}
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live records after 30 s, want %d", len(out), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streamGenerate sends a streamed /api/generate through base and returns
// a reader positioned after its first token line.
func streamGenerate(t *testing.T, base, prompt string, predict int) (*bufio.Reader, io.Closer) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": modelName, "prompt": prompt, "stream": true,
		"options": map[string]any{"num_predict": predict, "seed": seed}})
	resp, err := http.Post(base+"/api/generate", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before a token: %v", err)
		}
		if strings.Contains(line, `"response":"`) && !strings.Contains(line, `"response":""`) {
			return br, resp.Body
		}
	}
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokentap.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSlowCausesPrefillInterference(t *testing.T) {
	w := setupParallel(t)
	// This machine's engine: a long prompt's prefill, and a decode step.
	const longBytes = 2600 // a body over cause.LongMinBytes
	cal := generate(t, w.ollama, text('Q', longBytes), 1)
	dec := generate(t, w.ollama, "a short question", 64)
	if cal.PromptEvalCount < 1000 || dec.EvalCount < 2 {
		t.Fatalf("calibration: %+v %+v", cal, dec)
	}
	perPrompt := time.Duration(cal.PromptEvalDuration / int64(cal.PromptEvalCount))
	batch := time.Duration(min(512, cal.PromptEvalCount)) * perPrompt // the least prompt work one step can carry
	step := time.Duration(dec.EvalDuration / int64(dec.EvalCount))
	prefill := time.Duration(cal.PromptEvalDuration)
	// The stall threshold: the geometric mean of a decode step (with room
	// for the HTTP path: at least 5 ms) and a prefill batch.
	floor := max(step, 5*time.Millisecond)
	threshold := time.Duration(math.Sqrt(float64(floor) * float64(batch)))
	t.Logf("calibration: prefill %v for %d tokens (%v a token, %v a 512-token batch), decode %v a token: stall threshold %v",
		prefill, cal.PromptEvalCount, perPrompt, batch, step, threshold)
	if batch < 10*floor {
		t.Fatalf("a prefill batch (%v) is not 10 times a decode step (%v): the two cannot be told apart on this machine", batch, floor)
	}
	s := startSidecar(t, w, "--config", writeConfig(t, fmt.Sprintf("slo:\n  stall_threshold: %s\n", threshold)))
	for i := range 6 { // the typical prompt: short
		generate(t, s.proxy, fmt.Sprintf("warm up %d", i), 2)
	}
	// A streams long enough to outlast the long prompt's prefill twice.
	predict := min(3000, int(2*prefill/step)+200)
	a, aBody := streamGenerate(t, s.proxy, "a short question", predict)
	done := make(chan error, 1)
	go func() {
		_, err := generateErr(s.proxy, text('L', longBytes), 2)
		done <- err
	}()
	io.Copy(io.Discard, a)
	aBody.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs := causesRecords(t, s, 8)
	var A, L *causesRec
	for i := range recs {
		r := &recs[i]
		switch {
		case r.OutputTokens != nil && *r.OutputTokens == predict:
			A = r
		case L == nil || r.Start.After(L.Start):
			// The long request is the last sent (after A's stream
			// began); its record may lack usage when Ollama reports no
			// prompt_eval_count (a prompt it had cached).
			L = r
		}
	}
	if A == nil || L == nil {
		t.Fatalf("records: %+v", recs)
	}
	interfered, other := 0, map[string]int{}
	var explained float64
	for _, c := range A.Causes {
		if c.What == "stall" && c.Cause == "prefill_interference" && c.Ref == L.ID {
			interfered++
			explained += c.Ms
		} else {
			other[c.What+":"+c.Cause]++
		}
	}
	t.Logf("A %s: %d stalls; %d put down to prefill_interference of %s (%.0f ms explained), others %v; L's TTFT %.0f ms",
		A.ID, A.Stalls, interfered, L.ID, explained, other, msOf(L.TTFTms))
	if interfered == 0 {
		t.Fatalf("no stall of A put down to prefill_interference naming the long request %s: causes %+v", L.ID, A.Causes)
	}
}

func TestSlowCausesQueue(t *testing.T) {
	w := setup(t) // one sequence at a time
	short := generate(t, w.ollama, "a short question", 64)
	step := time.Duration(short.EvalDuration / int64(max(short.EvalCount, 1)))
	// slow_ttft: well above a first token that waits for nothing (a short
	// prompt's prefill and one step, at least 50 ms), well below what A
	// keeps B waiting (A runs ten times that).
	slow := max(50*time.Millisecond, 10*(time.Duration(short.PromptEvalDuration)+step))
	predict := min(1900, int(10*slow/max(step, time.Microsecond))+100)
	t.Logf("calibration: decode %v a token, slow_ttft %v, A predicts %d tokens", step, slow, predict)
	s := startSidecar(t, w, "--engine.max-running", "1", "--config", writeConfig(t, fmt.Sprintf("slo:\n  slow_ttft: %s\n", slow)))
	a, aBody := streamGenerate(t, s.proxy, "a first question", predict)
	sent := time.Now()
	done := make(chan error, 1)
	go func() { // streamed: a first token's cause is a stream's
		body, _ := json.Marshal(map[string]any{"model": modelName, "prompt": "a second question", "stream": true,
			"options": map[string]any{"num_predict": 4, "seed": seed}})
		resp, err := http.Post(s.proxy+"/api/generate", "application/json", strings.NewReader(string(body)))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	io.Copy(io.Discard, a)
	aLeft := time.Since(sent)
	aBody.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs := causesRecords(t, s, 2)
	var A, B *causesRec
	for i := range recs {
		switch r := &recs[i]; {
		case r.OutputTokens != nil && *r.OutputTokens == predict:
			A = r
		case r.OutputTokens != nil && *r.OutputTokens == 4:
			B = r
		}
	}
	if A == nil || B == nil {
		t.Fatalf("records: %+v", recs)
	}
	t.Logf("B %s: TTFT %.0f ms (A ran %v after B was sent; slow_ttft %v): causes %+v", B.ID, msOf(B.TTFTms), aLeft.Round(time.Millisecond), slow, B.Causes)
	if B.TTFTms == nil || time.Duration(*B.TTFTms*float64(time.Millisecond)) <= slow {
		t.Fatalf("B was not late (TTFT %v ms, slow_ttft %v): the premise failed", msOf(B.TTFTms), slow)
	}
	if len(B.Causes) == 0 || B.Causes[0].What != "ttft" || (B.Causes[0].Cause != "queue" && B.Causes[0].Cause != "long_prefill_ahead") {
		t.Fatalf("B's late first token: causes %+v, want queue or long_prefill_ahead", B.Causes)
	}
	if B.Causes[0].Cause == "queue" && B.Causes[0].Ref != A.ID {
		t.Errorf("queue names %q, want A (%s), whose end freed the sequence", B.Causes[0].Ref, A.ID)
	}
}

func msOf(f *float64) float64 {
	if f == nil {
		return math.NaN()
	}
	return *f
}
