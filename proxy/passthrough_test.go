package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// streamSpec is a randomized engine stream, generated from a seed so that
// the upstream and the test agree on it without sharing state.
type streamSpec struct {
	events   []string // raw bytes of each event, terminator included
	usageAt  int      // index where the usage event goes when asked for
	usage    string
	splits   []int // write boundaries, as fractions of 1000 of the length
	usageOut int
}

var contents = []string{"", "a", " the", "é", "日本語", `\"quoted\"`, `line\nbreak`, "🙂", strings.Repeat("x", 300), " tokens", `\\`}

func genStream(seed uint64) streamSpec {
	r := rand.New(rand.NewPCG(seed, 99))
	eol := []string{"\n", "\r\n", "\r"}[r.IntN(3)]
	ev := func(lines ...string) string {
		var b strings.Builder
		for _, l := range lines {
			b.WriteString(l + eol)
		}
		return b.String() + eol
	}
	var s streamSpec
	if r.IntN(2) == 0 {
		s.events = append(s.events, ev(`data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`))
	}
	n := r.IntN(25)
	for i := 0; i < n; i++ {
		switch k := r.IntN(20); {
		case k == 0:
			s.events = append(s.events, ev(": keep-alive"))
		case k == 1:
			s.events = append(s.events, ev("data: not json at all"))
		case k == 2:
			s.events = append(s.events, ev(`data: {"id":"x",`, `data: "choices":[]}`)) // multi-line data
		default:
			sp := ""
			if r.IntN(2) == 0 {
				sp = " "
			}
			c := contents[r.IntN(len(contents))]
			s.events = append(s.events, ev(`data:`+sp+`{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"`+c+`"},"finish_reason":null}]}`))
		}
	}
	s.usageAt = len(s.events)
	s.usageOut = r.IntN(1000)
	s.usage = ev(fmt.Sprintf(`data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}}`, 3+s.usageOut, s.usageOut))
	if r.IntN(10) != 0 {
		s.events = append(s.events, ev("data: [DONE]"))
	}
	for i := r.IntN(8); i > 0; i-- {
		s.splits = append(s.splits, r.IntN(1000))
	}
	return s
}

func (s streamSpec) bytes(withUsage bool) []byte {
	var b bytes.Buffer
	for i, e := range s.events {
		if i == s.usageAt && withUsage {
			b.WriteString(s.usage)
		}
		b.WriteString(e)
	}
	if s.usageAt == len(s.events) && withUsage {
		b.WriteString(s.usage)
	}
	return b.Bytes()
}

