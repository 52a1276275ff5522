package proxy

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// chunkReader returns its data in reads of the given sizes (cycled).
type chunkReader struct {
	data  []byte
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = c.sizes[c.i%len(c.sizes)]
		c.i++
	}
	n = max(1, min(n, len(p), len(c.data)))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

func newTestState() *reqState { return realState(16) }

// realPipeline is a pipeline with the real Prometheus backend, live and
// at the end, shared by the tests of this package.
var realPipeline = sync.OnceValue(func() *pipeline.Pipeline {
	m := exporter.New(exporter.Config{})
	return pipeline.New(pipeline.Options{Live: m, Models: m.Models(), Prometheus: m})
})

// realState is a request in flight through the real exporters, as the
// proxy starts one.
func realState(hint int) *reqState {
	rec := record.New(hint)
	rec.Arrive = time.Now()
	_, q := realPipeline().Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: record.APIChat, Model: "m", Traffic: "live"}})
	return &reqState{rec: rec, obs: q, clock: record.SystemClock{}}
}

// expectStripped frames the whole input at once and removes every complete
// usage-only event: what a client must receive in strip mode.
func expectStripped(in []byte) []byte {
	var f stream.Framer
	var out []byte
	last := int64(0)
	cut := func(e *stream.Event) {
		var c stream.Chunk
		if !e.HasData || e.Partial {
			return
		}
		stream.ParseOpenAI(e.Data, &c)
		if c.UsageOnly() {
			out = append(out, in[last:e.Start]...)
			last = e.End
		}
	}
	f.Feed(in, cut)
	f.Finish(cut)
	return append(out, in[last:]...)
}

func runStrip(in []byte, sizes []int, buf int) []byte {
	st := newTestState()
	tp := newTap(&chunkReader{data: in, sizes: sizes}, st, bodySSE, true, 1<<20)
	st.tap = tp
	var out []byte
	p := make([]byte, buf)
	for {
		n, err := tp.Read(p)
		out = append(out, p[:n]...)
		if err != nil {
			break
		}
	}
	tp.Close()
	return out
}

func FuzzTapStrip(f *testing.F) {
	usage := `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`
	for _, s := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" + usage + "\n\ndata: [DONE]\n\n",
		usage + "\r\n\r\ndata: [DONE]\r\n\r\n",
		usage + "\r\r" + usage + "\r\r",
		": ping\n\n" + usage + "\n\n\n\ndata: x\n\n",
		usage + "\n",
	} {
		f.Add([]byte(s), []byte{1, 5, 2}, uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, sizes []byte, buf uint8) {
		sz := make([]int, len(sizes))
		for i, s := range sizes {
			sz[i] = int(s)
		}
		got := runStrip(in, sz, int(buf)%64+1)
		want := expectStripped(in)
		if !bytes.Equal(got, want) {
			t.Fatalf("in %q sizes %v buf %d:\n got %q\nwant %q", in, sizes, int(buf)%64+1, got, want)
		}
	})
}

// Reads of every size over a stream with a usage event in the middle of a
// CRLF stream, a CRLF split across reads included.
func TestTapStripAllSplits(t *testing.T) {
	in := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}` + "\r\n\r\n" + "data: [DONE]\r\n\r\n")
	want := expectStripped(in)
	if bytes.Contains(want, []byte("usage")) {
		t.Fatal("expectStripped kept the usage event")
	}
	for size := 1; size <= len(in); size++ {
		for _, buf := range []int{1, 7, 32 << 10} {
			if got := runStrip(in, []int{size}, buf); !bytes.Equal(got, want) {
				t.Fatalf("reads of %d, buffer %d:\n got %q\nwant %q", size, buf, got, want)
			}
		}
	}
}

// The hot path must not allocate per event in steady state, in either
// mode (the benchmark BenchmarkTapEvent reports the same with timings).
func TestTapZeroAllocsPerEvent(t *testing.T) {
	ev := []byte(`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" x"},"finish_reason":null}]}` + "\n\n")
	for _, strip := range []bool{false, true} {
		st := newTestState()
		tp := newTap(&loopReader{ev: ev}, st, bodySSE, strip, 1<<20)
		p := make([]byte, 32<<10)
		for i := 0; i < 100; i++ {
			tp.Read(p)
		}
		st.rec.Reset()
		if n := testing.AllocsPerRun(500, func() { tp.Read(p) }); n != 0 {
			t.Errorf("strip=%v: %.2f allocations per event", strip, n)
		}
	}
}
