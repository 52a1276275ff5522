package proxy

import (
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/structure"
)

// What the structure checks cost (docs/performance.md, "Structure
// checks"): nothing per token event but the bytes appended, a bounded
// buffer however long the arguments, and per request a parse and a
// schema validation.

// collected is what c holds: answer text and arguments, the bytes its
// bound counts, and their buffers' capacity.
func collected(c *stream.Collector) (held, capacity int) {
	held, capacity = len(c.Text()), cap(c.Text())
	for _, call := range c.Calls() {
		held += len(call.Args)
		capacity += cap(call.Args)
	}
	return held, capacity
}

// checkedTap gives tp a Collector, as a request with tools declared and
// a JSON output asked for gets one when an SLO requires the checks, and
// reads events until the Collector's buffers have just grown past
// 16 KiB: the state between two growths, with a quarter or more of room,
// that a pooled Collector (its buffers kept up to 64 KiB) starts its
// next request in. It reports whether the events add to the Collector.
// begin, when not empty, is a payload read into the Collector first (the
// block an Anthropic tool call's deltas continue).
func checkedTap(tp *tap, p []byte, begin string) bool {
	tp.col = stream.NewCollector(structure.DefaultMaxBytes, true)
	if begin != "" {
		var c stream.Chunk
		stream.ParseCollect(tp.format, []byte(begin), &c, tp.col)
	}
	for range 1 << 16 {
		_, before := collected(tp.col)
		tp.Read(p)
		if _, after := collected(tp.col); after != before && after >= 16<<10 {
			return true
		}
	}
	return false
}

// The per-event alloc tests of the tap (TestTapZeroAllocsPerEvent,
// ...EveryFormat) with the structure checks on: a Collector takes each
// tool call's argument delta and the answer text, and the hot path still
// allocates nothing per event.
func TestTapZeroAllocsPerEventChecked(t *testing.T) {
	cases := []struct {
		name  string
		f     stream.Format
		kind  bodyKind
		ev    string
		begin string // read first: the tool_use block the deltas continue
	}{
		{"chat text", stream.FormatOpenAI, bodySSE, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" x"},"finish_reason":null}]}` + "\n\n", ""},
		{"chat tool call", stream.FormatOpenAI, bodySSE, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" x"}}]},"finish_reason":null}]}` + "\n\n", ""},
		{"responses tool call", stream.FormatResponses, bodySSE, "event: response.function_call_arguments.delta\ndata: " +
			`{"type":"response.function_call_arguments.delta","sequence_number":3,"item_id":"fc_1","output_index":0,"delta":" x"}` + "\n\n", ""},
		{"responses text", stream.FormatResponses, bodySSE, "event: response.output_text.delta\ndata: " +
			`{"content_index":0,"delta":" x","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}` + "\n\n", ""},
		{"messages tool call", stream.FormatMessages, bodySSE, "event: content_block_delta\ndata: " +
			`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" x"}}` + "\n\n",
			`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`},
		{"ollama text", stream.FormatOllama, bodyNDJSON, `{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":" x"},"done":false}` + "\n", ""},
		{"gemini text", stream.FormatGemini, bodySSE, `data: {"candidates": [{"content": {"parts": [{"text": " x"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "r"}` + "\n\n", ""},
	}
	for _, c := range cases {
		for _, strip := range []bool{false, true} {
			st := realState(1 << 16)
			tp := newTap(&loopReader{ev: []byte(c.ev)}, st, c.kind, c.f, strip, 1<<20)
			p := make([]byte, 32<<10)
			if !checkedTap(tp, p, c.begin) {
				t.Fatalf("%s: the events add nothing to the Collector", c.name)
			}
			st.rec.Reset()
			held, _ := collected(tp.col)
			if n := testing.AllocsPerRun(500, func() { tp.Read(p) }); n != 0 {
				t.Errorf("%s strip=%v: %.2f allocations per event with the structure checks on", c.name, strip, n)
			}
			if now, _ := collected(tp.col); now <= held || tp.col.Over() || st.rec.TokenEvents() < 400 {
				t.Errorf("%s: the Collector went from %d to %d bytes (over %v), %d token events", c.name, held, now, tp.col.Over(), st.rec.TokenEvents())
			}
			tp.col.Release()
		}
	}
}

