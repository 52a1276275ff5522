package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

var testSecret = bytes.Repeat([]byte{7}, 32)

func feed(body string, names []string) (string, int) {
	var b []byte
	n := canonical([]byte(body), names, func(p []byte) { b = append(b, p...) })
	return string(b), n
}

// The canonical prompt: the API's prompt members in the engine's order
// (tools first) whatever their order in the body, compact whatever the
// client's spacing, the last of duplicated members; nothing else.
func TestCanonical(t *testing.T) {
	names := stream.APIChat.Request.Prompt
	a, na := feed(`{"model":"m","messages":[{"role":"user","content":"hi there"}],"tools":[{"type":"function"}]}`, names)
	b, nb := feed("{\n  \"tools\": [ {\"type\": \"function\"} ],\n  \"messages\": [\n {\"role\": \"user\", \"content\": \"hi there\"}\n ], \"temperature\": 0.5, \"model\": \"other\"}", names)
	want := "tools\x00[{\"type\":\"function\"}]\x00messages\x00[{\"role\":\"user\",\"content\":\"hi there\"}]\x00"
	if a != want || b != want || na != 2 || nb != 2 {
		t.Errorf("canonical:\n%q (%d)\n%q (%d)\nwant %q", a, na, b, nb, want)
	}
	if c, _ := feed(`{"prompt":"a  b\" \\\" c"}`, stream.APICompletions.Request.Prompt); c != "prompt\x00\"a  b\\\" \\\\\\\" c\"\x00" {
		t.Errorf("spaces inside a string are kept: %q", c)
	}
	if c, n := feed(`{"messages":[1],"messages":[2]}`, names); c != "messages\x00[2]\x00" || n != 1 {
		t.Errorf("duplicate member: %q %d", c, n)
	}
	// A prefix of a body: the members complete within it.
	if c, n := feed(`{"tools":[],"messages":[{"role":"user","content":"hi`, names); c != "tools\x00[]\x00" || n != 1 {
		t.Errorf("partial body: %q %d", c, n)
	}
	if _, n := feed(`not json`, names); n != 0 {
		t.Errorf("not JSON: %d members", n)
	}
}

func TestCanonicalAllocs(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi there"}],"tools":[{"type":"function"}]}`)
	n := 0
	w := func(p []byte) { n += len(p) }
	if a := testing.AllocsPerRun(100, func() { canonical(body, stream.APIChat.Request.Prompt, w) }); a != 0 {
		t.Errorf("canonical allocates %v times", a)
	}
}

// ids of a prompt of in tokens, hashed whole.
func ids(t *testing.T, prompt string, in int64, nonce []byte) [][digestBytes]byte {
	t.Helper()
	c := newChain(testSecret, 2048)
	var seed [32]byte
	c.reset(seed)
	c.write([]byte(prompt))
	c.finish()
	b := c.ids(nil, in, 512, nonce)
	out := make([][digestBytes]byte, len(b)/digestBytes)
	for i := range out {
		out[i] = [digestBytes]byte(b[i*digestBytes:])
	}
	return out
}

