package tracing

import (
	"strings"
	"testing"
)

// The default redactions catch API keys of any realistic length and the
// common token shapes, and leave ordinary text alone.
func TestDefaultRedactions(t *testing.T) {
	c := &ContentCapture{Redact: DefaultRedactions(), MaxBytes: 1 << 20}
	for _, secret := range []string{
		"sk-abcd1234",                                     // short OpenAI-style key
		"sk-proj-AbCdEfGh1234_5678-90abcdef",              // project key
		"sk-ant-api03-" + strings.Repeat("x", 90) + "-AA", // Anthropic key
		"Bearer abcdef.123456-xyz",
		"bearer " + strings.Repeat("Z", 200),
		"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", // JWT
		"AKIAIOSFODNN7EXAMPLE", // AWS access key id
		"bob@example.com",
	} {
		got := c.clean("before " + secret + " after")
		if strings.Contains(got, secret) || !strings.Contains(got, "[REDACTED]") || !strings.HasPrefix(got, "before ") || !strings.HasSuffix(got, " after") {
			t.Errorf("%q → %q", secret, got)
		}
	}
	for _, ok := range []string{"a task-list for the sk-team", "the bearer of bad news", "AKIA is a prefix", "eyJ alone"} {
		if got := c.clean(ok); got != ok {
			t.Errorf("ordinary text %q was changed to %q", ok, got)
		}
	}
}

// Truncation keeps UTF-8 whole and says it truncated.
func TestCleanTruncates(t *testing.T) {
	c := &ContentCapture{MaxBytes: 5}
	if got := c.clean("ééééé"); got != "éé…[truncated]" {
		t.Fatalf("%q", got)
	}
}
