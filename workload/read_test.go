package workload

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func readAll(t *testing.T, trace, side string) ([]Request, error) {
	t.Helper()
	opts := ReaderOptions{Name: "t.jsonl", MaxLineBytes: 256}
	if side != "" {
		opts.Side = strings.NewReader(side)
	}
	r := NewReader(strings.NewReader(trace), opts)
	var out []Request
	for {
		req, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			if _, again := r.Next(); again != err {
				t.Errorf("Next after %v returned %v, want the same error", err, again)
			}
			return out, err
		}
		out = append(out, req)
	}
}

// The forms the reader accepts: AIPerf's mooncake_trace lines,
// GenAI-Perf's payload lines (float timestamps, numeric session ids,
// text in place of lengths), tokentap's own with its member inline.
func TestReadForms(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}

{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47], "priority": 1}
{"timestamp": 10535.5, "text_input": "hi there", "session_id": 7}
{"timestamp": 20000, "text": "x", "input_length": 3, "session_id": "s-1"}
{"timestamp": 20001, "input_length": 1, "output_length": 1, "hash_ids": [0], "tokentap": {"api": "chat", "outcome": "success", "ttft_ms": 12.5, "input_length_from": "engine", "output_length_from": "engine", "stream": true}}`
	got, err := readAll(t, trace, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("%d requests, want 5", len(got))
	}
	if g := got[0]; g.Line != 1 || g.InputLength != 655 || g.OutputLength != 52 || !g.HasOutputLength || len(g.HashIDs) != 2 {
		t.Errorf("line 1: %+v", g)
	}
	if g := got[1]; g.Line != 3 || g.Timestamp != 10535 {
		t.Errorf("blank line: the second request is line %d at %d, want 3 at 10535", g.Line, g.Timestamp)
	}
	if g := got[2]; g.Text != "hi there" || g.SessionID != "7" || g.HasOutputLength || g.Timestamp != 10535 {
		t.Errorf("payload line: %+v", g)
	}
	if g := got[3]; g.Text != "x" || g.InputLength != 3 || g.SessionID != "s-1" {
		t.Errorf("text line: %+v", g)
	}
	if g := got[4]; g.Tokentap == nil || g.Tokentap.API != "chat" || g.Tokentap.TTFTMs == nil || *g.Tokentap.TTFTMs != 12.5 {
		t.Errorf("inline tokentap member: %+v", g.Tokentap)
	}
}

// The side file's Meta lines join their entries by line number; lines
// without one get none.
func TestReadSideFile(t *testing.T) {
	trace := "{\"timestamp\":0,\"input_length\":1}\n{\"timestamp\":1,\"input_length\":2}\n{\"timestamp\":2,\"input_length\":3}\n"
	side := `{"line":1,"api":"chat","outcome":"success"}
{"line":3,"api":"completions","outcome":"error"}
`
	got, err := readAll(t, trace, side)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Tokentap == nil || got[0].Tokentap.API != "chat" || got[1].Tokentap != nil || got[2].Tokentap == nil || got[2].Tokentap.Outcome != "error" {
		t.Errorf("side file not joined: %+v %+v %+v", got[0].Tokentap, got[1].Tokentap, got[2].Tokentap)
	}
	if _, err := readAll(t, trace, "{\"line\":2,\"api\":\"x\"}\n{\"line\":1}\n"); err == nil || !strings.Contains(err.Error(), "t.jsonl.tokentap.jsonl:2") {
		t.Errorf("side file out of order: %v, want an error naming its line 2", err)
	}
}

// Bad input: every error names the file and the line.
func TestReadErrors(t *testing.T) {
	for _, c := range []struct{ name, trace, want string }{
		{"malformed", "{\"timestamp\":0,\"input_length\":1}\n{\"timestamp\":1,\"input_length\":\n", "t.jsonl:2: not a JSON object"},
		{"truncated", "{\"timestamp\":0,\"input_length\":1}\n{\"timestamp\":1,\"inp", "t.jsonl:2: truncated"},
		{"decreasing", "{\"timestamp\":5,\"input_length\":1}\n{\"timestamp\":4,\"input_length\":1}\n", "t.jsonl:2: timestamp decreases: 4 after 5"},
		{"no timestamp", "{\"input_length\":1}\n", "t.jsonl:1: no timestamp"},
		{"negative", "{\"timestamp\":-1,\"input_length\":1}\n", "t.jsonl:1: timestamp -1"},
		{"no length", "{\"timestamp\":1}\n", "t.jsonl:1: no input_length"},
		{"huge input", "{\"timestamp\":1,\"input_length\":99999999999}\n", "t.jsonl:1: input_length"},
		{"bad hash id", "{\"timestamp\":1,\"input_length\":1,\"hash_ids\":[-3]}\n", "t.jsonl:1: hash_ids"},
		{"two values", "{\"timestamp\":1,\"input_length\":1} {}\n", "t.jsonl:1: more than one"},
		{"too long", "{\"timestamp\":1,\"input_length\":1}\n{\"timestamp\":1,\"input_length\":1,\"x\":\"" + strings.Repeat("a", 300) + "\"}\n", "t.jsonl:2: line too long"},
		{"array", "[1]\n", "t.jsonl:1: not a JSON object"},
	} {
		_, err := readAll(t, c.trace, "")
		var le *LineError
		if err == nil || !errors.As(err, &le) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error starting %q", c.name, err, c.want)
		}
	}
	// A last line without its newline is fine when it is whole.
	if got, err := readAll(t, "{\"timestamp\":0,\"input_length\":1}", ""); err != nil || len(got) != 1 {
		t.Errorf("a whole last line without a newline: %v, %d requests", err, len(got))
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte("{\"timestamp\":0,\"input_length\":655,\"output_length\":52,\"hash_ids\":[46,47]}\n"), []byte(""))
	f.Add([]byte("{\"timestamp\":1.5,\"text_input\":\"hi\",\"session_id\":3}\n{\"timestamp\":1}"), []byte("{\"line\":1,\"api\":\"chat\"}\n"))
	f.Add([]byte("{\"timestamp\":0,\"input_length\":512,\"hash_ids\":[9007199254740991],\"replica\":\"pod-a\",\"tokentap\":{\"ids\":\"fleet\",\"replica\":\"pod-a\",\"start_unix_ms\":1765000000000,\"api\":\"chat\"}}\n{\"timestamp\":2,\"replica\":7}\n"), []byte(""))
	f.Fuzz(func(t *testing.T, trace, side []byte) {
		opts := ReaderOptions{MaxLineBytes: 512}
		if len(side) > 0 {
			opts.Side = strings.NewReader(string(side))
		}
		r := NewReader(strings.NewReader(string(trace)), opts)
		var last int64
		var lastLine int64
		for range 10000 {
			req, err := r.Next()
			if err != nil {
				var le *LineError
				if err != io.EOF && !errors.As(err, &le) {
					t.Fatalf("error %v is not a LineError", err)
				}
				return
			}
			if req.Timestamp < last || req.Line <= lastLine || req.InputLength < 0 || req.InputLength > MaxInputLength || req.OutputLength < 0 {
				t.Fatalf("accepted %+v after timestamp %d line %d", req, last, lastLine)
			}
			last, lastLine = req.Timestamp, req.Line
		}
	})
}
