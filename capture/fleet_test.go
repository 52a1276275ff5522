package capture

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Fleet ids: two captures with one secret write the same ids for the
// same prompt (and session), whatever else each saw first; every line
// names its replica and its file's start, and start_unix_ms + timestamp
// is the arrival's whole millisecond. Another secret shares nothing.
func TestFleetIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		other := []byte(`{"model":"m","messages":[{"role":"user","content":"something else entirely"}]}`)
		t0 := time.Now().Add(1234567 * time.Nanosecond) // not on a millisecond
		write := func(name string, secret []byte, first []byte) string {
			path := filepath.Join(dir, name+".jsonl")
			c, err := Open(Options{Path: path, Secret: secret, Fleet: true, Replica: name, SessionHeader: "X-S"})
			if err != nil {
				t.Fatal(err)
			}
			c.Track(Request{Arrive: t0, API: stream.NameChat, Body: first}).End(rec(t0, 1500, 1), "m")
			at := t0.Add(2500 * time.Microsecond)
			c.Track(Request{Arrive: at, API: stream.NameChat, Body: []byte(body), Session: "conv-1"}).End(rec(at, 1500, 1), "m")
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			return path
		}
		a := read(t, write("pod-a", testSecret, other))
		b := read(t, write("pod-b", testSecret, []byte(body)))
		c := read(t, write("pod-c", bytes.Repeat([]byte{8}, 32), []byte(body)))
		if len(a) != 2 || len(b) != 2 || len(c) != 2 {
			t.Fatalf("lines %d %d %d", len(a), len(b), len(c))
		}
		if !slices.Equal(a[1].HashIDs, b[1].HashIDs) || !slices.Equal(b[0].HashIDs, b[1].HashIDs) || len(a[1].HashIDs) != 3 {
			t.Errorf("same prompt, same secret: ids %v %v %v", a[1].HashIDs, b[0].HashIDs, b[1].HashIDs)
		}
		if a[1].SessionID == "" || a[1].SessionID != b[1].SessionID || a[1].SessionID == c[1].SessionID {
			t.Errorf("session ids %q %q %q", a[1].SessionID, b[1].SessionID, c[1].SessionID)
		}
		if slices.Equal(a[0].HashIDs[:1], a[1].HashIDs[:1]) || a[1].HashIDs[0] == c[1].HashIDs[0] {
			t.Errorf("different prompts or secrets share ids: %v %v %v", a[0].HashIDs, a[1].HashIDs, c[1].HashIDs)
		}
		for _, l := range append(a, b...) {
			for _, id := range l.HashIDs {
				if id < 0 || id >= 1<<FleetIDBits {
					t.Errorf("id %d is not a 53-bit integer", id)
				}
			}
			m := l.Tokentap
			if m == nil || m.IDs != "fleet" || m.Replica == "" || m.API != "chat" || m.BlockSize != 512 {
				t.Fatalf("meta %+v", m)
			}
			want := t0.UnixMilli()
			if l.Line == 2 {
				want = t0.Add(2500 * time.Microsecond).UnixMilli()
			}
			if m.StartUnixMs+l.Timestamp != want || m.StartUnixMs != t0.UnixMilli() {
				t.Errorf("line %d: start %d + timestamp %d, want %d", l.Line, m.StartUnixMs, l.Timestamp, want)
			}
		}
		if a[0].Tokentap.Replica != "pod-a" || b[0].Tokentap.Replica != "pod-b" {
			t.Errorf("replicas %q %q", a[0].Tokentap.Replica, b[0].Tokentap.Replica)
		}
		raw, _ := os.ReadFile(filepath.Join(dir, "pod-a.jsonl"))
		if !strings.Contains(string(raw), `"tokentap":{"ids":"fleet","replica":"pod-a","start_unix_ms":`) {
			t.Errorf("line %s", raw)
		}
	})
	if _, err := Open(Options{Path: filepath.Join(t.TempDir(), "x.jsonl"), Secret: testSecret, Fleet: true, NoMeta: true}); err == nil {
		t.Error("fleet ids without the tokentap member: opened")
	}
}
