package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/pipeline"
)

// bigChat is a chat request body of about n bytes: one long user message,
// then "stream":true last (the Vercel AI SDK's order).
func bigChat(n int) []byte {
	head := `{"model":"m","messages":[{"role":"user","content":"`
	tail := `"}],"max_tokens":4,"stream":true}`
	return []byte(head + strings.Repeat("a", n-len(head)-len(tail)) + tail)
}

// prepareBytes is the heap a proxy allocates to read a request of body
// (its peek, the usage injection, the record), per request.
func prepareBytes(t testing.TB, body []byte) uint64 {
	u, _ := url.Parse("http://127.0.0.1:1")
	p, err := New(Options{Upstream: u, InjectUsage: true, Pipeline: pipeline.New(pipeline.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	const runs = 20
	one := func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		st := &reqState{}
		if _, ok := p.prepare(st, httptest.NewRecorder(), r); !ok || !st.info.Stream {
			t.Fatalf("prepare: %+v", st)
		}
		io.Copy(io.Discard, r.Body)
	}
	one()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		one()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / runs
}

// A 1 MB request body costs about its own size to read, not several
// times it (issue 20, item 8: 8 MB of RSS per request in flight).
func TestPrepareBytesPer1MBRequest(t *testing.T) {
	const n = 1_000_000
	got := prepareBytes(t, bigChat(n))
	t.Logf("%d bytes allocated per 1 MB request (usage injected)", got)
	if got > n*3/2 {
		t.Fatalf("%d bytes allocated to read a %d-byte request, want at most 1.5 times its size", got, n)
	}
}

// BenchmarkProxy1MBRequest is one streamed request with a 1 MB body
// through the proxy, client and engine in the same process: B/op is what
// every side allocated for it.
func BenchmarkProxy1MBRequest(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	p, err := New(Options{Upstream: u, InjectUsage: true})
	if err != nil {
		b.Fatal(err)
	}
	fs := httptest.NewServer(p)
	defer fs.Close()
	body := bigChat(1_000_000)
	c := fs.Client()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		resp, err := c.Post(fs.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
