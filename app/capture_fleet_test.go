package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/capture/cli"
	"github.com/tokentap/tokentap/workload"
)

// Two sidecars with one secret file and capture.ids: fleet (issue 37):
// the same prompt gets the same ids in both files, each line names its
// replica (POD_NAME), and the merged trace counts the second replica's
// first request as reused across replicas, its second within: the hand
// computation from what was sent.
func TestCaptureFleetTwoSidecars(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "fleet.key")
	start := func(pod string) (Addrs, string) {
		sub := filepath.Join(dir, pod)
		os.Mkdir(sub, 0o755)
		trace := filepath.Join(sub, "capture.jsonl")
		cfg := filepath.Join(sub, "tokentap.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("capture:\n  file: %s\n  secret_file: %s\n  ids: fleet\n  settle: 100ms\n", trace, secret)), 0o644)
		a, _ := startSidecarEnv(t, "", func(e *Env) {
			e.Getenv = func(k string) string {
				if k == "POD_NAME" {
					return pod
				}
				return ""
			}
		}, "--config", cfg, "--demo=off")
		return a, trace
	}
	a, traceA := start("pod-a")
	b, traceB := start("pod-b")
	body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"question"}]}`, strings.Repeat("policy ", 600))
	send := func(to Addrs) {
		resp, err := http.Post("http://"+to.Proxy+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	read := func(path string, n int) []workload.Request {
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
	send(a)
	la := read(traceA, 1)
	send(b)
	send(b)
	lb := read(traceB, 2)
	if len(la[0].HashIDs) < 2 || !slices.Equal(la[0].HashIDs, lb[0].HashIDs) || !slices.Equal(lb[0].HashIDs, lb[1].HashIDs) {
		t.Fatalf("one prompt, one secret: ids %v, %v, %v", la[0].HashIDs, lb[0].HashIDs, lb[1].HashIDs)
	}
	if la[0].Tokentap.Replica != "pod-a" || lb[0].Tokentap.Replica != "pod-b" || lb[0].Tokentap.IDs != "fleet" {
		t.Errorf("replicas %+v %+v", la[0].Tokentap, lb[0].Tokentap)
	}
	var merged bytes.Buffer
	if _, err := cli.Merge(context.Background(), &merged, []string{traceB, traceA}, nil, cli.MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := cli.Stats(context.Background(), "merged", workload.NewReader(&merged, workload.ReaderOptions{}), cli.StatsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(la[0].HashIDs))
	if rep.Requests != 3 || rep.Reuse.Blocks != 3*n || rep.Reuse.Across != n || rep.Reuse.Within != n || rep.Replicas[0].Name != "pod-a" {
		t.Errorf("merged: %+v %+v, want %d blocks reused across and %d within", rep.Reuse, rep.Replicas, n, n)
	}
}
