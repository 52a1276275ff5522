package stream

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// A test stream is described as events (lines, without line endings) and
// stray blank lines; build renders it with some line endings and says what
// the framer must report: the events it dispatches, with their exact byte
// ranges, and the byte ranges that belong to no dispatched event.

// tev is one event of a test stream.
type tev struct {
	stray   int      // stray blank lines before the event
	lines   []string // its lines, none empty, none with CR or LF
	partial bool     // the stream ends inside it (no blank line after it)
	noEOL   bool     // partial, and its last line has no line ending
	drop    bool     // over the framer's bound: never dispatched
}

type streamSpec struct {
	bom           bool // a UTF-8 BOM first
	events        []tev
	trailingStray int // stray blank lines after the last event
}

type builtStream struct {
	in    string
	want  []gotEvent // the events the framer must dispatch, in order
	none  [][2]int   // [from, to) ranges that belong to no dispatched event
	total int        // events in the stream, dropped ones included
}

// eolFunc returns the line ending for the next line; empty says whether
// that line is empty (a blank line).
type eolFunc func(empty bool) string

// eols returns the line endings of a mode: 0 LF, 1 CRLF, 2 CR, 3 a random
// mix. The mix never puts an LF-terminated blank line after a CR, which
// would make a CRLF of the two.
func eols(mode int, r *rand.Rand) eolFunc {
	all := []string{"\n", "\r\n", "\r"}
	prev := ""
	return func(empty bool) string {
		if mode < 3 {
			return all[mode]
		}
		e := all[r.IntN(3)]
		for empty && prev == "\r" && e == "\n" {
			e = all[r.IntN(3)]
		}
		prev = e
		return e
	}
}

// sseFields reads the fields of an event's lines as the SSE specification
// says: the test's own reading, independent of the Framer's.
func sseFields(lines []string) (name, data string, hasData bool) {
	var d []string
	for _, l := range lines {
		if strings.HasPrefix(l, ":") {
			continue
		}
		field, value, _ := strings.Cut(l, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			d = append(d, value)
		case "event":
			name = value
		}
	}
	return name, strings.Join(d, "\n"), d != nil
}

func (s streamSpec) build(eol eolFunc) builtStream {
	var sb strings.Builder
	var b builtStream
	if s.bom {
		sb.WriteString("\xEF\xBB\xBF")
	}
	strays := func(n int) {
		if n == 0 {
			return
		}
		from := 0
		if sb.Len() > 3 || !s.bom {
			from = sb.Len() // a BOM goes with what comes first
		}
		for range n {
			sb.WriteString(eol(true))
		}
		b.none = append(b.none, [2]int{from, sb.Len()})
	}
	for k, e := range s.events {
		strays(e.stray)
		start := sb.Len()
		if k == 0 && e.stray == 0 {
			start = 0 // the BOM belongs to the first event
		}
		for i, l := range e.lines {
			sb.WriteString(l)
			if !(e.noEOL && i == len(e.lines)-1) {
				sb.WriteString(eol(false))
			}
		}
		if !e.partial {
			sb.WriteString(eol(true))
		}
		b.total++
		if e.drop {
			b.none = append(b.none, [2]int{start, sb.Len()})
			continue
		}
		name, data, hasData := sseFields(e.lines)
		b.want = append(b.want, gotEvent{name, data, hasData, int64(start), int64(sb.Len()), e.partial})
	}
	strays(s.trailingStray)
	b.in = sb.String()
	return b
}

// seenEvent is an event as a callback saw it, with the Framer's state at
// that moment.
type seenEvent struct {
	gotEvent
	afterCR bool  // Framer.AfterCR() in the callback
	offset  int64 // Framer.Offset() in the callback
}

// frameCuts frames in fed in pieces cut at cuts (ascending offsets).
func frameCuts(in string, limit int, cuts []int) (evs []seenEvent, oversized int) {
	f := Framer{MaxEventBytes: limit}
	fn := func(e *Event) {
		evs = append(evs, seenEvent{
			gotEvent{string(e.Name), string(e.Data), e.HasData, e.Start, e.End, e.Partial},
			f.AfterCR(), f.Offset(),
		})
	}
	prev := 0
	for _, c := range cuts {
		f.Feed([]byte(in[prev:c]), fn)
		prev = c
	}
	f.Feed([]byte(in[prev:]), fn)
	f.Finish(fn)
	return evs, f.Oversized
}

