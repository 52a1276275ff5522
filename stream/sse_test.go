package stream

import (
	"reflect"
	"testing"
)

type gotEvent struct {
	Name, Data string
	HasData    bool
	Start, End int64
	Partial    bool
}

func frameAll(chunks ...string) []gotEvent {
	var f Framer
	var out []gotEvent
	fn := func(e *Event) {
		out = append(out, gotEvent{string(e.Name), string(e.Data), e.HasData, e.Start, e.End, e.Partial})
	}
	for _, c := range chunks {
		f.Feed([]byte(c), fn)
	}
	f.Finish(fn)
	return out
}

func TestFramerEdgeCases(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []gotEvent
	}{
		{"lf", "data: a\n\ndata: b\n\n", []gotEvent{{"", "a", true, 0, 9, false}, {"", "b", true, 9, 18, false}}},
		{"crlf", "data: a\r\n\r\n", []gotEvent{{"", "a", true, 0, 11, false}}},
		{"cr", "data: a\r\rdata: b\r\r", []gotEvent{{"", "a", true, 0, 9, false}, {"", "b", true, 9, 18, false}}},
		{"no space after colon", "data:a\n\n", []gotEvent{{"", "a", true, 0, 8, false}}},
		{"only one space stripped", "data:  a\n\n", []gotEvent{{"", " a", true, 0, 10, false}}},
		{"multi-line data", "data: a\ndata: b\n\n", []gotEvent{{"", "a\nb", true, 0, 17, false}}},
		{"comment only", ": ping\n\n", []gotEvent{{"", "", false, 0, 8, false}}},
		{"comment inside", ": x\ndata: a\n\n", []gotEvent{{"", "a", true, 0, 13, false}}},
		{"event name", "event: error\ndata: {}\n\n", []gotEvent{{"error", "{}", true, 0, 23, false}}},
		{"bom", "\xEF\xBB\xBFdata: a\n\n", []gotEvent{{"", "a", true, 0, 12, false}}},
		{"empty data field", "data\n\n", []gotEvent{{"", "", true, 0, 6, false}}},
		{"partial at eof", "data: a\n\ndata: [DONE]\n", []gotEvent{{"", "a", true, 0, 9, false}, {"", "[DONE]", true, 9, 22, true}}},
		{"partial line at eof", "data: [DONE]", []gotEvent{{"", "[DONE]", true, 0, 12, true}}},
		{"stray blank lines", "\n\ndata: a\n\n", []gotEvent{{"", "a", true, 2, 11, false}}},
		{"unknown field ignored", "id: 7\nretry: 10\ndata: a\n\n", []gotEvent{{"", "a", true, 0, 25, false}}},
		{"colon in value", "data: {\"a\":1}\n\n", []gotEvent{{"", `{"a":1}`, true, 0, 15, false}}},
		// llama.cpp before ggml-org/llama.cpp#16109: a stream's error as
		// an "error:" field, then "data: [DONE]" on its OpenAI routes.
		{"llama.cpp error field", "error: {\"code\":400,\"type\":\"exceed_context_size_error\"}\n\ndata: [DONE]\n\n",
			[]gotEvent{{"", `{"error":{"code":400,"type":"exceed_context_size_error"}}`, true, 0, 56, false}, {"", "[DONE]", true, 56, 70, false}}},
		{"error field not an object ignored", "error: boom\n\n", []gotEvent{{"", "", false, 0, 13, false}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := frameAll(c.in); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("frame(%q)\n got %+v\nwant %+v", c.in, got, c.want)
			}
		})
	}
}

// Splitting the input anywhere, byte by byte included, must give the same
// events as feeding it whole: reads can end at any byte, a CRLF or the BOM
// split included.
func TestFramerSplitInvariance(t *testing.T) {
	inputs := []string{
		"\xEF\xBB\xBFdata: a\r\n\r\ndata: b\r\ndata: c\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n",
		"data: x\r\rdata: y\r\r",
		"event: e\ndata: 1\n\n\n\ndata:2\n\ndata: tail",
		"data: a\r\n\r\n\r\ndata: b\r\n\r\n",
	}
	// An event dispatched at the CR of a CRLF split across reads ends
	// before the LF (the event is dispatched when its CR is read, so that
	// its time is right); that is the one difference allowed.
	norm := func(in string, evs []gotEvent) []gotEvent {
		for i := range evs {
			if e := evs[i].End; e > 0 && e < int64(len(in)) && in[e-1] == '\r' && in[e] == '\n' {
				evs[i].End++
			}
		}
		return evs
	}
	for _, in := range inputs {
		want := norm(in, frameAll(in))
		for i := 0; i <= len(in); i++ {
			for j := i; j <= len(in); j++ {
				if got := norm(in, frameAll(in[:i], in[i:j], in[j:])); !reflect.DeepEqual(got, want) {
					t.Fatalf("split %d,%d of %q:\n got %+v\nwant %+v", i, j, in, got, want)
				}
			}
		}
		bytewise := make([]string, len(in))
		for i := 0; i < len(in); i++ { // bytes, not runes
			bytewise[i] = in[i : i+1]
		}
		if got := norm(in, frameAll(bytewise...)); !reflect.DeepEqual(got, want) {
			t.Fatalf("bytewise %q:\n got %+v\nwant %+v", in, got, want)
		}
	}
}

func TestFramerZeroAllocs(t *testing.T) {
	var f Framer
	chunk := []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
	n := 0
	fn := func(*Event) { n++ }
	f.Feed(chunk, fn) // warm the buffers
	allocs := testing.AllocsPerRun(1000, func() { f.Feed(chunk[:20], fn); f.Feed(chunk[20:], fn) })
	if allocs != 0 {
		t.Fatalf("Feed allocates %.1f times per event in steady state", allocs)
	}
}
