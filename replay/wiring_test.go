package replay

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// answerAnything is an engine that answers every POST with one token
// event, whatever the API (what the tests below count is not the answer).
func answerAnything(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost { // the reachability check
		return
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
}

// The replay builds its proxy once per engine kind its lines' APIs
// imply, not once per request (issue 34, one wiring): 8 lines of three
// APIs, two of which imply no engine (chat, messages) and one TGI
// (tgi_generate), are sent through 2 proxies, each line recorded.
func TestReplayOneProxyPerEngine(t *testing.T) {
	target, _ := url.Parse(loopback(t, http.HandlerFunc(answerAnything)))
	var trace strings.Builder
	for i, api := range []string{stream.NameChat, stream.NameMessages, stream.NameTGIGenerate, stream.NameChat,
		stream.NameMessages, stream.NameTGIGenerate, stream.NameChat, stream.NameChat} {
		trace.WriteString(traceLine(int64(i), 20, 1, nil, &workload.Meta{API: api, Model: "m", Stream: true}))
	}
	r := New(Options{Trace: writeFile(t, "trace.jsonl", trace.String()), Target: target, Stream: true})
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Steps[0]; s.Sent != 8 || s.Answered+sum(s.Failed) != 8 || s.Failed["error/not_recorded"] != 0 {
		t.Fatalf("not every line sent and recorded: %s", describe(s))
	}
	if len(r.proxies) != 2 {
		t.Fatalf("%d proxies for 8 requests of engine kinds \"\" and %q: want 2", len(r.proxies), stream.EngineTGI)
	}
	for kind, p := range r.proxies {
		if p.err != nil || p.px == nil {
			t.Errorf("engine %q: proxy %v, %v", kind, p.px, p.err)
		}
	}
}

// The replay's stages are the sidecar's (app.NewStages), tenants
// included (they were missing when replay wired its own): with the
// tenant taken from the API key, every replayed record names the
// key's hashed tenant, never the key, as a live record would.
func TestReplayWiredAsTheSidecar(t *testing.T) {
	url := loopback(t, http.HandlerFunc(answerAnything))
	cfg := writeFile(t, "tokentap.yaml", "tenant:\n  from: api_key\n  hash_key: 0123456789abcdef0123\n")
	var trace strings.Builder
	for i := range 3 {
		trace.WriteString(traceLine(int64(i), 20, 1, nil, &workload.Meta{API: stream.NameChat, Model: "m", Stream: true}))
	}
	recs := filepath.Join(t.TempDir(), "records.jsonl")
	const key = "sk-replay-tenant-key"
	var out, errb bytes.Buffer
	err := Main(t.Context(), []string{"--trace", writeFile(t, "trace.jsonl", trace.String()), "--target", url, "--config", cfg,
		"--api-key-env", "KEY", "--records", recs},
		Env{Getenv: func(name string) string { return map[string]string{"KEY": key}[name] }, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errb.String())
	}
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(key)) {
		t.Fatal("the API key is in the records")
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	tenants := map[string]int{}
	for _, l := range lines {
		var r struct {
			Tenant string `json:"tenant"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		tenants[r.Tenant]++
	}
	if len(lines) != 3 || len(tenants) != 1 {
		t.Fatalf("%d records, tenants %v: want 3 of one tenant", len(lines), tenants)
	}
	for tn := range tenants {
		if !strings.HasPrefix(tn, "t-") {
			t.Fatalf("tenant %q: want the API key's hashed tenant (t-…)", tn)
		}
	}
}
