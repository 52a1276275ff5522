package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// seedBlock is the block size of the seed tests: 8 tokens, 8 words.
const seedBlock = 8

// received is what a target got: the text of every chat prompt, by the
// trace line it came from (the request's "seed" member is its line), one
// a step (a step's requests end before the next step's start).
type received struct {
	mu      sync.Mutex
	prompts map[int64][]string
}

// capture wraps h: it keeps each request's prompt text, then serves it.
func (rc *received) capture(t *testing.T, h http.Handler) http.Handler {
	rc.prompts = map[int64][]string{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Seed     int64
			Messages []struct{ Content string }
		}
		if r.URL.Path == "/v1/chat/completions" {
			if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) != 1 {
				t.Errorf("target: %v: %s", err, body)
			} else {
				rc.mu.Lock()
				rc.prompts[req.Seed] = append(rc.prompts[req.Seed], req.Messages[0].Content)
				rc.mu.Unlock()
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// seedTrace is a trace of n lines from timestamp ts0, 10 ms apart: line i
// has the hash ids [i%4, 1000+ts0+i, 100+i%3] and 3 tokens of its own
// after them. Ids 0-3 and 100-102 recur throughout, so that two halves
// of it share them; the middle one is the line's own.
func seedTrace(n int, ts0 int64) (string, [][]int64) {
	var b strings.Builder
	var ids [][]int64
	for i := range n {
		l := []int64{int64(i % 4), 1000 + ts0 + int64(i), 100 + int64(i%3)}
		ids = append(ids, l)
		// 4 tokens for the chat template, 8 a block, 3 of the line's own
		b.WriteString(traceLine(ts0+int64(10*i), ChatOverheadTokens+seedBlock*int64(len(l))+3, 2, l, nil))
	}
	return b.String(), ids
}

// blocks maps each hash id of the trace to the text the target got for
// it in step k, failing if one id got two texts in the step, and gives
// each line's own text (its last 3 words).
func blocks(t *testing.T, ids [][]int64, prompts map[int64][]string, k int) (map[int64]string, map[int64]string) {
	t.Helper()
	if len(prompts) != len(ids) {
		t.Fatalf("the target got prompts of %d lines, the trace has %d", len(prompts), len(ids))
	}
	got, own := map[int64]string{}, map[int64]string{}
	for i, l := range ids {
		line := int64(i + 1)
		if len(prompts[line]) <= k {
			t.Fatalf("line %d: %d prompts, no step %d", line, len(prompts[line]), k)
		}
		w := strings.Fields(prompts[line][k])
		if len(w) != len(l)*seedBlock+3 {
			t.Fatalf("line %d: %d words in %q", line, len(w), prompts[line][k])
		}
		for j, id := range l {
			text := strings.Join(w[j*seedBlock:(j+1)*seedBlock], " ")
			if prev, ok := got[id]; ok && prev != text {
				t.Fatalf("hash id %d got two texts in one step: %q and %q", id, prev, text)
			}
			got[id] = text
		}
		own[line] = strings.Join(w[len(l)*seedBlock:], " ")
	}
	return got, own
}

// replayRun replays trace with args against h, through Main (a process
// of its own: the replay keeps nothing between runs), and returns the
// prompts the target got and the report.
func replayRun(t *testing.T, h http.Handler, trace string, args ...string) (map[int64][]string, string) {
	t.Helper()
	var rc received
	url := loopback(t, rc.capture(t, h))
	stdout, stderr, err := runMain(t, Env{Open: openString(trace)},
		append([]string{"--trace", "trace.jsonl", "--target", url, "--model", "m", "--block-size", fmt.Sprint(seedBlock)}, args...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.prompts, stdout
}

// A trace split in two halves, replayed by two processes given the same
// --seed: every hash id the halves share got the same text from both;
// each line's own text is its own (the halves' line numbers coincide).
// Another seed: none of the shared ids gets the same text. Without
// --seed, the report names the seed drawn.
func TestReplaySeedSplitsATrace(t *testing.T) {
	_, sim := simulator(t, fastSim())
	traceA, idsA := seedTrace(12, 0)
	traceB, idsB := seedTrace(12, 500)
	a, outA := replayRun(t, sim, traceA, "--seed", "42")
	b, _ := replayRun(t, sim, traceB, "--seed", "42")
	c, _ := replayRun(t, sim, traceB, "--seed", "43")
	blocksA, ownA := blocks(t, idsA, a, 0)
	blocksB, ownB := blocks(t, idsB, b, 0)
	blocksC, _ := blocks(t, idsB, c, 0)
	shared := 0
	for id, text := range blocksA {
		tb, ok := blocksB[id]
		if !ok {
			continue
		}
		shared++
		if tb != text {
			t.Errorf("hash id %d, seed 42: %q in one process, %q in the other", id, text, tb)
		}
		if blocksC[id] == text {
			t.Errorf("hash id %d: the same text with seeds 42 and 43: %q", id, text)
		}
	}
	if shared != 7 { // ids 0-3 and 100-102
		t.Fatalf("%d hash ids shared, want 7", shared)
	}
	for line, o := range ownA {
		if ownB[line] == o {
			t.Errorf("line %d of both halves: the same own text %q", line, o)
		}
	}
	if !strings.Contains(outA, "prompt text seed: 42 (--seed 42 sends the same text)") {
		t.Errorf("the report does not name the seed:\n%s", outA)
	}
	if _, out := replayRun(t, sim, traceA); !strings.Contains(out, "prompt text seed: ") || strings.Contains(out, "prompt text seed: 42 ") {
		t.Errorf("without --seed, the report should name a drawn seed:\n%s", out)
	}
}

// A stepped run keeps a salt per step, derived from the seed: the same
// id gets another text in each step, the first step's text is a
// one-step run's with that seed, and a second process given the seed
// repeats every step's.
func TestReplaySeedStepsKeepTheirSalt(t *testing.T) {
	_, sim := simulator(t, fastSim())
	trace, ids := seedTrace(8, 0)
	one, _ := replayRun(t, sim, trace, "--seed", "7")
	first, _ := replayRun(t, sim, trace, "--seed", "7", "--rates", "1,2")
	second, _ := replayRun(t, sim, trace, "--seed", "7", "--rates", "1,2")
	single, _ := blocks(t, ids, one, 0)
	var steps [2][2]map[int64]string
	for k := range 2 {
		steps[0][k], _ = blocks(t, ids, first, k)
		steps[1][k], _ = blocks(t, ids, second, k)
	}
	for id, text := range single {
		if steps[0][0][id] != text {
			t.Errorf("hash id %d: step 1 sent %q, a one-step run %q", id, steps[0][0][id], text)
		}
		if steps[0][1][id] == text {
			t.Errorf("hash id %d: the same text in steps 1 and 2: %q", id, text)
		}
		for k := range 2 {
			if steps[1][k][id] != steps[0][k][id] {
				t.Errorf("hash id %d, step %d: %q in one process, %q in the other", id, k+1, steps[0][k][id], steps[1][k][id])
			}
		}
	}
}