// chunkings returns ways to cut a stream of n bytes: whole, byte by byte,
// at every single offset, and k random cuttings.
func chunkings(n, k int, r *rand.Rand) [][]int {
	out := [][]int{nil}
	bytewise := make([]int, 0, n)
	for i := 1; i < n; i++ {
		bytewise = append(bytewise, i)
		out = append(out, []int{i})
	}
	out = append(out, bytewise)
	for range k {
		var cuts []int
		for i := 1; i < n; i++ {
			if r.IntN(8) == 0 {
				cuts = append(cuts, i)
			}
		}
		out = append(out, cuts)
	}
	return out
}

// checkTiling frames b.in cut at cuts and checks the events against b.want
// and their ranges against the stream: the ranges of the dispatched events
// and b.none must be in order, must not overlap and must cover every byte
// of the input exactly once. An event dispatched at the CR of a CRLF split
// across reads ends before the LF (documented on Event); only then, and
// only when the callback's Framer says AfterCR at that very offset, is the
// LF counted as the event's.
func checkTiling(t *testing.T, b builtStream, limit int, cuts []int, wantOversized int) {
	t.Helper()
	in := b.in
	got, oversized := frameCuts(in, limit, cuts)
	where := func() string { return fmt.Sprintf("stream %q cut at %v", in, cuts) }
	if oversized != wantOversized {
		t.Fatalf("%s: Oversized %d, want %d", where(), oversized, wantOversized)
	}
	if len(got) != len(b.want) {
		t.Fatalf("%s: %d events dispatched (%d dropped), want %d of %d (%d dropped)\n got %+v\nwant %+v",
			where(), len(got), b.total-len(got), len(b.want), b.total, b.total-len(b.want), got, b.want)
	}
	cover := make([]int, len(in))
	for _, r := range b.none {
		for i := r[0]; i < r[1]; i++ {
			cover[i]++
		}
	}
	var prevEnd int64
	for k, g := range got {
		end := g.End
		if g.afterCR && g.offset == g.End && g.End > 0 && g.End < int64(len(in)) && in[g.End-1] == '\r' && in[g.End] == '\n' {
			end++ // the LF of the split CRLF that ended the event
		}
		if g.Start < prevEnd || end < g.Start || end > int64(len(in)) {
			t.Fatalf("%s: event %d range [%d,%d) after %d: out of order, overlapping or outside the stream", where(), k, g.Start, end, prevEnd)
		}
		w := b.want[k]
		if g.Name != w.Name || g.Data != w.Data || g.HasData != w.HasData || g.Partial != w.Partial || g.Start != w.Start || end != w.End {
			t.Fatalf("%s: event %d\n got %+v (end %d)\nwant %+v", where(), k, g.gotEvent, end, w)
		}
		for i := g.Start; i < end; i++ {
			cover[i]++
		}
		prevEnd = end
	}
	for i, c := range cover {
		if c != 1 {
			t.Fatalf("%s: byte %d (%q) covered %d times by events %+v and no-event ranges %v", where(), i, in[i], c, got, b.none)
		}
	}
}

// randomSpec makes a stream with every kind of line the framer handles.
func randomSpec(r *rand.Rand) streamSpec {
	s := streamSpec{bom: r.IntN(6) == 0, trailingStray: r.IntN(3) * r.IntN(2)}
	for e := range 1 + r.IntN(5) {
		ev := tev{stray: r.IntN(3) * r.IntN(2)}
		for range 1 + r.IntN(4) {
			var l string
			switch r.IntN(9) {
			case 0:
				l = ":"
			case 1:
				l = ": keep-alive"
			case 2:
				l = "event: e" + fmt.Sprint(r.IntN(3))
			case 3:
				l = "id: 7"
			case 4:
				l = "data"
			case 5:
				l = "data:  two spaces"
			default:
				l = fmt.Sprintf(`data: {"n":%d}`, e)
			}
			ev.lines = append(ev.lines, l)
		}
		s.events = append(s.events, ev)
	}
	if r.IntN(3) == 0 {
		s.events[len(s.events)-1].partial = true
		s.events[len(s.events)-1].noEOL = r.IntN(2) == 0
		s.trailingStray = 0
	}
	return s
}

