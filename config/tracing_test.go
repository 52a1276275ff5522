package config

import (
	"fmt"
	"strings"
	"testing"
)

// tracing.redact is bounded in count and in each pattern's size; each
// problem is named, a bad pattern among them.
func TestTracingRedactBounds(t *testing.T) {
	at := Tracing{Redact: make([]string, MaxRedactPatterns)}
	for i := range at.Redact {
		at.Redact[i] = fmt.Sprintf(`secret-%d`, i)
	}
	at.Redact[0] = strings.Repeat("a", MaxRedactPatternBytes)
	if errs := at.Validate(); len(errs) != 0 {
		t.Fatalf("at the bounds: %v", errs)
	}
	over := Tracing{Redact: append(append([]string{}, at.Redact...), strings.Repeat("b", MaxRedactPatternBytes+1), `(`)}
	var got []string
	for _, e := range over.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		fmt.Sprintf("tracing.redact: %d patterns, at most %d", MaxRedactPatterns+2, MaxRedactPatterns),
		fmt.Sprintf("tracing.redact[%d]: %d bytes, at most %d", MaxRedactPatterns, MaxRedactPatternBytes+1, MaxRedactPatternBytes),
		"tracing.redact: error parsing regexp",
	}
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d: %q", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("error %d = %q, want it to start %q", i, got[i], w)
		}
	}
}
