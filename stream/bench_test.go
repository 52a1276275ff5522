package stream

import "testing"

// benchEvent is a typical chat.completion.chunk event, as BenchmarkTapEvent
// (package proxy) reads it.
var benchEvent = []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")

// BenchmarkFramerFeed frames one SSE event per Feed: the tap's framing
// work per upstream read.
func BenchmarkFramerFeed(b *testing.B) {
	var f Framer
	n := 0
	fn := func(*Event) { n++ }
	b.ReportAllocs()
	b.SetBytes(int64(len(benchEvent)))
	for b.Loop() {
		f.Feed(benchEvent, fn)
	}
	if n == 0 {
		b.Fatal("no event dispatched")
	}
}

// BenchmarkParseOpenAI reads one chunk's payload: the tap's JSON scanning
// per event.
func BenchmarkParseOpenAI(b *testing.B) {
	data := benchEvent[len("data: ") : len(benchEvent)-2]
	var c Chunk
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		ParseOpenAI(data, &c)
	}
	if !c.Output {
		b.Fatal("not a token chunk")
	}
}
