package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
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

// chatUsage is the Chat Completions API's usage request, whose members
// strip mode looks for.
var chatUsage = stream.APIChat.Request.Usage

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
	_, q := realPipeline().Begin(context.Background(), rec, pipeline.Start{Key: record.Key{API: stream.NameChat, Model: "m", Traffic: "live"}})
	rec.API = stream.NameChat
	return &reqState{rec: rec, obs: q, clock: record.SystemClock{}, info: requestInfo{API: stream.APIChat}}
}

// expectStripped frames the whole input at once and removes every complete
// usage-only event: what a client must receive in strip mode.
func expectStripped(in []byte) []byte { return expectStrippedUntil(in, -1, nil) }

// expectStrippedUntil is expectStripped for a strip mode that gave up at
// stream offset until (-1: never): events starting there or later are
// forwarded as they are; so are the events starting at the offsets in
// passed (forwarded for their size, strip_overflow). A usage-only event
// is cut after its leading comment lines, unless its first data line
// begins a content chunk.
func expectStrippedUntil(in []byte, until int64, passed map[int64]bool) []byte {
	var f stream.Framer
	var out []byte
	last := int64(0)
	cut := func(e *stream.Event) {
		var c stream.Chunk
		if !e.HasData || e.Partial || (until >= 0 && e.Start >= until) || passed[e.Start] {
			return
		}
		stream.ParseOpenAI(e.Data, &c)
		first, _, _ := bytes.Cut(e.Data, []byte("\n"))
		switch {
		case c.UsageOnly() && !contentPrefix(chatUsage, first):
			from := e.Start + int64(commentPrefix(in[e.Start:e.End], false, e.Start == 0))
			out = append(out, in[last:from]...)
			last = e.End
		case (addedUsage(&c) || (c.Choices > 0 && topLevelNull(e.Data, "usage"))) && bytes.Contains(e.Data, []byte(`"usage"`)) && !bytes.Contains(e.Data, []byte("\n")):
			// a usage member (a count, or null) on a content chunk: only
			// the member goes
			raw := in[e.Start:e.End]
			off, ok := dataOffset(raw, e.Start == 0)
			s, end, ok2 := stream.MemberSpan(e.Data, "usage")
			if ok && ok2 {
				at := e.Start + int64(off)
				out = append(out, in[last:at+int64(s)]...)
				last = at + int64(end)
			}
		}
	}
	f.Feed(in, cut)
	f.Finish(cut)
	return append(out, in[last:]...)
}

// topLevelNull reports, with encoding/json (independently of the tap's
// scanner), whether data is an object whose member key is null.
func topLevelNull(data []byte, key string) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(data, &m) == nil && string(m[key]) == "null"
}

// singleLFAt is where strip mode must give up for single-LF framing: the
// start of the first event (whole-input framing, a partial one at the end
// included) whose data has a second line after a first that is a whole
// JSON object; -1 if none.
func singleLFAt(in []byte) int64 {
	var f stream.Framer
	at := int64(-1)
	see := func(e *stream.Event) {
		if at >= 0 || !e.HasData {
			return
		}
		first, _, multi := bytes.Cut(e.Data, []byte("\n"))
		if multi && len(first) > 0 && first[0] == '{' && (json.Valid(first) || contentPrefix(chatUsage, first)) {
			at = e.Start
		}
	}
	f.Feed(in, see)
	f.Finish(see)
	return at
}

func runStrip(in []byte, sizes []int, buf int) []byte {
	out, _ := runStripTap(in, sizes, buf, nil)
	return out
}

// runStripTap reads the whole input through a strip-mode tap, reads of
// the given sizes (cycled) into a buffer of buf bytes, and calls check
// after every Read.
func runStripTap(in []byte, sizes []int, buf int, check func(*tap)) ([]byte, *tap) {
	st := newTestState()
	tp := newTap(&chunkReader{data: in, sizes: sizes}, st, bodySSE, stream.FormatOpenAI, true, 1<<20)
	st.tap = tp
	var out []byte
	p := make([]byte, buf)
	for {
		n, err := tp.Read(p)
		out = append(out, p[:n]...)
		if check != nil {
			check(tp)
		}
		if err != nil {
			break
		}
	}
	tp.Close()
	return out, tp
}

// floodInput expands an input that starts with 0xFF (never in UTF-8
// text), "\xFF" head "\xFF" unit "\xFF" tail, into head, unit repeated
// until the whole passes stripHoldMax, and tail: small inputs that reach
// strip_overflow, cheap for the fuzzer to mutate and minimize.
func floodInput(in []byte) []byte {
	if len(in) == 0 || in[0] != 0xFF {
		return in
	}
	head, rest, _ := bytes.Cut(in[1:], []byte{0xFF})
	unit, tail, _ := bytes.Cut(rest, []byte{0xFF})
	out := append([]byte(nil), head...)
	for len(unit) > 0 && len(out) <= stripHoldMax+len(unit) {
		out = append(out, unit...)
	}
	return append(out, tail...)
}

