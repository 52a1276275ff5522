package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// The peek reads what every API's request description says, from the
// request its canary probe sends: the model (from the path where the
// body names none), the stream flag, the output-token limit and the
// temperature.
func TestPeekReadsEveryAPIsProbeRequest(t *testing.T) {
	for _, a := range stream.APIs() {
		if a.Probe == nil {
			continue
		}
		for _, streamed := range []bool{true, false} {
			target, m := a.Probe(stream.ProbeParams{Model: "m-1", Prompt: "p", MaxTokens: 7, Temperature: 0.5, Seed: 3, Stream: streamed})
			body, _ := json.Marshal(m)
			path, _, _ := strings.Cut(target, "?") // the peek reads the URL's path
			in, _, _, err := peek(io.NopCloser(bytes.NewReader(body)), a, path, 1<<20, int64(len(body)), false, nil)
			if err != nil {
				t.Fatal(err)
			}
			model := "m-1"
			if !bytes.Contains(body, []byte(`"model"`)) && a.Request.ModelFromPath == nil {
				model = "" // TGI and llama.cpp name no model
			}
			if in.Model != model || in.Stream != streamed || in.MaxTokens != 7 || in.Temperature == nil || *in.Temperature != 0.5 || !in.Whole {
				t.Errorf("%s (stream %v) %s %s: %+v", a.Name, streamed, path, body, in)
			}
		}
	}
}
