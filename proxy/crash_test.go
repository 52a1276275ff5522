package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// setPath sets the member at a dotted path ("options.num_predict") of m
// to v, making the objects on the way.
func setPath(m map[string]any, path string, v any) {
	top, rest, nested := strings.Cut(path, ".")
	if !nested {
		m[top] = v
		return
	}
	inner, _ := m[top].(map[string]any)
	if inner == nil {
		inner = map[string]any{}
		m[top] = inner
	}
	setPath(inner, rest, v)
}

func deletePath(m map[string]any, path string) {
	top, rest, nested := strings.Cut(path, ".")
	if !nested {
		delete(m, top)
		return
	}
	if inner, ok := m[top].(map[string]any); ok {
		deletePath(inner, rest)
	}
}

// A client's output-token limit of 2^63-1, under every name of every
// API's request description (max_tokens, max_completion_tokens,
// Messages' max_tokens, Responses' max_output_tokens, Ollama's
// options.num_predict, TGI's parameters.max_new_tokens, llama.cpp's
// n_predict, Gemini's generationConfig.maxOutputTokens), is a claim, not
// a size: the request is forwarded byte for byte, answered and recorded
// with that limit (issue 40, item 1: the record's capacity hint
// overflowed and make panicked, and the client got no answer).
func TestHugeMaxTokensForwardedAnsweredRecorded(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []byte
	)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = b
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	n := 0
	for _, a := range stream.APIs() {
		if a.Probe == nil {
			continue
		}
		for _, name := range a.Request.MaxTokens {
			t.Run(a.Name+"/"+name, func(t *testing.T) {
				fs, sink := front(t, up, Options{Engine: a.Engine})
				target, m := a.Probe(stream.ProbeParams{Model: "m", Prompt: "p", MaxTokens: 1})
				for _, other := range a.Request.MaxTokens {
					deletePath(m, other)
				}
				setPath(m, name, int64(math.MaxInt64))
				body, _ := json.Marshal(m)
				if !bytes.Contains(body, []byte("9223372036854775807")) {
					t.Fatalf("no limit in %s", body)
				}
				resp, got := do(t, fs, target, string(body))
				if resp.StatusCode != http.StatusOK || got != `{}` {
					t.Fatalf("answer %d %q, want 200 {}", resp.StatusCode, got)
				}
				mu.Lock()
				fwd := seen
				mu.Unlock()
				if !bytes.Equal(fwd, body) {
					t.Errorf("forwarded %s, want %s", fwd, body)
				}
				rec := only(t, sink)
				if rec.API != record.API(a.Name) || rec.MaxTokens != math.MaxInt64 || rec.Outcome != record.Success || rec.HTTPStatus != http.StatusOK {
					t.Errorf("record: api %s max_tokens %d outcome %s status %d", rec.API, rec.MaxTokens, rec.Outcome, rec.HTTPStatus)
				}
				if c := cap(rec.TokenAt); c != record.MaxHint {
					t.Errorf("room for %d token events, want %d", c, record.MaxHint)
				}
			})
			n++
		}
	}
	if n < 9 {
		t.Fatalf("%d token-limit names tried", n)
	}
}