// The events' [Start,End) ranges tile the stream: with the stray blank
// lines (which belong to no event) they are contiguous, do not overlap and
// cover every byte exactly once, however the stream is cut into reads.
func TestFramerRangesCoverStream(t *testing.T) {
	fixed := []struct {
		mode int
		spec streamSpec
	}{
		{1, streamSpec{events: []tev{{lines: []string{"data: a"}}, {stray: 1, lines: []string{": c", "data: b", "data: c"}}, {lines: []string{"data: [DONE]"}, partial: true}}}},
		{2, streamSpec{bom: true, events: []tev{{lines: []string{"event: x", "data: 1"}}, {stray: 2, lines: []string{"data: 2"}}}, trailingStray: 1}},
		{0, streamSpec{bom: true, events: []tev{{stray: 1, lines: []string{": only a comment"}}, {lines: []string{"data: tail"}, partial: true, noEOL: true}}}},
		{1, streamSpec{events: []tev{{lines: []string{"data"}}, {lines: []string{"data: x"}, partial: true, noEOL: true}}}},
	}
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]int{}
	check := func(mode int, s streamSpec) {
		features := map[string]bool{"LF": mode == 0, "CRLF": mode == 1, "CR only": mode == 2, "mixed": mode == 3, "BOM": s.bom, "stray": s.trailingStray > 0}
		for _, e := range s.events {
			data := 0
			for _, l := range e.lines {
				switch {
				case strings.HasPrefix(l, ":"):
					features["comment"] = true
				case strings.HasPrefix(l, "data"):
					data++
				case strings.HasPrefix(l, "event:"):
					features["name"] = true
				}
			}
			features["multi-line data"] = features["multi-line data"] || data > 1
			features["stray"] = features["stray"] || e.stray > 0
			features["partial"] = features["partial"] || e.partial
			features["no final EOL"] = features["no final EOL"] || e.noEOL
		}
		for f, has := range features {
			if has {
				seen[f]++
			}
		}
		b := s.build(eols(mode, r))
		for _, cuts := range chunkings(len(b.in), 20, r) {
			checkTiling(t, b, 0, cuts, 0)
		}
	}
	for _, c := range fixed {
		check(c.mode, c.spec)
	}
	for range 300 {
		check(r.IntN(4), randomSpec(r))
	}
	for _, f := range []string{"LF", "CRLF", "CR only", "mixed", "BOM", "stray", "comment", "name", "multi-line data", "partial", "no final EOL"} {
		if seen[f] < 5 {
			t.Errorf("only %d generated streams have %s", seen[f], f)
		}
	}
}

// An event over MaxEventBytes (a line longer than the bound, or data
// longer than it) is dropped whole, never dispatched, however the stream
// is cut; the events after it are dispatched with their exact ranges, and
// the dropped event's bytes belong to no event.
func TestFramerOverflow(t *testing.T) {
	const limit = 16
	x := func(n int) string { return strings.Repeat("x", n) }
	ok := func(data string) tev { return tev{lines: []string{"data: " + data}} }
	cases := []struct {
		name    string
		spec    streamSpec
		dropped int // and counted in Oversized
	}{
		{"data line over the bound", streamSpec{events: []tev{{lines: []string{"data: " + x(64)}, drop: true}, ok("ok")}}, 1},
		{"data over the bound across lines", streamSpec{events: []tev{
			{lines: []string{"data:0123456789a", "data:bcdef", "data: zz", "event: late"}, drop: true}, ok("ok")}}, 1},
		{"data exactly at the bound", streamSpec{events: []tev{{lines: []string{"data:0123456789a", "data:bcde"}}, ok("ok")}}, 0},
		{"line exactly at the bound", streamSpec{events: []tev{{lines: []string{": 23456789abcdef", "data: a"}}, ok("ok")}}, 0},
		{"comment line over the bound", streamSpec{events: []tev{ok("a"), {lines: []string{"data: b", ": 23456789abcdefg"}, drop: true}, ok("c")}}, 1},
		{"tail of a long line looks like a field", streamSpec{events: []tev{
			{lines: []string{"data: " + x(20) + "data: evil"}, drop: true}, {lines: []string{"data: ok"}}}}, 1},
		{"long non-data line", streamSpec{events: []tev{
			{lines: []string{"id: " + x(30), "data: a"}, drop: true}, {stray: 1, lines: []string{"data: ok"}}}, trailingStray: 1}, 1},
		{"several", streamSpec{events: []tev{
			ok("1"), {lines: []string{"data: " + x(40)}, drop: true}, ok("2"),
			{lines: []string{"data: " + x(17)}, drop: true}, {stray: 2, lines: []string{"event: " + x(20), "data: y"}, drop: true},
			ok("3")}}, 3},
		{"oversize partial at EOF", streamSpec{events: []tev{ok("ok"), {lines: []string{"data: " + x(40)}, partial: true, noEOL: true, drop: true}}}, 1},
		{"oversize partial with line ending", streamSpec{events: []tev{ok("ok"), {lines: []string{"data: a", "data: " + x(40)}, partial: true, drop: true}}}, 1},
		{"oversize first line after a BOM", streamSpec{bom: true, events: []tev{{lines: []string{"data: " + x(20)}, drop: true}, ok("ok")}}, 1},
		{"the BOM does not count", streamSpec{bom: true, events: []tev{{lines: []string{": 23456789abcdef", "data: a"}}, ok("ok")}}, 0},
		{"first line one over the bound", streamSpec{events: []tev{{lines: []string{"data:0123456789ab"}, drop: true}, ok("ok")}}, 1},
		{"first line one over the bound after a BOM", streamSpec{bom: true, events: []tev{{lines: []string{": 23456789abcdefg"}, drop: true}, ok("ok")}}, 1},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		for mode, eolName := range []string{"LF", "CRLF", "CR"} {
			t.Run(c.name+"/"+eolName, func(t *testing.T) {
				b := c.spec.build(eols(mode, r))
				if b.total-len(b.want) != c.dropped { // the table agrees with itself
					t.Fatalf("case drops %d events, says %d", b.total-len(b.want), c.dropped)
				}
				for _, cuts := range chunkings(len(b.in), 100, r) {
					checkTiling(t, b, limit, cuts, c.dropped)
				}
			})
		}
	}
}

