package proxy

import (
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// Every member an API's description names for its output-token limit is
// one the peek reads (bodyFields.maxTokens panics on any other).
func TestEveryMaxTokensMemberIsRead(t *testing.T) {
	var b bodyFields
	for _, a := range stream.APIs() {
		for _, name := range a.Request.MaxTokens {
			b.maxTokens(name)
		}
		switch a.Request.Sampling {
		case "", "options", "parameters":
		default:
			t.Errorf("%s: sampling member %q is not read", a.Name, a.Request.Sampling)
		}
	}
}
