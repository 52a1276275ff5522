package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// causesRecord is the part of a record line the slow-cause tests read.
type causesRecord struct {
	ID        string  `json:"id"`
	Traffic   string  `json:"traffic"`
	Outcome   string  `json:"outcome"`
	MaxTokens int64   `json:"output_tokens"` // ignore_eos: the max_tokens sent
	TTFTMs    float64 `json:"ttft_ms"`
	Causes    []struct {
		What, Cause, Ref string
		Ms               float64
		AtMs             float64 `json:"at_ms"`
	} `json:"causes"`
}

func readCausesRecords(t *testing.T, path string) []causesRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []causesRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r causesRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Traffic == "live" {
			out = append(out, r)
		}
	}
	return out
}

// chatStream sends a streamed chat request of prompt with max_tokens
// (ignore_eos, so that it runs to max_tokens) and returns its body once
// the headers came.
func chatStream(t *testing.T, proxy, prompt string, maxTokens int) io.ReadCloser {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tokentap-sim", "stream": true, "max_tokens": maxTokens, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := http.Post("http://"+proxy+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.Body
}

// firstContent reads a stream until its first content chunk.
func firstContent(t *testing.T, body io.Reader) *bufio.Reader {
	t.Helper()
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before a token: %v", err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			return br
		}
	}
}

// waitInFlight polls the admin port until n live requests are in flight:
// the sidecar has read them (an observed state, no wall-clock window).
func waitInFlight(t *testing.T, admin string, n int) {
	t.Helper()
	want := fmt.Sprintf(`tokentap_requests_in_flight{gen_ai_operation_name="chat",probe="",traffic="live"} %d`, n)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(scrapeAdmin(t, admin), want) {
		if time.Now().After(deadline) {
			t.Fatalf("never %d requests in flight", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const causesSim = `
simulator:
  max_batch: %d
  max_queue: 100
  kv_capacity_tokens: 200000
  prefill_base: 1ms
  prefill_per_token: 400us
  decode_base: 20ms
  decode_per_seq: 0s
  jitter: 0
  stall_prob: 0
  error_prob: 0
  eos_prob: 0
  multi_token_prob: 0
slo:
  stall_threshold: 400ms
  slow_ttft: 400ms
engine:
  interval: 100ms
`

// Through the sidecar, against the simulator: a long prompt (20 kB, 5,000
// tokens, 2 s of unchunked prefill) arriving while A streams stalls A,
// and the stall is put down to prefill_interference naming the long
// request; B, sent while the long prompt is still in prefill, gets its
// first token late, put down to long_prefill_ahead naming it too.
func TestCausesPrefillAgainstTheSimulator(t *testing.T) {
	a, records := startSimulator(t, fmt.Sprintf(causesSim, 4))
	for i := range 8 { // the typical prompt: short
		b := chatStream(t, a.Proxy, fmt.Sprintf("warm up %d", i), 2)
		io.Copy(io.Discard, b)
		b.Close()
	}
	A := firstContent(t, chatStream(t, a.Proxy, "a short question", 120))
	long := make(chan io.ReadCloser, 1)
	go func() { long <- chatStream(t, a.Proxy, strings.Repeat("long context ", 1600), 3) }()
	waitInFlight(t, a.Admin, 2) // A and the long one
	B := chatStream(t, a.Proxy, "another short question", 5)
	io.Copy(io.Discard, B)
	B.Close()
	io.Copy(io.Discard, A)
	L := <-long
	io.Copy(io.Discard, L)
	L.Close()

	recs := waitRecords(t, records, 11)
	var idA, idL, idB int = -1, -1, -1
	for i, r := range recs {
		switch r.MaxTokens {
		case 120:
			idA = i
		case 3:
			idL = i
		case 5:
			idB = i
		}
	}
	if idA < 0 || idL < 0 || idB < 0 {
		t.Fatalf("records %+v", recs)
	}
	lid := recs[idL].ID
	found := false
	for _, c := range recs[idA].Causes {
		if c.What == "stall" && c.Cause == "prefill_interference" && c.Ref == lid && c.Ms >= 400 {
			found = true
		}
	}
	if !found {
		t.Errorf("A's causes %+v: no stall put down to prefill_interference of %s", recs[idA].Causes, lid)
	}
	if cs := recs[idB].Causes; len(cs) == 0 || cs[0].What != "ttft" || cs[0].Cause != "long_prefill_ahead" || cs[0].Ref != lid {
		t.Errorf("B (TTFT %v ms): causes %+v, want its first token put down to long_prefill_ahead of %s", recs[idB].TTFTMs, cs, lid)
	}
	// The counter: the same events, by cause.
	m := scrapeAdmin(t, a.Admin)
	for _, w := range []string{`what="stall"} `, `cause="prefill_interference"`, `cause="long_prefill_ahead"`} {
		if !strings.Contains(m, w) {
			t.Errorf("/metrics lacks tokentap_slow_total with %s", w)
		}
	}
	for _, w := range []string{`tokentap_slow_total{cause="prefill_interference",gen_ai_request_model="tokentap-sim",traffic="live",what="stall"} `,
		`tokentap_slow_total{cause="long_prefill_ahead",gen_ai_request_model="tokentap-sim",traffic="live",what="ttft"} `} {
		if i := strings.Index(m, w); i < 0 || strings.HasPrefix(m[i+len(w):], "0\n") {
			t.Errorf("/metrics: %s not counted", w)
		}
	}
}

// With one sequence at a time, B sent while A streams waits for A's
// end: its late first token is put down to the queue, naming the
// request whose end freed the sequence.
func TestCausesQueueAgainstTheSimulator(t *testing.T) {
	a, records := startSimulator(t, fmt.Sprintf(causesSim, 1))
	A := firstContent(t, chatStream(t, a.Proxy, "a short question", 60))
	B := chatStream(t, a.Proxy, "another short question", 5) // returns at B's first token: after A's end
	io.Copy(io.Discard, A)
	io.Copy(io.Discard, B)
	B.Close()
	recs := waitRecords(t, records, 2)
	ids := map[string]bool{}
	var b *causesRecord
	for i, r := range recs {
		ids[r.ID] = true
		if r.MaxTokens == 5 {
			b = &recs[i]
		}
	}
	if b == nil {
		t.Fatalf("records %+v", recs)
	}
	if len(b.Causes) == 0 || b.Causes[0].Cause != "queue" || !ids[b.Causes[0].Ref] {
		t.Errorf("B (TTFT %v ms): causes %+v, want queue naming the request that freed the sequence", b.TTFTMs, b.Causes)
	}
}

// waitRecords waits until the records file holds n live records (the
// end stages run after the client's response).
func waitRecords(t *testing.T, path string, n int) []causesRecord {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		recs := readCausesRecords(t, path)
		if len(recs) >= n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live records, want %d", len(recs), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