func seedUpstream(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Seed          uint64 `json:"seed"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("upstream got a body it cannot decode: %v", err)
		}
		s := genStream(req.Seed)
		body := s.bytes(req.StreamOptions.IncludeUsage)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Upstream-Seed", strconv.FormatUint(req.Seed, 10))
		w.WriteHeader(200)
		prev := 0
		for _, f := range append(s.splits, 1000) {
			at := len(body) * f / 1000
			if at < prev {
				continue
			}
			w.Write(body[prev:at])
			w.(http.Flusher).Flush()
			if f%7 == 0 {
				time.Sleep(100 * time.Microsecond) // let some pieces arrive as separate reads
			}
			prev = at
		}
	}))
}

type collect struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (c *collect) Write(r *record.Record) { c.mu.Lock(); c.recs = append(c.recs, r); c.mu.Unlock() }

// TestPassThroughRandomStreams: over 1,000 randomized streams (random event
// sizes and split points, usage asked for or not, injection on or off,
// LF/CRLF/CR line ends, comments, malformed and multi-line events, [DONE]
// present or not) the client receives exactly the bytes the upstream sent,
// less the usage event where the sidecar injected the request for it.
func TestPassThroughRandomStreams(t *testing.T) {
	us := seedUpstream(t)
	defer us.Close()
	u, _ := url.Parse(us.URL)
	var sinks [2]collect
	var fronts [2]*httptest.Server
	for i, inject := range []bool{false, true} {
		p, err := New(Options{Upstream: u, InjectUsage: inject, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sinks[i]}})})
		if err != nil {
			t.Fatal(err)
		}
		fronts[i] = httptest.NewServer(p)
		defer fronts[i].Close()
	}
	const n = 1000
	injectedChecked := 0
	for seed := uint64(0); seed < n; seed++ {
		inject := seed%2 == 1
		asks := seed%3 == 0
		so := ""
		if asks {
			so = `,"stream_options":{"include_usage":true}`
		}
		body := fmt.Sprintf(`{"model":"m","stream":true,"seed":%d,"messages":[]%s}`, seed, so)
		resp, err := http.Post(fronts[seed%2].URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("seed %d: reading: %v", seed, err)
		}
		if resp.Header.Get("X-Upstream-Seed") != strconv.FormatUint(seed, 10) {
			t.Fatalf("seed %d: upstream header not passed through", seed)
		}
		want := genStream(seed).bytes(asks)
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d (inject=%v asks=%v): client bytes differ\n got %q\nwant %q", seed, inject, asks, got, want)
		}
		if inject && !asks {
			injectedChecked++
		}
	}
	if injectedChecked < n/4 {
		t.Fatalf("only %d streams exercised usage stripping", injectedChecked)
	}
	// Every stream left one record; injected ones count tokens from usage.
	for i := range sinks {
		sinks[i].mu.Lock()
		defer sinks[i].mu.Unlock()
		if len(sinks[i].recs) != n/2 {
			t.Fatalf("proxy %d: %d records for %d requests", i, len(sinks[i].recs), n/2)
		}
	}
	for _, r := range sinks[1].recs {
		if r.UsageInjected && r.TokenSource != "usage" {
			t.Fatalf("record %s: usage injected but token_source=%s", r.ID, r.TokenSource)
		}
	}
}

// formatStreams are the recorded streams of every format the random
// pass-through test builds its streams from (stream/testdata/fixtures).
var formatStreams = []struct {
	path, fixture, ct string
	ndjson            bool
	api               stream.Name
}{
	{"/v1/chat/completions", "openai_chat_vllm.sse", "text/event-stream", false, stream.NameChat},
	{"/v1/completions", "openai_completions_ollama.sse", "text/event-stream", false, stream.NameCompletions},
	{"/v1/responses", "responses_ollama.sse", "text/event-stream", false, stream.NameResponses},
	{"/v1/responses", "responses_openai_error.sse", "text/event-stream", false, stream.NameResponses},
	{"/v1/messages", "messages_ollama.sse", "text/event-stream", false, stream.NameMessages},
	{"/v1/messages", "messages_anthropic_overloaded.sse", "text/event-stream", false, stream.NameMessages},
	{"/api/chat", "ollama_chat.ndjson", "application/x-ndjson", true, stream.NameOllamaChat},
	{"/api/generate", "ollama_generate.ndjson", "application/x-ndjson", true, stream.NameOllamaGenerate},
	{"/api/generate", "ollama_generate_error.ndjson", "application/x-ndjson", true, stream.NameOllamaGenerate},
	{"/generate_stream", "tgi_generate_stream.sse", "text/event-stream", false, stream.NameTGIGenerate},
	{"/generate_stream", "tgi_generate_stream_overloaded.sse", "text/event-stream", false, stream.NameTGIGenerate},
	{"/completion", "llamacpp_completion.sse", "text/event-stream", false, stream.NameLlamaCppCompletion},
	{"/v1beta/models/gemini-2.5-flash:streamGenerateContent", "gemini_stream.sse", "text/event-stream", false, stream.Name(stream.NameGemini)},
	{"/v1beta/models/gemini-2.0-flash:streamGenerateContent", "gemini_stream_error.sse", "text/event-stream", false, stream.Name(stream.NameGemini)},
}

// genFormatStream builds a random stream of format i from its recorded
// events: events repeated or dropped, keep-alive comments (SSE), the
// line ending changed (LF, CRLF, CR for SSE; LF or CRLF for NDJSON),
// stray blank lines, a malformed event now and then, the end cut off
// sometimes, and random write boundaries.
func genFormatStream(t *testing.T, i int, seed uint64) (body []byte, splits []int) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	fs := formatStreams[i]
	raw := readFixture(t, fs.fixture)
	var events [][]byte
	on := func(e *stream.Event) { events = append(events, bytes.TrimRight(raw[e.Start:e.End], "\n")) }
	if fs.ndjson {
		var lf stream.LineFramer
		lf.Feed(raw, on)
		lf.Finish(on)
	} else {
		var f stream.Framer
		f.Feed(raw, on)
		f.Finish(on)
	}
	eol := []string{"\n", "\r\n", "\r"}[r.IntN(3)]
	if fs.ndjson {
		eol = []string{"\n", "\r\n"}[r.IntN(2)]
	}
	var b bytes.Buffer
	emit := func(ev []byte) {
		lines := strings.Split(string(ev), "\n")
		for _, l := range lines {
			b.WriteString(l + eol)
		}
		if !fs.ndjson {
			b.WriteString(eol)
		}
	}
	last := len(events)
	if r.IntN(8) == 0 {
		last = r.IntN(len(events) + 1) // cut off
	}
	for k := 0; k < last; k++ {
		switch n := r.IntN(12); {
		case n == 0:
			continue // dropped
		case n == 1:
			emit(events[k]) // repeated
		case n == 2 && !fs.ndjson:
			emit([]byte(": keep-alive"))
		case n == 3:
			emit([]byte("data: {not json"))
		case n == 4:
			b.WriteString(eol) // a stray blank line
		}
		emit(events[k])
	}
	body = b.Bytes()
	for j := r.IntN(8); j > 0; j-- {
		splits = append(splits, r.IntN(len(body)+1))
	}
	slices.Sort(splits)
	return body, splits
}

// TestPassThroughRandomStreamsEveryFormat: byte identity for random
// streams of every format (the tap never changes a byte of a format it
// does not strip), one record each, its api the route's.
func TestPassThroughRandomStreamsEveryFormat(t *testing.T) {
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Seed   uint64 `json:"seed"`
			Format int    `json:"format"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("upstream got a body it cannot decode: %v", err)
		}
		body, splits := genFormatStream(t, req.Format, req.Seed)
		w.Header().Set("Content-Type", formatStreams[req.Format].ct)
		w.WriteHeader(200)
		prev := 0
		for _, at := range append(splits, len(body)) {
			w.Write(body[prev:at])
			w.(http.Flusher).Flush()
			prev = at
		}
	}))
	defer us.Close()
	u, _ := url.Parse(us.URL)
	var sink collect
	p, err := New(Options{Upstream: u, InjectUsage: true, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	fs := httptest.NewServer(p)
	defer fs.Close()
	const perFormat = 60
	n := 0
	for i, f := range formatStreams {
		for seed := uint64(0); seed < perFormat; seed++ {
			body := fmt.Sprintf(`{"model":"m","stream":true,"seed":%d,"format":%d,"stream_options":{"include_usage":true}}`, seed, i)
			resp, err := http.Post(fs.URL+f.path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			want, _ := genFormatStream(t, i, seed)
			if !bytes.Equal(got, want) {
				t.Fatalf("%s seed %d: client bytes differ\n got %q\nwant %q", f.fixture, seed, got, want)
			}
			n++
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		sink.mu.Lock()
		got := len(sink.recs)
		sink.mu.Unlock()
		if got == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.recs) != n {
		t.Fatalf("%d records for %d requests", len(sink.recs), n)
	}
	apis := map[stream.Name]int{}
	for _, r := range sink.recs {
		apis[r.API]++
		if r.TapFailed != "" {
			t.Errorf("record %s (%s): tap failed: %s", r.ID, r.API, r.TapFailed)
		}
	}
	for _, f := range formatStreams {
		if apis[f.api] == 0 {
			t.Errorf("no record with api %s", f.api)
		}
	}
}