func FuzzTapStrip(f *testing.F) {
	usage := `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`
	tok := `data: {"choices":[{"delta":{"content":"a"}}]}`
	for _, s := range []string{
		tok + "\n\n" + usage + "\n\ndata: [DONE]\n\n",
		usage + "\r\n\r\ndata: [DONE]\r\n\r\n",
		usage + "\r\r" + usage + "\r\r",
		": ping\n\n" + usage + "\n\n\n\ndata: x\n\n",
		usage + "\n",
		// comment floods without a blank line (floodInput): past
		// stripHoldMax strip mode gives up
		"\xFF\xFF: comment\n\xFF" + usage + "\n\n",
		"\xFF" + usage + "\n\n\xFF: comment\n\xFF\n" + usage + "\n\n",
		"\xFF" + usage + "\r\n\r\n\xFF: comment\r\n\xFF\r\n" + usage + "\r\n\r\n",
		"\xFF" + tok + "\n\xFF: comment\n\xFF\n" + usage + "\n\n",
		"\xFF\xFFx\xFF\n\n" + usage + "\n\n", // one long line
		strings.Repeat(": comment\n", 100) + "\n" + usage + "\n\n",
		// single-LF framing
		tok + "\n" + tok + "\n" + usage + "\ndata: [DONE]\n",
		tok + "\r\n" + tok + "\r\n" + usage + "\r\ndata: [DONE]\r\n",
		tok + "\r" + usage + "\r" + "data: [DONE]\r",
		usage + "\n" + "data: [DONE]\n",
		tok + "\n\n" + usage + "\n\n" + tok + "\n" + tok + "\n\n" + usage + "\n\n",
		tok + "\n: ping\nevent: x\n\n" + usage + "\n\n",
		"data: {\"a\":\n" + "data: 1}\n\n" + usage + "\n\n", // multi-line JSON: SSE, still stripped
		"\xEF\xBB\xBF" + tok + "\ndata: [DONE]\n",
		// usage members on content chunks (Ollama's completions under
		// include_usage): only the member is cut
		`data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":0,"completion_tokens":0}}` + "\n\n" + usage + "\n\ndata: [DONE]\n\n",
		"\xEF\xBB\xBFdata:{\"usage\":{\"completion_tokens\":1},\"choices\":[{}]}\r\n\r\n",
		`data: {"choices":[{"text":"a"}],"usage":null}` + "\n\n",
		"data: {\"choices\":[{\"text\":\"a\"}],\ndata: \"usage\":{\"completion_tokens\":3}}\n\n",
	} {
		f.Add([]byte(s), []byte{1, 5, 2}, uint8(3))
		f.Add([]byte(s), []byte{200, 255, 37}, uint8(255))
	}
	f.Fuzz(func(t *testing.T, in []byte, sizes []byte, buf uint8) {
		flood := len(in) > 0 && in[0] == 0xFF
		in = floodInput(in)
		sz := make([]int, len(sizes))
		for i, s := range sizes {
			sz[i] = int(s)
			if s >= 128 { // some reads of up to 32 KiB
				sz[i] = (int(s) - 127) * 256
			}
			if flood { // fewer reads of 64 KiB and more: minimizing stays quick
				sz[i] = sz[i]*67 + 1
			}
		}
		bufLen := int(buf)%64 + 1
		if buf >= 192 {
			bufLen = 32 << 10
		}
		passed := map[int64]bool{} // events forwarded for their size
		got, tp := runStripTap(in, sz, bufLen, func(tp *tap) {
			if tp.ls.passed {
				passed[tp.ls.ev] = true
			}
		})
		rec := tp.st.rec
		until := singleLFAt(in)
		switch rec.TapFailed {
		case "":
			if until >= 0 || tp.gaveUpAt >= 0 || len(passed) > 0 {
				t.Fatalf("in %q: no give-up recorded, single-LF at %d, gave up at %d, passed %v", in, until, tp.gaveUpAt, passed)
			}
		case "single_lf_framing":
			if tp.gaveUpAt != until {
				t.Fatalf("in %q: gave up at %d, single-LF framing starts at %d", in, tp.gaveUpAt, until)
			}
		case "strip_overflow":
			// An event passed for its size is never given up on: single-LF
			// framing found in it is forwarded with it.
			if len(passed) == 0 || len(in) <= stripHoldMax || (tp.gaveUpAt >= 0 && tp.gaveUpAt != until) || (tp.gaveUpAt < 0 && until >= 0 && !passed[until]) {
				t.Fatalf("in %q: strip_overflow, passed %v, gave up at %d (single-LF at %d)", in, passed, tp.gaveUpAt, until)
			}
			until = tp.gaveUpAt
		default:
			t.Fatalf("in %q: tap failed: %s", in, rec.TapFailed)
		}
		want := expectStrippedUntil(in, until, passed)
		if !bytes.Equal(got, want) {
			t.Fatalf("in %q sizes %v buf %d:\n got %q\nwant %q", in, sz, bufLen, got, want)
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
		tp := newTap(&loopReader{ev: ev}, st, bodySSE, stream.FormatOpenAI, strip, 1<<20)
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