func common(a, b [][digestBytes]byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// The id rules: ceil(input_length/512) ids; a shared prefix of k whole
// blocks is k shared ids; a first block that differs shares none; ids
// past the bytes hashed are the request's own when it was not hashed
// whole; a last partial block is its own.
func TestIDRules(t *testing.T) {
	x := strings.Repeat("x", 3*2048)
	a := x + strings.Repeat("a", 3000)
	b := x + strings.Repeat("b", 3000)
	for _, in := range []int64{0, 1, 511, 512, 513, 5000} {
		if got := len(ids(t, a, in, nil)); int64(got) != (in+511)/512 {
			t.Errorf("input_length %d: %d ids", in, got)
		}
	}
	if n := common(ids(t, a, 2048, nil), ids(t, b, 2048, nil)); n != 3 {
		t.Errorf("3 blocks in common: %d ids shared", n)
	}
	if n := common(ids(t, "y"+a, 2048, nil), ids(t, a, 2048, nil)); n != 0 {
		t.Errorf("first block differs: %d ids shared", n)
	}
	// Past the bytes: the same prompt, hashed whole, shares its derived
	// ids; a partial one does not.
	if n := common(ids(t, "short", 4096, nil), ids(t, "short", 4096, nil)); n != 8 {
		t.Errorf("same prompt: %d of 8 ids shared", n)
	}
	if n := common(ids(t, x, 4096, []byte("nonce-1")), ids(t, x, 4096, []byte("nonce-2"))); n != 3 {
		t.Errorf("partial prompts share %d ids, want the 3 hashed blocks only", n)
	}
	// A last partial block differs from the full block it starts.
	if n := common(ids(t, a, 1500, nil), ids(t, a, 2048, nil)); n != 2 {
		t.Errorf("partial last block: %d shared, want 2", n)
	}
}

func open(t *testing.T, o Options) (*Capture, string) {
	t.Helper()
	if o.Path == "" {
		o.Path = filepath.Join(t.TempDir(), "capture.jsonl")
	}
	o.Secret = testSecret
	c, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return c, o.Path
}

func rec(at time.Time, in, out int64) *record.Record {
	r := record.New(0)
	r.Arrive, r.API, r.Outcome, r.InputTokens, r.OutputTokens, r.TokenSource = at, stream.NameChat, record.Success, in, out, "usage"
	r.Terminal = at.Add(time.Second)
	return r
}

const body = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

func read(t *testing.T, path string) []workload.Request {
	t.Helper()
	r, c, err := workload.Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []workload.Request
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, q)
	}
}

// Lines go out in arrival order: a request that ended first waits for
// the earlier arrival still in flight.
func TestArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{})
		t0 := time.Now()
		a := c.Track(Request{Arrive: t0, API: stream.NameChat, Body: []byte(body)})
		b := c.Track(Request{Arrive: t0.Add(10 * time.Millisecond), API: stream.NameChat, Body: []byte(body)})
		b.End(rec(t0.Add(10*time.Millisecond), 2, 2), "m")
		if st := c.Stats(); st.Held != 1 {
			t.Errorf("held %d, want 1 (waiting for the earlier arrival)", st.Held)
		}
		a.End(rec(t0, 1, 1), "m")
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := read(t, path)
		if len(got) != 2 || got[0].Timestamp != 0 || got[0].InputLength != 1 || got[1].Timestamp != 10 || got[1].InputLength != 2 {
			t.Errorf("lines %+v", got)
		}
		if got[0].Tokentap == nil || got[0].Tokentap.BlockSize != 512 || got[0].Tokentap.HashIDsFrom != "prompt" {
			t.Errorf("meta %+v", got[0].Tokentap)
		}
	})
}

// When the hold is full, the oldest line goes out, and a request that
// arrived before it and ends later is dropped as late, counted.
func TestHoldFullDropsLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{Hold: 2})
		t0 := time.Now()
		slow := c.Track(Request{Arrive: t0, API: stream.NameChat})
		for i := range 3 {
			at := t0.Add(time.Duration(i+1) * time.Millisecond)
			c.Track(Request{Arrive: at, API: stream.NameChat}).End(rec(at, 1, 1), "m")
		}
		slow.End(rec(t0, 1, 1), "m")
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st := c.Stats(); st.Late != 1 || st.Written != 3 {
			t.Errorf("stats %+v, want 3 written, 1 late", st)
		}
		if got := read(t, path); len(got) != 3 || got[0].Timestamp != 0 {
			t.Errorf("lines %+v", got)
		}
	})
}

