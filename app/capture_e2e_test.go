package app

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/workload"
)

// The sidecar with --capture in front of its simulator: one trace line
// per live request, the secret generated 0600 beside it, the capture's
// counters on /metrics, and SIGHUP after a rotation starting a new file
// at timestamp 0.
func TestCaptureEndToEnd(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "capture.jsonl")
	hup := make(chan os.Signal)
	cfgFile := filepath.Join(dir, "tokentap.yaml")
	os.WriteFile(cfgFile, []byte(fmt.Sprintf("capture:\n  file: %s\n  settle: 100ms\n  session_header: X-Session-Id\n", trace)), 0o644)
	a, _ := startSidecarEnv(t, "", func(e *Env) { e.Hangup = hup }, "--config", cfgFile)
	send := func(i int) {
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"question %d"}]}`, strings.Repeat("policy ", 400), i)
		req, _ := http.NewRequest(http.MethodPost, "http://"+a.Proxy+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-Id", fmt.Sprintf("s%d", i%2))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	wait := func(path string, n int) []workload.Request {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r, c, err := workload.Open(path, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []workload.Request
			for {
				q, err := r.Next()
				if err != nil {
					break
				}
				got = append(got, q)
			}
			c.Close()
			if len(got) >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d lines, want %d", path, len(got), n)
			}
		}
	}
	for i := range 4 {
		send(i)
	}
	got := wait(trace, 4)
	for i, l := range got {
		if l.Tokentap == nil || l.Tokentap.Outcome != "success" || l.OutputLength < 1 || l.OutputLength > 8 || int64(len(l.HashIDs)) != (l.InputLength+511)/512 || l.SessionID == "" {
			t.Errorf("line %d: %+v %+v", i+1, l.Entry, l.Tokentap)
		}
	}
	if got[0].Timestamp != 0 || got[0].HashIDs[0] != got[1].HashIDs[0] || got[0].SessionID == got[1].SessionID || got[0].SessionID != got[2].SessionID {
		t.Errorf("lines %+v", got)
	}
	st, err := os.Stat(filepath.Join(dir, ".tokentap-capture.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("secret file: %v %v", err, st)
	}
	resp, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"tokentap_capture_lines_written_total 4", `tokentap_capture_dropped_total{reason="late"} 0`, "tokentap_capture_held 0"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	// Rotation: the new file starts at 0 again.
	time.Sleep(50 * time.Millisecond)
	if err := os.Rename(trace, trace+".1"); err != nil {
		t.Fatal(err)
	}
	hup <- syscall.SIGHUP
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(trace); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reopen the capture file")
		}
	}
	send(5)
	if got := wait(trace, 1); got[0].Timestamp != 0 || got[0].HashIDs[0] != 0 {
		t.Errorf("after rotation: %+v", got[0].Entry)
	}
}
