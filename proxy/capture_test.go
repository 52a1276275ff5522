package proxy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/prefix"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// With the workload capture and its live reuse on, a token event still
// allocates nothing: the capture has no per-event step (it hashes the
// prompt when the request ends), and that end writes the request's line
// and counts its blocks' reuse.
func TestTapZeroAllocsPerEventWithCapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	c, err := capture.Open(capture.Options{Path: path, Secret: bytes.Repeat([]byte{1}, 32), Reuse: &prefix.Options{Window: time.Hour, Sizes: []int{16}}})
	if err != nil {
		t.Fatal(err)
	}
	m := exporter.New(exporter.Config{})
	pipe := pipeline.New(pipeline.Options{Live: m, Prometheus: m, Capture: c})
	rec := record.New(8192)
	rec.Arrive, rec.API = time.Now(), stream.NameChat
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"stream":true}`)
	_, q := pipe.Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}, Prompt: body})
	st := &reqState{rec: rec, obs: q, clock: record.SystemClock{}}
	ev := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")
	tp := newTap(&loopReader{ev: ev}, st, bodySSE, stream.FormatOpenAI, false, 1<<20)
	p := make([]byte, 32<<10)
	for range 100 {
		tp.Read(p)
	}
	if n := testing.AllocsPerRun(1000, func() { tp.Read(p) }); n != 0 {
		t.Errorf("%.2f allocations per token event with the capture on", n)
	}
	rec.Outcome, rec.Terminal, rec.InputTokens, rec.OutputTokens, rec.TokenSource = record.Success, time.Now(), 4, int64(rec.TokenEvents()), "events"
	q.End(rec, nil)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.HasPrefix(b, []byte(`{"timestamp":0,"input_length":4,`)) {
		t.Errorf("capture line %q", b)
	}
	if st := c.Stats().Reuse; st.Requests != 1 || st.Blocks != 1 {
		t.Errorf("the live reuse counted %+v", st)
	}
}
