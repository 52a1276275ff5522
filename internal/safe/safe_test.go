package safe

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"
)

// unsafeRune reports a character String must never let through.
func unsafeRune(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || r == '\u2028' || r == '\u2029' ||
		r == '\u061c' || r == '\u200e' || r == '\u200f' || r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069'
}

func check(t *testing.T, in, out string, max int) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("String(%q, %d) = %q: not valid UTF-8", in, max, out)
	}
	if len(out) > max {
		t.Fatalf("String(%q, %d) = %q: %d bytes", in, max, out, len(out))
	}
	if i := strings.IndexFunc(out, unsafeRune); i >= 0 {
		t.Fatalf("String(%q, %d) = %q: control character at %d", in, max, out, i)
	}
}

func TestString(t *testing.T) {
	multi := strings.Repeat("é", 150) // 300 bytes, two per character
	for _, c := range []struct{ name, in, want string }{
		{"ascii", "llama-3-8b", "llama-3-8b"},
		{"clean UTF-8", "模型-é", "模型-é"},
		{"invalid UTF-8", "m\xffo\xc3", "m\uFFFDo\uFFFD"},
		{"an encoded surrogate", "a\xed\xa0\x80", "a\uFFFD\uFFFD\uFFFD"},
		{"CR LF", "model\r\nfake_metric 1", `model\x0d\x0afake_metric 1`},
		{"ESC", "\x1b[31mred", `\x1b[31mred`},
		{"NUL", "a\x00b", `a\x00b`},
		{"DEL and C1", "a\x7fb\u0085c\u009bd", `a\x7fb\x85c\x9bd`},
		{"U+2028 and U+2029", "a\u2028b\u2029c", `a\u2028b\u2029c`},
		{"U+FFFD kept", "a\uFFFDb", "a\uFFFDb"},
		{"bidi overrides and isolates", "a\u202eb\u202ac\u2066d\u2069e", `a\u202eb\u202ac\u2066d\u2069e`},
		{"bidi marks", "\u200e\u200f\u061c", `\u200e\u200f\u061c`},
		{"near the bidi ranges, kept", "\u2029x\u202f\u2065\u206a\u200d", `\u2029x` + "\u202f\u2065\u206a\u200d"},
		{"a bidi escape that does not fit", strings.Repeat("a", 251) + "\u202e", strings.Repeat("a", 251)},
		{"300 bytes of 2-byte characters", multi, strings.Repeat("é", 128)},
		{"cut inside a 3-byte character", strings.Repeat("a", 255) + "模", strings.Repeat("a", 255)},
		{"an escape that does not fit", strings.Repeat("a", 253) + "\x1b", strings.Repeat("a", 253)},
		{"U+FFFD that does not fit", strings.Repeat("a", 254) + "\xff", strings.Repeat("a", 254)},
		{"dirty then cut", "\x00" + multi, `\x00` + strings.Repeat("é", 126)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := String(c.in, 0)
			if got != c.want {
				t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
			}
			check(t, c.in, got, MaxBytes)
		})
	}
	if got := String("abcdef", 3); got != "abc" {
		t.Errorf("String(abcdef, 3) = %q", got)
	}
}

// The common path allocates nothing: a clean string comes back as itself,
// a clean string that is too long as a substring.
func TestStringZeroAllocs(t *testing.T) {
	long := strings.Repeat("模型", 100)
	var sink string
	if n := testing.AllocsPerRun(100, func() {
		sink = String("Qwen/Qwen2.5-7B-Instruct", 0)
		sink = String("chatcmpl-9a8b7c6d5e", 0)
		sink = String("模型-é", 0)
		sink = String(long, 0)
	}); n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
	_ = sink
}

func FuzzSanitise(f *testing.F) {
	for _, s := range []string{"", "llama", "a\xffb", "\r\n\x1b\x00", "\u2028\u2029\u0085", strings.Repeat("é", 150)} {
		f.Add(s, 0)
		f.Add(s, 5)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		out := String(s, max)
		if max < 1 {
			max = MaxBytes
		}
		check(t, s, out, max)
		// Whatever was clean in s is kept: a clean s within the bound
		// comes back whole.
		if utf8.ValidString(s) && len(s) <= max && strings.IndexFunc(s, unsafeRune) < 0 && out != s {
			t.Fatalf("String(%q, %d) = %q: a clean string changed", s, max, out)
		}
	})
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewJSONHandler(&buf, nil))).With("peer", "h\x1bost")
	log.WithGroup("up").Warn("upstream said \u2028forged",
		"status", "200 OK\r\nlevel=ERROR", "err", errors.New("bad \xff byte"), "n", 3,
		slog.Group("g", "model", strings.Repeat("x", MaxLogBytes+10)))
	out := buf.String()
	for _, want := range []string{`"msg":"upstream said \\u2028forged"`, `"peer":"h\\x1bost"`, `"status":"200 OK\\x0d\\x0alevel=ERROR"`,
		`"err":"bad ` + "\uFFFD" + ` byte"`, `"n":3`, `"model":"` + strings.Repeat("x", MaxLogBytes) + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %s:\n%s", want, out)
		}
	}
	h := Handler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if h.Enabled(context.Background(), slog.LevelInfo) || !h.Enabled(context.Background(), slog.LevelWarn) {
		t.Error("Enabled is not the wrapped handler's")
	}
}
