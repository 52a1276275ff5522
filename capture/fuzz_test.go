package capture

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// FuzzCanonical: the canonical prompt of any body (whole, cut short, not
// JSON at all) is computed without panicking; for a body that is one
// JSON object, it is exactly each prompt member's value as encoding/json
// finds it (the last of duplicates), compacted by json.Compact, in the
// API's order. Seed corpus: testdata/fuzz/FuzzCanonical.
func FuzzCanonical(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`), uint8(0))
	f.Add([]byte(`{"system":[{"type":"text","text":"s"}],"messages":[],"max_tokens":5}`), uint8(3))
	f.Add([]byte(`{"contents":[{"parts":[{"text":"x"}]}],"systemInstruction":{"parts":[{"text":"y"}]}}`), uint8(8))
	f.Add([]byte("{\"prompt\" : \"a \\\" b\" , \"prompt\":\n[1, 2]}"), uint8(1))
	apis := stream.APIs()
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		a := apis[int(which)%len(apis)]
		var got []byte
		n := canonical(body, a.Request.Prompt, func(p []byte) { got = append(got, p...) })
		if !json.Valid(body) || bytes.Contains(body, []byte(`\`)) {
			return // keys with escapes: encoding/json unescapes them, the scanner compares raw bytes
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil {
			return // valid JSON, not an object
		}
		var want []byte
		found := 0
		for _, name := range a.Request.Prompt {
			v, ok := m[name]
			if !ok {
				continue
			}
			found++
			var c bytes.Buffer
			if err := json.Compact(&c, v); err != nil {
				t.Fatal(err)
			}
			want = append(append(append(append(want, name...), 0), c.Bytes()...), 0)
		}
		if n != found || !bytes.Equal(got, want) {
			t.Fatalf("canonical of %q (%s):\n%q (%d members)\nwant\n%q (%d)", body, a.Name, got, n, want, found)
		}
	})
}