// Zero MaxEventBytes means 1 MiB, inclusive.
func TestFramerOverflowDefaultBound(t *testing.T) {
	for _, n := range []int{1 << 20, 1<<20 + 1} {
		line := "data:" + strings.Repeat("x", n-5)
		b := streamSpec{events: []tev{{lines: []string{line}, drop: n > 1<<20}, {lines: []string{"data: ok"}}}}.build(eols(0, nil))
		want := 0
		if n > 1<<20 {
			want = 1
		}
		checkTiling(t, b, 0, nil, want)
		checkTiling(t, b, 0, []int{3, n / 2, n + 1}, want)
	}
}

// longestLine returns the length of the longest line of raw (CR, LF and
// CRLF ending lines).
func longestLine(raw string) int {
	longest, n := 0, 0
	for i := 0; i < len(raw); i++ {
		if raw[i] == '\r' || raw[i] == '\n' {
			n = 0
			continue
		}
		n++
		longest = max(longest, n)
	}
	return longest
}

// With a bound, the framer dispatches exactly the events it dispatches
// without one that have no line and no data over the bound, and sets
// counts in Oversized exactly the events it dropped, however the stream
// is cut.
func FuzzFramerBounded(f *testing.F) {
	for _, s := range []string{
		"data: a\n\ndata: " + strings.Repeat("x", 40) + "\n\ndata: b\n\n",
		"data: 0123456789\r\ndata: 0123456789\r\n\r\ndata: ok\r\n\r\n",
		": " + strings.Repeat("c", 30) + "\rdata: a\r\r",
		"data: " + strings.Repeat("x", 20) + "data: evil\n\ndata: ok\n\n",
		"\xEF\xBB\xBFdata: " + strings.Repeat("y", 12) + "\n\n",
		"data: ok\n\ndata: " + strings.Repeat("z", 30),
	} {
		f.Add([]byte(s), uint16(5), uint16(27), uint8(16))
	}
	f.Fuzz(func(t *testing.T, in []byte, a, b uint16, limit uint8) {
		if limit == 0 {
			return // no bound: FuzzFramer
		}
		L := int(limit)
		var want []gotEvent
		wantOversized := 0
		for _, e := range frameAll(string(in)) {
			raw := in[e.Start:e.End]
			if e.Start == 0 {
				raw = bytes.TrimPrefix(raw, bom) // the BOM is no part of a line
			}
			if len(e.Data) > L || longestLine(string(raw)) > L {
				wantOversized++
				continue
			}
			want = append(want, e)
		}
		i, j := int(a)%(len(in)+1), int(b)%(len(in)+1)
		if i > j {
			i, j = j, i
		}
		for _, cuts := range [][]int{nil, {i, j}} {
			got, oversized := frameCuts(string(in), L, cuts)
			if oversized != wantOversized {
				t.Fatalf("%q bound %d cut at %v: Oversized %d, want %d", in, L, cuts, oversized, wantOversized)
			}
			if len(got) != len(want) {
				t.Fatalf("%q bound %d cut at %v: %d events, want %d\n got %+v\nwant %+v", in, L, cuts, len(got), len(want), got, want)
			}
			for k, g := range got {
				w := want[k]
				if g.Name != w.Name || g.Data != w.Data || g.HasData != w.HasData || g.Start != w.Start || g.Partial != w.Partial ||
					(g.End != w.End && !(g.End+1 == w.End && g.afterCR && g.End > 0 && in[g.End-1] == '\r' && in[g.End] == '\n')) {
					t.Fatalf("%q bound %d cut at %v: event %d %+v, want %+v", in, L, cuts, k, g.gotEvent, w)
				}
			}
		}
	})
}
