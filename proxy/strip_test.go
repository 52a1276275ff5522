package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// stepUpstream is an engine the test drives: it writes each string sent
// on steps, flushed, and ends the stream when steps is closed.
func stepUpstream(t *testing.T, saw *upstreamSaw, steps <-chan string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		saw.note(t, r)
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		for {
			select {
			case s, ok := <-steps:
				if !ok {
					return
				}
				io.WriteString(w, s)
				w.(http.Flusher).Flush()
			case <-r.Context().Done(): // the client gave up
				return
			}
		}
	}
}

// Bare comment lines (keep-alives with no blank line after them) reach
// the client as soon as the engine has sent them, with LF, CRLF and CR
// line endings: the test sends the next line only once the client has
// read the last one (a held line would stop the test at the client's
// timeout, not pass it). Comment lines before the usage chunk, in its
// event, reach the client too; the usage chunk does not, and the record
// has its counts.
func TestStripCommentLinesAtOnce(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		t.Run(fmt.Sprintf("%q", eol), func(t *testing.T) {
			var saw upstreamSaw
			steps := make(chan string)
			obs := newReasonObs()
			fs, sink := front(t, stepUpstream(t, &saw, steps), Options{InjectUsage: true}, obs)
			c := plainClient()
			c.Timeout = time.Minute // bounds a failure; never what the test measures
			resp := post(t, c, fs.URL, nil)
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			var got strings.Builder
			expect := func(s string) {
				t.Helper()
				b := make([]byte, len(s))
				if _, err := io.ReadFull(br, b); err != nil || string(b) != s {
					t.Fatalf("client read %q (%v), want %q", b, err, s)
				}
				got.Write(b)
			}
			ping := ": ping" + eol
			for _, s := range []string{ping, ping, boundTok + eol + eol, ping, ": keep-alive" + eol} {
				steps <- s
				expect(s) // the client has it before the engine sends anything more
			}
			steps <- ping + boundUsage + eol + eol
			expect(ping) // the comment line of the usage chunk's event, at once
			steps <- "data: [DONE]" + eol + eol
			close(steps)
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			got.Write(rest)
			if string(rest) != "data: [DONE]"+eol+eol {
				t.Fatalf("after the usage chunk the client got %q", rest)
			}
			if strings.Contains(got.String(), "usage") {
				t.Fatalf("the usage chunk reached the client: %q", got.String())
			}
			r := only(t, sink)
			if !saw.includeUsage || !r.UsageInjected || r.TapFailed != "" || len(obs.got()) != 0 {
				t.Fatalf("injected %v/%v, TapFailed %q, give-ups %v", saw.includeUsage, r.UsageInjected, r.TapFailed, obs.got())
			}
			if r.TokenSource != "usage" || r.OutputTokens != 7 || r.InputTokens != 3 || r.TokenEvents() != 1 || r.Outcome != "success" {
				t.Fatalf("tokens %d in, %d out from %s, %d token events, outcome %s", r.InputTokens, r.OutputTokens, r.TokenSource, r.TokenEvents(), r.Outcome)
			}
		})
	}
}

