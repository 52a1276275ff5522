package record

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// An engine's model or id over its bound is cut on a character
// boundary: a byte cut left half a character, which the record's JSON
// wrote as U+FFFD.
func TestCutKeepsWholeCharacters(t *testing.T) {
	long := strings.Repeat("模", 100) // 300 bytes, 3 a character
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"gpt-4o", 256, "gpt-4o"},
		{long, 256, strings.Repeat("模", 85)},
		{long, 3, "模"},
		{long, 2, ""},
		{"ab" + long, 4, "ab"},
	} {
		got := Cut([]byte(c.in), c.n)
		if got != c.want || !utf8.ValidString(got) || len(got) > c.n {
			t.Errorf("Cut(%d bytes, %d) = %q (%d bytes), want %q", len(c.in), c.n, got, len(got), c.want)
		}
	}
}
