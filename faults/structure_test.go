//go:build linux

package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// processCPU is the CPU time (user and system, every thread) the
// process pid has used, from /proc/pid/stat (in clock ticks of 10 ms).
func processCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// Hostile schemas against the real sidecar (issue 34: 16 s and 24 s of
// CPU, the client's response held 12 s, 940 MB): a sidecar whose SLO
// requires structure and one without, in the same run, each sent the
// same requests declaring a tool whose parameters are the 62 KB schema
// nested 1,500 levels, then the 3.4 MB schema of 60,000 patterns
// (peek_bytes 8 MiB on both, so that it is read whole): one each that
// sets up connections and series, then five each, in turn. Per request
// the checking sidecar spends at most 50 ms of CPU more than the other
// (measured over the five, from /proc), its client's fastest time to the
// last byte is within the other's slowest (the spread the test measured
// for the same request without the check), the client gets the same
// bytes, and each record says unchecked with the bound.
func TestHostileSchemas(t *testing.T) {
	answer := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"abcdef\":{}}"}}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, answer)
	}))
	defer up.Close()
	dir := t.TempDir()
	start := func(name, slo string) (*sidecar, string) {
		cfg, records := filepath.Join(dir, name+".yaml"), filepath.Join(dir, name+".jsonl")
		if err := os.WriteFile(cfg, []byte("peek_bytes: 8388608\ninject_usage: false\nslo:\n  objectives:\n    - name: agents\n      target: 0.9\n"+slo+"      thresholds:\n        ttft: 1m\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return startSidecar(t, "--upstream", up.URL, "--records", records, "--config", cfg), records
	}
	checked, checkedRecs := start("checked", "      structure: required\n")
	plain, _ := start("plain", "")

	var patterns strings.Builder
	patterns.WriteString(`{"type":"object","properties":{`)
	for i := range 60000 {
		if i > 0 {
			patterns.WriteByte(',')
		}
		fmt.Fprintf(&patterns, `"p%d":{"type":"string","pattern":"^[a-z]{%d}[0-9]x+$"}`, i, i%50+1)
	}
	patterns.WriteString(`}}`)
	deep := strings.Repeat(`{"type":"object","properties":{"abcdef":`, 1500) + "{}" + strings.Repeat("}}", 1500)

	client := &http.Client{}
	// post sends body to s and returns the answer and the time to its
	// last byte; it waits for the request's record (n records in all) so
	// that the check is over before the CPU is read.
	post := func(s *sidecar, body string) ([]byte, time.Duration) {
		t0 := time.Now()
		resp, err := client.Post(s.proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		took := time.Since(t0)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return b, took
	}
	seen := 0
	for _, c := range []struct{ why, schema string }{{"schema_too_deep", deep}, {"schema_too_large", patterns.String()}} {
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":` + c.schema + `}}]}`
		post(checked, body) // the first of each: connections and series set up
		post(plain, body)
		seen++
		waitRecords(t, checkedRecs, seen, 30*time.Second)
		var cpu [2]time.Duration
		fastest, slowest := time.Duration(1<<62), time.Duration(0)
		var want []byte
		for range 5 {
			for i, s := range []*sidecar{plain, checked} {
				before := processCPU(t, s.pid)
				got, took := post(s, body)
				if i == 1 {
					seen++
					waitRecords(t, checkedRecs, seen, 30*time.Second)
					fastest = min(fastest, took)
					if !bytes.Equal(got, want) {
						t.Fatalf("%s: the checked sidecar's client got %q, the other's %q", c.why, got, want)
					}
				} else {
					slowest, want = max(slowest, took), got
				}
				cpu[i] += processCPU(t, s.pid) - before
			}
		}
		if more := (cpu[1] - cpu[0]) / 5; more > 50*time.Millisecond {
			t.Errorf("%s: the check cost %v of CPU a request (%v against %v over five), bound 50ms", c.why, more, cpu[1], cpu[0])
		}
		if fastest > slowest {
			t.Errorf("%s: the checked client's fastest last byte %v, the unchecked's slowest %v", c.why, fastest, slowest)
		}
		t.Logf("%d-byte schema: CPU over five requests %v checked, %v not; last byte fastest %v checked, slowest %v not", len(c.schema), cpu[1], cpu[0], fastest, slowest)
	}
	b, err := os.ReadFile(checkedRecs)
	if err != nil {
		t.Fatal(err)
	}
	var whys []string
	for line := range bytes.SplitSeq(bytes.TrimSpace(b), []byte("\n")) {
		var r struct {
			Outcome   string `json:"outcome"`
			Structure string `json:"structure"`
			Why       string `json:"structure_unchecked"`
		}
		if err := json.Unmarshal(line, &r); err != nil || r.Outcome != "success" || r.Structure != "unchecked" {
			t.Fatalf("record %s (%v): want success, unchecked", line, err)
		}
		whys = append(whys, r.Why)
	}
	if want := strings.Repeat("schema_too_deep ", 6) + strings.TrimSpace(strings.Repeat("schema_too_large ", 6)); strings.Join(whys, " ") != want {
		t.Fatalf("reasons %q, want %q", whys, want)
	}
	if n := checked.metric("tokentap_structure_unchecked_total", "reason", "schema_too_large"); n != 6 {
		t.Errorf("tokentap_structure_unchecked_total{reason=schema_too_large} = %v, want 6", n)
	}
}