// A request whose body took a while to read (it began after a later
// arrival ended) still goes first while within Settle; the held lines
// go out by themselves once Settle has passed.
func TestSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{Settle: time.Second})
		t0 := time.Now()
		time.Sleep(100 * time.Millisecond)
		late := t0.Add(50 * time.Millisecond)
		c.Track(Request{Arrive: late, API: stream.NameChat}).End(rec(late, 2, 2), "m")
		c.Track(Request{Arrive: t0, API: stream.NameChat}).End(rec(t0, 1, 1), "m")
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if st := c.Stats(); st.Held != 0 || st.Late != 0 {
			t.Errorf("after Settle: %+v", st)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := read(t, path); len(got) != 2 || got[0].InputLength != 1 || got[1].Timestamp != 50 {
			t.Errorf("lines %+v", got)
		}
	})
}

// A rotated file (rename, then Reopen as on SIGHUP) starts again: its
// first timestamp is 0 and its ids are numbered from 0.
func TestRotationRestarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{})
		t0 := time.Now()
		one := func(at time.Time, prompt string) {
			b, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": prompt}}})
			c.Track(Request{Arrive: at, API: stream.NameChat, Body: b}).End(rec(at, 1500, 1), "m")
		}
		one(t0, strings.Repeat("a", 9000))
		one(t0.Add(time.Second), strings.Repeat("b", 9000))
		time.Sleep(10 * time.Second) // past Settle: written
		synctest.Wait()
		if err := os.Rename(path, path+".1"); err != nil {
			t.Fatal(err)
		}
		if err := c.Reopen(); err != nil {
			t.Fatal(err)
		}
		one(t0.Add(20*time.Second), strings.Repeat("b", 9000))
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		old, cur := read(t, path+".1"), read(t, path)
		if len(old) != 2 || old[1].Timestamp != 1000 || old[1].HashIDs[0] != 3 {
			t.Fatalf("rotated file %+v", old)
		}
		if len(cur) != 1 || cur[0].Timestamp != 0 || cur[0].HashIDs[0] != 0 || cur[0].HashIDs[2] != 2 {
			t.Errorf("new file %+v", cur)
		}
	})
}

// The id table is bounded: when a generation is full the older one is
// forgotten (counted); a digest seen again keeps its number while in
// either generation.
func TestTableTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{MaxIDs: 4})
		t0 := time.Now()
		for i := range 6 {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			b, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat(string(rune('a'+i%3)), 3000)}}})
			c.Track(Request{Arrive: at, API: stream.NameChat, Body: b}).End(rec(at, 512, 1), "m")
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := read(t, path)
		for i, want := range []int64{0, 1, 2, 0, 1, 2} {
			if got[i].HashIDs[0] != want {
				t.Errorf("line %d: id %d, want %d", i+1, got[i].HashIDs[0], want)
			}
		}
		if c.Stats().TableTurns != 0 {
			t.Errorf("turns %d with 3 ids in a table of 4", c.Stats().TableTurns)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		c, _ := open(t, Options{MaxIDs: 2})
		t0 := time.Now()
		for i := range 8 {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			b, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat(string(rune('a'+i)), 3000)}}})
			c.Track(Request{Arrive: at, API: stream.NameChat, Body: b}).End(rec(at, 512, 1), "m")
		}
		c.Close(context.Background())
		if c.Stats().TableTurns == 0 {
			t.Error("8 distinct ids in a table of 2: no turn counted")
		}
	})
}

// Lengths the engine did not give are said so: estimated from the
// prompt's bytes, or none.
func TestLengthsFrom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{})
		t0 := time.Now()
		r := rec(t0, -1, 7)
		r.TokenSource = "events"
		c.Track(Request{Arrive: t0, API: stream.NameChat, Body: []byte(body)}).End(r, "m")
		r = rec(t0.Add(time.Millisecond), -1, -1)
		r.TokenSource = "none"
		c.Track(Request{Arrive: t0.Add(time.Millisecond), API: stream.NameChat, Body: []byte(body), Partial: true}).End(r, "m")
		c.Close(context.Background())
		got := read(t, path)
		canon, _ := feed(body, stream.APIChat.Request.Prompt)
		if m := got[0].Tokentap; got[0].InputLength != int64((len(canon)+3)/4) || m.InputLengthFrom != "estimate" || m.OutputLengthFrom != "estimate" || got[0].OutputLength != 7 {
			t.Errorf("estimated: %+v %+v", got[0], m)
		}
		if m := got[1].Tokentap; got[1].InputLength != 0 || m.InputLengthFrom != "none" || m.OutputLengthFrom != "none" || m.HashIDsFrom != "partial" {
			t.Errorf("none: %+v %+v", got[1], m)
		}
	})
}

