package cli

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// The acceptance line of issue 37: a scripted workload with known
// sharing (3 system prompts shared by everyone, 30 conversations of 3
// turns, each turn's prompt its conversation so far) through two
// captures with one secret and fleet ids, the turns of a conversation
// alternating between the replicas (no affinity); the two files merged;
// the merged trace's reuse within and across replicas equal to the hand
// computation from the workload's structure.
//
// Blocks are 16 tokens of 4 bytes: 64 bytes of canonical prompt
// ("prompt", NUL, the JSON string, NUL). Each piece of a prompt fills
// whole blocks: the system prompt 2 (its 120 characters after the 8
// bytes before the text), each user turn and answer 1, and a last block
// of the request's own (62 characters and the 2 bytes after). So turn t
// of a conversation under system s is 2t + 2 blocks, and it shares with
// an earlier request: nothing under another system; the 2 system blocks
// with another conversation; 2t' + 1 with its own turn t' < t (system,
// then t' user turns and t'-1 answers, then t' 's own last block).
func TestFleetMergeAcrossReplicas(t *testing.T) {
	piece := func(tag string, n int) string { return (tag + strings.Repeat(".", n))[:n] }
	type req struct {
		at         time.Time
		sys, conv  int
		turn, repl int
		prompt     string
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var reqs []req
	for c := range 30 {
		for turn := 1; turn <= 3; turn++ {
			s := c % 3
			p := piece(fmt.Sprintf("system-%d", s), 120)
			for k := 1; k < turn; k++ {
				p += piece(fmt.Sprintf("user-%d-%d", c, k), 64) + piece(fmt.Sprintf("answer-%d-%d", c, k), 64)
			}
			p += piece(fmt.Sprintf("user-%d-%d", c, turn), 64) + piece(fmt.Sprintf("own-%d-%d", c, turn), 62)
			at := t0.Add(time.Duration(c)*10*time.Millisecond + time.Duration(turn-1)*time.Second)
			reqs = append(reqs, req{at: at, sys: s, conv: c, turn: turn, repl: (c + turn) % 2, prompt: p})
		}
	}
	// Arrival order (turn 2 of conversation 0 at 1 s comes after
	// conversation 29's first turn at 290 ms).
	for i := 1; i < len(reqs); i++ {
		for j := i; j > 0 && reqs[j].at.Before(reqs[j-1].at); j-- {
			reqs[j], reqs[j-1] = reqs[j-1], reqs[j]
		}
	}
	// The hand computation, from the structure alone.
	common := func(x, y req) int {
		switch {
		case x.sys != y.sys:
			return 0
		case x.conv != y.conv:
			return 2
		}
		return 2*min(x.turn, y.turn) + 1
	}
	var blocks, reused, within int
	for i, x := range reqs {
		blocks += 2*x.turn + 2
		any, own := 0, 0
		for _, y := range reqs[:i] {
			any = max(any, common(x, y))
			if y.repl == x.repl {
				own = max(own, common(x, y))
			}
		}
		reused += any
		within += own
	}
	across := reused - within

	dir := t.TempDir()
	secret := bytes.Repeat([]byte("fleet-secret-"), 4)
	var caps [2]*capture.Capture
	var files []string
	for i := range caps {
		path := filepath.Join(dir, fmt.Sprintf("pod-%d.jsonl", i))
		c, err := capture.Open(capture.Options{Path: path, Secret: secret, BlockTokens: 16, BytesPerToken: 4, Fleet: true, Replica: fmt.Sprintf("pod-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		caps[i], files = c, append(files, path)
	}
	for _, x := range reqs {
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4}`, x.prompt)
		r := record.New(0)
		r.Arrive, r.API, r.Outcome, r.OutputTokens, r.TokenSource = x.at, stream.NameCompletions, record.Success, 4, "usage"
		r.InputTokens = int64(len(x.prompt)+10) / 4 // the canonical prompt's bytes / 4: whole blocks
		r.Terminal = x.at.Add(time.Second)
		caps[x.repl].Track(capture.Request{Arrive: x.at, API: stream.NameCompletions, Body: []byte(body)}).End(r, "m")
	}
	for _, c := range caps {
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(dir, "merged.jsonl")
	if _, stderr, err := run(append([]string{"merge", "-o", merged}, files...)...); err != nil || stderr != "" {
		t.Fatalf("merge: %v %s", err, stderr)
	}
	rep := statsJSON(t, merged)
	t.Logf("hand: %d blocks, %d reused: %d within a replica, %d across; merged trace: %+v", blocks, reused, within, across, rep.Reuse)
	if rep.Requests != 90 || rep.Reuse.Blocks != int64(blocks) || rep.Reuse.Reused != int64(reused) || rep.Reuse.Within != int64(within) || rep.Reuse.Across != int64(across) || across == 0 {
		t.Errorf("merged trace %+v, want %d blocks, %d reused, %d within, %d across", rep.Reuse, blocks, reused, within, across)
	}
	if len(rep.Replicas) != 2 || rep.Replicas[0].Name != "pod-0" || rep.Replicas[1].Name != "pod-1" || rep.Replicas[0].Requests != 45 {
		t.Errorf("replicas %+v", rep.Replicas)
	}
	// Each replica's own file, alone, sees only its within-replica reuse.
	var alone int64
	for _, f := range files {
		alone += statsJSON(t, f).Reuse.Reused
	}
	if alone != int64(within) {
		t.Errorf("the files alone reuse %d blocks, want %d (within)", alone, within)
	}
}
