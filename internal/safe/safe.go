// Package safe makes strings that a client or an engine chose fit to go
// into a metric label value, a span attribute or a log line: valid UTF-8,
// bounded in bytes, cut on a character boundary, and free of the
// characters that break or forge lines (docs/metrics.md, docs/tracing.md).
//
// One invalid string must not cost more than its own value: the OTLP
// exporter refuses a whole batch over one attribute that is not valid
// UTF-8, and Prometheus refuses such a label value.
package safe

import (
	"strings"
	"unicode/utf8"
)

// MaxBytes is the bound String applies when given none: the longest
// model name a record keeps (record.MaxModelBytes).
const MaxBytes = 256

// String returns s made safe, at most max bytes long (max < 1 means
// MaxBytes):
//
//   - each byte that is not part of valid UTF-8 becomes U+FFFD;
//   - each control character (C0 U+0000-U+001F, DEL U+007F, C1
//     U+0080-U+009F) becomes the four characters \xHH (lower-case hex),
//     and the line and paragraph separators U+2028 and U+2029 and the
//     bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
//     U+2066-U+2069), which can make a log line or a page read other than
//     its bytes, become \uXXXX (lower-case hex);
//   - the result is cut at the last character (or escape) that fits in
//     max bytes; a character is never split.
//
// A string that needs none of this (the common case: a printable ASCII
// or clean UTF-8 model name within the bound) is returned as it is, and a
// clean string that is only too long is returned as a substring of s:
// neither allocates.
func String(s string, max int) string {
	if max < 1 {
		max = MaxBytes
	}
	i := 0
	for i < len(s) {
		n := clean(s[i:])
		if n == 0 {
			break
		}
		if i+n > max {
			return s[:i]
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(min(max, len(s)+8))
	b.WriteString(s[:i])
	const hex = "0123456789abcdef"
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			if b.Len()+3 > max {
				return b.String()
			}
			b.WriteRune(utf8.RuneError)
		case r < 0x20 || r >= 0x7f && r <= 0x9f:
			if b.Len()+4 > max {
				return b.String()
			}
			b.WriteString(`\x`)
			b.WriteByte(hex[r>>4])
			b.WriteByte(hex[r&0xf])
		case escaped(r):
			if b.Len()+6 > max {
				return b.String()
			}
			b.WriteString(`\u`)
			b.WriteByte(hex[r>>12&0xf])
			b.WriteByte(hex[r>>8&0xf])
			b.WriteByte(hex[r>>4&0xf])
			b.WriteByte(hex[r&0xf])
		default:
			if b.Len()+n > max {
				return b.String()
			}
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// clean returns the length of the character s starts with when it can be
// kept as it is, or 0 when it must be rewritten; s is not empty.
func clean(s string) int {
	c := s[0]
	if c < utf8.RuneSelf {
		if c >= 0x20 && c != 0x7f {
			return 1
		}
		return 0
	}
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n == 1 || r <= 0x9f || escaped(r) {
		return 0
	}
	return n
}

// escaped reports whether r, a character above U+009F, is written as
// \uXXXX: the line and paragraph separators, and the bidirectional
// controls (embeddings, overrides, isolates and the marks).
func escaped(r rune) bool {
	switch {
	case r == '\u2028' || r == '\u2029':
		return true
	case r == '\u061c' || r == '\u200e' || r == '\u200f':
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}