// tenMBArgs is a stream (OpenAI chat) of one call to get_weather whose
// 10 MB argument comes in 4 KiB deltas, made as it is read: the test
// holds none of it.
type tenMBArgs struct {
	step  int // events written: the name, the deltas, the finish, [DONE]
	delta []byte
	rest  []byte
}

const (
	tenMB      = 10 << 20
	deltaBytes = 4 << 10
	tenMBSteps = tenMB / deltaBytes
)

func newTenMBArgs() *tenMBArgs {
	return &tenMBArgs{delta: []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` +
		strings.Repeat("x", deltaBytes) + `"}}]},"finish_reason":null}]}` + "\n\n")}
}

func (g *tenMBArgs) Read(p []byte) (int, error) {
	if len(g.rest) == 0 {
		switch {
		case g.step == 0:
			g.rest = []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\""}}]},"finish_reason":null}]}` + "\n\n")
		case g.step <= tenMBSteps:
			g.rest = g.delta
		case g.step == tenMBSteps+1:
			g.rest = []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"}"}}]},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n")
		default:
			return 0, io.EOF
		}
		g.step++
	}
	n := copy(p, g.rest)
	g.rest = g.rest[n:]
	return n, nil
}

func (g *tenMBArgs) Close() error { return nil }

// TestTenMBArgumentWithinTheCap: a tool call's 10 MB argument, streamed
// in 2,560 deltas, never takes the Collector past its bound (checked
// after every read), and the Collector says it is over.
func TestTenMBArgumentWithinTheCap(t *testing.T) {
	st := realState(1 << 12)
	tp := newTap(newTenMBArgs(), st, bodySSE, stream.FormatOpenAI, false, 1<<20)
	tp.col = stream.NewCollector(structure.DefaultMaxBytes, false)
	defer tp.col.Release()
	p := make([]byte, 32<<10)
	most := 0
	for {
		_, err := tp.Read(p)
		held, _ := collected(tp.col)
		most = max(most, held)
		if held > structure.DefaultMaxBytes {
			t.Fatalf("the Collector holds %d bytes, bound %d", held, structure.DefaultMaxBytes)
		}
		if err != nil {
			break
		}
	}
	if st.rec.TokenEvents() < tenMBSteps || !tp.col.Over() || most < structure.DefaultMaxBytes-deltaBytes {
		t.Fatalf("%d token events; over %v; at most %d bytes held", st.rec.TokenEvents(), tp.col.Over(), most)
	}
	t.Logf("10 MiB of arguments in %d events: at most %d bytes held (bound %d)", st.rec.TokenEvents(), most, structure.DefaultMaxBytes)
}

// TestTenMBArgumentTooLarge: through the proxy, the same call's check
// says too_large (not pass), counted under
// tokentap_structure_failures_total{check="too_large"}; the client gets
// all 10 MB; and what the whole request allocates (runtime.MemStats'
// TotalAlloc over it: the upstream's writes, the proxy, the client's
// reads) stays far below the argument's size: the bound, not the
// argument, sets what the check holds.
func TestTenMBArgumentTooLarge(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		g := newTenMBArgs()
		buf := make([]byte, 32<<10)
		for {
			n, err := g.Read(buf)
			if err != nil {
				return
			}
			w.Write(buf[:n])
		}
	})
	fs, sink, m := judged(t, up, Options{Structure: &structure.Checker{}})
	req := structAPIs[0].toolsReq
	client := fs.Client()
	run := func() (int64, uint64) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		resp, err := client.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			sink.mu.Lock()
			done := len(sink.recs) > 0
			sink.mu.Unlock()
			if done {
				break
			}
		}
		runtime.ReadMemStats(&after)
		return n, after.TotalAlloc - before.TotalAlloc
	}
	run() // the first request also sets up the connections and the exporter's series
	sink.mu.Lock()
	sink.recs = nil
	sink.mu.Unlock()
	n, alloc := run()
	r := only(t, sink)
	if n < tenMB || r.Outcome != "success" || r.Structure != structure.Fail || !slices.Equal(r.StructureFailed, []string{structure.TooLarge}) {
		t.Fatalf("client got %d bytes; outcome %s, structure %q %v, want success, fail [too_large]", n, r.Outcome, r.Structure, r.StructureFailed)
	}
	if c := counterValue(t, m, "tokentap_structure_failures_total", "check", structure.TooLarge); c != 2 {
		t.Fatalf("tokentap_structure_failures_total{check=too_large} = %v, want 2 (two requests)", c)
	}
	const bound = 3 << 20
	if alloc > bound {
		t.Fatalf("a request with a 10 MB argument allocated %d bytes, bound %d", alloc, bound)
	}
	t.Logf("a request with a 10 MiB argument: %d bytes allocated in all (bound %d); the client got %d bytes", alloc, bound, n)
}

// fourKiBCall is a chat request that declares get_weather (its
// parameters a schema of three properties) and the stream of its answer:
// one call whose 4 KiB argument comes in 64 deltas of 64 bytes.
func fourKiBCall() (req, resp []byte) {
	req = []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` +
		`{"type":"object","properties":{"city":{"type":"string","maxLength":8192},"days":{"type":"integer","minimum":1},"units":{"enum":["c","f"]}},"required":["city","days"],"additionalProperties":false}}}]}`)
	args := `{"city":"` + strings.Repeat("x", 4096-len(`{"city":"","days":3,"units":"c"}`)) + `","days":3,"units":"c"}`
	chunk := func(delta, finish string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + "}]}\n\n"
	}
	var b strings.Builder
	b.WriteString(chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`, "null"))
	for i := 0; i < len(args); i += 64 {
		b.WriteString(chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+q(args[i:min(i+64, len(args))])+`}}]}`, "null"))
	}
	b.WriteString(chunk(`{}`, `"tool_calls"`) + "data: [DONE]\n\n")
	return req, []byte(b.String())
}

// BenchmarkStructureCheck4KiB is the per-request cost of checking a
// 4 KiB tool argument (docs/performance.md, "Structure checks"), each
// iteration one request unchecked and the same request checked, in
// turn, so that both see the same machine; it reports both and their
// ratio.
//
// tap: the sidecar's own work on the request (the peek of its body, the
// declarations read when checked) and its 66-event response (framed,
// timed, parsed; checked: collected, then parsed as JSON and validated
// against the tool's schema). http: the whole request through the proxy
// on loopback, client to engine and back.
func BenchmarkStructureCheck4KiB(b *testing.B) {
	req, resp := fourKiBCall()
	k := &structure.Checker{}
	one := func(checked bool) {
		in, _, _, _ := peek(io.NopCloser(strings.NewReader(string(req))), stream.APIChat, "/v1/chat/completions", 1<<20, int64(len(req)), checked, nil)
		st := realState(128)
		tp := newTap(io.NopCloser(strings.NewReader(string(resp))), st, bodySSE, stream.FormatOpenAI, false, 1<<20)
		if checked {
			tp.col = k.Collector(&in.Declared)
		}
		p := make([]byte, 32<<10)
		for {
			if _, err := tp.Read(p); err != nil {
				break
			}
		}
		if checked {
			if r := k.Check(&in.Declared, tp.col, false, false, false); r.Status != structure.Pass {
				b.Fatalf("check %+v, want pass", r)
			}
			tp.col.Release()
		}
	}
	b.Run("tap", func(b *testing.B) {
		interleave(b, func() { one(false) }, func() { one(true) })
	})
	b.Run("http", func(b *testing.B) {
		up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write(resp)
		})
		plain, _ := front(b, up, Options{})
		checked, sink := front(b, up, Options{Structure: k})
		post := func(fs string) {
			r, err := http.Post(fs+"/v1/chat/completions", "application/json", strings.NewReader(string(req)))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		interleave(b, func() { post(plain.URL) }, func() { post(checked.URL) })
		b.StopTimer()
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.recs) == 0 || sink.recs[0].Structure != structure.Pass {
			b.Fatalf("the checked proxy's records: %d, first %+v", len(sink.recs), sink.recs)
		}
	})
}

// interleave runs base and checked in turn b.N times and reports the
// mean time of each and checked's ratio to base.
func interleave(b *testing.B, base, checked func()) {
	base()
	checked()
	var tb, tc time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		base()
		t1 := time.Now()
		checked()
		tc += time.Since(t1)
		tb += t1.Sub(t0)
	}
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), "unchecked-ns/req")
	b.ReportMetric(float64(tc.Nanoseconds())/float64(b.N), "checked-ns/req")
	b.ReportMetric(float64(tc)/float64(tb), "ratio")
}