// bigChoices is a chunk of n choices, one token each.
func bigChoices(n int) string {
	var b strings.Builder
	b.WriteString(`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"index":%d,"delta":{"content":"a"},"finish_reason":null}`, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// bigToolCall is a chunk with one tool-call delta of n bytes of
// arguments, and then the members in more (`,"usage":null`: OpenAI's API).
func bigToolCall(n int, more string) string {
	args := strings.Repeat(`{\"k\":\"vvvvvvvvvv\"},`, n/20)
	return `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"` +
		args + `"}}]},"finish_reason":null}]` + more + `}`
}

// Events far larger than the hold bound — a chunk of 10,000 choices, a
// 100 KB tool-call delta, one with OpenAI's "usage":null after it — read
// in pieces of every size: each reaches the client byte for byte (less
// its usage member) as it arrives, holding no more than a read and a few
// bytes; nothing is given up; the usage chunk after them never reaches
// the client, and its counts are the record's.
func TestStripLargeEventsForwardedAsTheyCome(t *testing.T) {
	choices := bigChoices(10_000)
	tool := bigToolCall(100_000, "")
	null := bigToolCall(100_000, `,"usage":null`)
	if len(choices) < 500_000 || len(tool) < 100_000 {
		t.Fatalf("events of %d and %d bytes", len(choices), len(tool))
	}
	for _, tc := range []struct{ name, ev, want string }{
		{"10,000 choices", choices, choices},
		{"100 KB tool-call delta", tool, tool},
		{"usage null after 100 KB", null, tool},
	} {
		in := boundTok + "\n\n" + tc.ev + "\n\n" + boundUsage + "\n\ndata: [DONE]\n\n"
		want := boundTok + "\n\n" + tc.want + "\n\ndata: [DONE]\n\n"
		for _, size := range []int{1000, 4096, 32 << 10} {
			maxHeld := 0
			out, tp := runStripTap([]byte(in), []int{size}, 32<<10, func(tp *tap) {
				maxHeld = max(maxHeld, len(tp.held))
			})
			if string(out) != want {
				t.Fatalf("%s, reads of %d: client bytes differ (%d, want %d)", tc.name, size, len(out), len(want))
			}
			rec := tp.st.rec
			if rec.TapFailed != "" || !tp.sawUsage || tp.usageOut != 7 || rec.InputTokens != 3 {
				t.Fatalf("%s, reads of %d: TapFailed %q, usage %v/%d", tc.name, size, rec.TapFailed, tp.sawUsage, tp.usageOut)
			}
			// held: at most one read, and what may still be cut after it
			// (the usage chunk, or a usage member and the event's end)
			if limit := size + len(boundUsage) + 16; maxHeld > limit {
				t.Fatalf("%s, reads of %d: held %d bytes (limit %d)", tc.name, size, maxHeld, limit)
			}
		}
	}
}

// The same events through the proxy, written by the engine in 1 KiB
// pieces: the client's bytes are the engine's less the usage chunk, the
// record's counts the usage chunk's, nothing given up.
func TestStripLargeEventsThroughTheProxy(t *testing.T) {
	for _, tc := range []struct{ name, ev, want string }{
		{"10,000 choices", bigChoices(10_000), ""},
		{"100 KB tool-call delta", bigToolCall(100_000, ""), ""},
		{"usage null after 100 KB", bigToolCall(100_000, `,"usage":null`), bigToolCall(100_000, "")},
	} {
		if tc.want == "" {
			tc.want = tc.ev
		}
		sent := boundTok + "\n\n" + tc.ev + "\n\n" + boundUsage + "\n\ndata: [DONE]\n\n"
		var saw upstreamSaw
		obs := newReasonObs()
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			saw.note(t, r)
			w.Header().Set("Content-Type", "text/event-stream")
			for s := sent; len(s) > 0; {
				n := min(1024, len(s))
				io.WriteString(w, s[:n])
				w.(http.Flusher).Flush()
				s = s[n:]
			}
		}), Options{InjectUsage: true}, obs)
		resp := post(t, plainClient(), fs.URL, nil)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := boundTok + "\n\n" + tc.want + "\n\ndata: [DONE]\n\n"; string(body) != want {
			t.Fatalf("%s: client got %d bytes, want %d; usage chunk in them: %v", tc.name, len(body), len(want), strings.Contains(string(body), `"completion_tokens"`))
		}
		r := only(t, sink)
		if !saw.includeUsage || !r.UsageInjected || r.TapFailed != "" || len(obs.got()) != 0 {
			t.Fatalf("%s: injected %v/%v, TapFailed %q, give-ups %v", tc.name, saw.includeUsage, r.UsageInjected, r.TapFailed, obs.got())
		}
		if r.TokenSource != "usage" || r.OutputTokens != 7 || r.InputTokens != 3 || r.Outcome != "success" {
			t.Fatalf("%s: tokens %d in, %d out from %s, outcome %s", tc.name, r.InputTokens, r.OutputTokens, r.TokenSource, r.Outcome)
		}
	}
}

// jsonPrefix read in pieces decides as it does read whole, and never
// releases a byte of the first top-level "usage" member: what it lets
// through before the object ends stops before MemberSpan's cut.
func FuzzJSONPrefix(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[{"delta":{"content":"a"}}],"usage":null}`,
		`{"id":"x","choices":[],"usage":{"prompt_tokens":1}}`,
		`{"usage":{"completion_tokens":1},"choices":[{}]}`,
		`{"choices" : [ {"a":"\"usage\":1"} ] , "usage" : null }`,
		`{"choices":[1],"choices":[],"usage":{}}`,
		`{"a":{"usage":1},"choices":[[]],"b":"}","usage":0}`,
		`{"choices":"x","usage":1}`,
	} {
		f.Add([]byte(s), []byte{3, 1, 7})
	}
	f.Fuzz(func(t *testing.T, v []byte, splits []byte) {
		if len(v) == 0 || v[0] != '{' {
			return
		}
		j := jsonPrefix{u: chatUsage, key: -1}
		safe := int64(-1)
		at := int64(0)
		for i := 0; at < int64(len(v)); i++ {
			n := int64(1)
			if len(splits) > 0 {
				n = int64(splits[i%len(splits)]) + 1
			}
			to := min(at+n, int64(len(v)))
			j.feed(v, 0, at, to)
			at = to
			if s := j.safe(); s > safe {
				safe = s
			}
		}
		if got, want := j.choices == choicesSome, contentPrefix(chatUsage, v); got != want {
			t.Fatalf("%q: content %v in pieces, %v whole", v, got, want)
		}
		if safe > int64(len(v)) {
			t.Fatalf("%q: safe %d past the end", v, safe)
		}
		if s, _, ok := stream.MemberSpan(v, "usage"); ok && safe > int64(s) {
			t.Fatalf("%q: released up to %d, the usage member's cut starts at %d", v, safe, s)
		}
	})
}

// The usage chunk after comment lines in its own event is cut wherever
// the reads end: in one read, a byte at a time, and split at every byte
// (FuzzTapStrip found reads that ended between the usage line's end and
// the blank line after it: the comment lines were forwarded, then the
// cut started at the blank line, and the usage chunk reached the client
// uncounted). The client gets the comment lines alone, and no give-up
// is recorded.
func TestStripUsageAfterCommentsAnyReads(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		comments := ":keep-alive" + eol + ":00000000" + eol
		in := comments + `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}` + eol + eol
		splits := [][]int{{1 << 20}, nil} // one read; a byte at a time
		for k := 1; k < len(in); k++ {
			splits = append(splits, []int{k, 1 << 20})
		}
		for _, sz := range splits {
			got, tp := runStripTap([]byte(in), sz, 64, nil)
			if string(got) != comments || tp.st.rec.TapFailed != "" {
				t.Fatalf("eol %q reads %v: got %q (tap failed %q), want %q", eol, sz, got, tp.st.rec.TapFailed, comments)
			}
		}
	}
}