// An engine's prompt_tokens past workload.MaxInputLength (the most a
// replay reads; 10^15, 2^63-1) sizes
// no line: it is not believed, and the estimate from the prompt's bytes
// is written, as when the engine gave none (one id per 512 tokens of
// 10^15 asked for terabytes; 2^63-1 overflowed into a panic).
func TestClaimedInputLengthBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{})
		t0 := time.Now()
		for i, claim := range []int64{workload.MaxInputLength + 1, 1e15, math.MaxInt64} {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			c.Track(Request{Arrive: at, API: stream.NameChat, Body: []byte(body)}).End(rec(at, claim, 7), "m")
		}
		c.Close(context.Background())
		got := read(t, path)
		canon, _ := feed(body, stream.APIChat.Request.Prompt)
		if len(got) != 3 {
			t.Fatalf("%d lines, want 3", len(got))
		}
		for _, l := range got {
			if l.InputLength != int64((len(canon)+3)/4) || l.Tokentap.InputLengthFrom != "estimate" || len(l.HashIDs) != 1 {
				t.Errorf("%+v %+v, want the estimate", l, l.Tokentap)
			}
		}
	})
}

// An engine's completion_tokens past what a replay reads (2^31-1) is
// not written as the output length: none is.
func TestClaimedOutputLengthBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{})
		t0 := time.Now()
		r := rec(t0, 12, math.MaxInt32+1)
		r.TokenSource = "usage"
		c.Track(Request{Arrive: t0, API: stream.NameChat, Body: []byte(body)}).End(r, "m")
		c.Close(context.Background())
		got := read(t, path)
		if len(got) != 1 || got[0].OutputLength != 0 || got[0].Tokentap.OutputLengthFrom != "none" || got[0].InputLength != 12 {
			t.Errorf("%+v, want output_length 0 from none", got)
		}
	})
}

// Only the Mooncake keys with NoMeta; the pass-through APIs are not
// captured.
func TestNoMetaAndPassThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, path := open(t, Options{NoMeta: true})
		t0 := time.Now()
		if e := c.Track(Request{Arrive: t0, API: stream.NameOther}); e != nil {
			t.Error("an API the sidecar does not parse is captured")
		}
		c.Track(Request{Arrive: t0, API: stream.NameChat, Body: []byte(body)}).End(rec(t0, 1, 1), "m")
		c.Close(context.Background())
		b, _ := os.ReadFile(path)
		if want := `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[0]}` + "\n"; string(b) != want {
			t.Errorf("got %s want %s", b, want)
		}
	})
}

func TestSecret(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "k")
	k1, err := LoadSecret(p)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 || len(k1) != 64 {
		t.Errorf("generated secret: mode %v, %d bytes", st.Mode().Perm(), len(k1))
	}
	k2, err := LoadSecret(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Errorf("reloaded: %v", err)
	}
	os.Chmod(p, 0o644)
	if _, err := LoadSecret(p); err == nil || !strings.Contains(err.Error(), "0600") {
		t.Errorf("a secret others may read: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "short"), []byte("abcd\n"), 0o600)
	if _, err := LoadSecret(filepath.Join(dir, "short")); err == nil {
		t.Error("a short secret is accepted")
	}
}

// A non-empty file at the path is moved aside, never appended to.
func TestMoveAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	os.WriteFile(path, []byte(`{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[0]}`+"\n"), 0o644)
	c, _ := open(t, Options{Path: path})
	c.Close(context.Background())
	m, _ := filepath.Glob(path + ".*")
	if st, err := os.Stat(path); err != nil || st.Size() != 0 || len(m) != 1 {
		t.Errorf("old file not moved aside: %v %v", m, err)
	}
}
