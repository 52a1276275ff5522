package record

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileEncodeFresh: with Encode, items become lines on the writer,
// and the first item bound for each file opened (the first, a reopen
// after rotation) is told so: a capture restarts its time origin there.
func TestFileEncodeFresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capture.jsonl")
	n := 0
	enc := func(dst, item []byte, fresh bool) []byte {
		if fresh {
			n = 0
		}
		n++
		return fmt.Appendf(dst, "%s %d\n", item, n)
	}
	f, err := OpenFile(path, FileOptions{Encode: enc})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		f.WriteItem(fmt.Appendf(nil, "a%d", i))
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		f.WriteItem(fmt.Appendf(nil, "b%d", i))
	}
	closeFile(t, f)
	for _, c := range []struct{ path, want string }{
		{path + ".1", "a0 1\na1 2\na2 3\n"},
		{path, "b0 1\nb1 2\n"},
	} {
		b, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("%s:\n%s\nwant\n%s", filepath.Base(c.path), b, strings.TrimSpace(c.want))
		}
	}
	if st := f.Stats(); st != (FileStats{Written: 5}) {
		t.Fatalf("stats %+v", st)
	}
}
