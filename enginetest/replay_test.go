package enginetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReplayAgainstOllama replays a tokentap capture (2-turn
// conversations sharing a system prompt's blocks, Poisson arrivals at
// 5 requests/s) with tokentap replay against the real Ollama, on its
// native chat API and on its OpenAI one: every request is accounted for
// (scheduled = sent + not sent, sent = answered + failed, one record per
// trace line, none lost), and every answer has output_length tokens
// (Ollama's options.num_predict, or max_tokens; the tiny model's greedy
// decode never ends early).
func TestReplayAgainstOllama(t *testing.T) {
	w := setup(t)
	const n = 20
	var b strings.Builder
	ts := 0
	for i := range n {
		ids := []int{0, 100 + i}
		if i%2 == 1 { // the conversation's second turn shares its first's blocks
			ids = []int{0, 100 + i - 1, 200 + i}
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": %s}`+"\n",
			ts, 40+20*len(ids), 4+i%5, strings.ReplaceAll(fmt.Sprint(ids), " ", ","))
		ts += 100 + (i*37)%200 // 5 requests/s on average
	}
	trace := filepath.Join(t.TempDir(), "capture.jsonl")
	if err := os.WriteFile(trace, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, api := range []string{"ollama_chat", "chat"} {
		t.Run(api, func(t *testing.T) {
			recs := filepath.Join(t.TempDir(), "records.jsonl")
			cmd := exec.Command(w.sidecar, "replay", "--trace", trace, "--target", w.ollama, "--api", api, "--model", modelName,
				"--block-size", "20", "--records", recs, "--timeout", "2m")
			cmd.Env = cleanEnv()
			out, err := cmd.Output()
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Logf("report:\n%s", out)
			if err != nil {
				t.Fatalf("tokentap replay: %v\n%s", err, stderr)
			}
			m := regexp.MustCompile(`scheduled (\d+) = sent (\d+) \+ not sent (\d+)`).FindSubmatch(out)
			m2 := regexp.MustCompile(`sent (\d+) = answered (\d+) \+ failed (\d+)`).FindSubmatch(out)
			if m == nil || m2 == nil {
				t.Fatalf("no accounting in the report")
			}
			num := func(b []byte) int { v, _ := strconv.Atoi(string(b)); return v }
			if num(m[1]) != n || num(m[2])+num(m[3]) != n || num(m2[1]) != num(m[2]) || num(m2[2])+num(m2[3]) != num(m2[1]) || num(m2[2]) == 0 {
				t.Errorf("accounting: %s; %s", m[0], m2[0])
			}
			f, err := os.Open(recs)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			lines := map[int]int{}
			sc := bufio.NewScanner(f)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var r struct {
					Traffic      string `json:"traffic"`
					API          string `json:"api"`
					Outcome      string `json:"outcome"`
					OutputTokens *int   `json:"output_tokens"`
					Replay       *struct {
						Line int `json:"line"`
					} `json:"replay"`
				}
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Replay == nil || r.Traffic != "replay" || r.API != api {
					t.Fatalf("record %s: %v", sc.Bytes(), err)
				}
				lines[r.Replay.Line]++
				if want := 4 + (r.Replay.Line-1)%5; r.Outcome == "success" && (r.OutputTokens == nil || *r.OutputTokens != want) {
					t.Errorf("line %d: output tokens %v, want %d", r.Replay.Line, r.OutputTokens, want)
				}
			}
			for l := 1; l <= n; l++ {
				if lines[l] != 1 {
					t.Errorf("line %d has %d records", l, lines[l])
				}
			}
		})
	}
}
