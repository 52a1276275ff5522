package replay

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// Shared hash ids give shared text, block by block; a different first
// id shares nothing; the text has 4 bytes a token; another run's salt
// shares nothing with this one's.
func TestPromptsShareByHashID(t *testing.T) {
	p := newPrompts(8, 1)
	text := func(line int64, n int64, ids ...int64) string {
		return p.text(&workload.Request{Entry: workload.Entry{HashIDs: ids}, Line: line}, n, 0)
	}
	a := text(1, 20, 5, 6, 7)
	b := text(2, 24, 5, 6, 9)
	c := text(3, 20, 4, 6, 7)
	if len(a) != 20*BytesPerToken-1 || len(strings.Fields(a)) != 20 {
		t.Fatalf("%d bytes, %d words: %q", len(a), len(strings.Fields(a)), a)
	}
	block := 8*BytesPerToken - 1 // two blocks: 16 words
	if a[:2*block+1] != b[:2*block+1] || a[2*block+1:2*block+5] == b[2*block+1:2*block+5] {
		t.Errorf("two shared blocks, then different:\n%q\n%q", a, b)
	}
	if a[:12] == c[:12] {
		t.Errorf("different first ids share text: %q %q", a[:12], c[:12])
	}
	if text(4, 20) == text(5, 20) {
		t.Error("lines without hash ids share their text")
	}
	if other := newPrompts(8, 2); other.text(&workload.Request{Entry: workload.Entry{HashIDs: []int64{5}}}, 8, 0) == a[:block] {
		t.Error("another salt, the same text")
	}
	// A capture's own block size wins over the replay's.
	big := p.text(&workload.Request{Entry: workload.Entry{HashIDs: []int64{5, 6}}}, 20, 16)
	if big[:block] != a[:block] || big[:2*block+1] == a[:2*block+1] {
		t.Errorf("block size 16: the first block is id 5's 16 tokens, not 8 of id 5's and 8 of id 6's:\n%q\n%q", big, a)
	}
	for _, w := range vocabulary {
		if len(w) != BytesPerToken-1 {
			t.Errorf("word %q is not %d bytes", w, BytesPerToken-1)
		}
	}
}

// Each API's request: the max-tokens member of its own, ignore_eos where
// the API has it, none where the line gives no output_length; the
// line's own API, model and stream flag when it has them.
func TestBuildRequests(t *testing.T) {
	b := &builder{api: stream.APIChat, stream: true, ignoreEOS: true, prompts: newPrompts(512, 1)}
	req := workload.Request{Entry: workload.Entry{InputLength: 100, OutputLength: 7}, Line: 3, HasOutputLength: true}
	for _, c := range []struct {
		name string
		meta *workload.Meta
		path string
		want map[string]any
		none []string
	}{
		{"chat", &workload.Meta{API: "chat", Model: "m", Stream: true}, "/v1/chat/completions", map[string]any{"max_tokens": 7.0, "ignore_eos": true, "stream": true, "model": "m"}, nil},
		{"ollama", &workload.Meta{API: "ollama_chat", Model: "llama", Stream: false}, "/api/chat", map[string]any{"stream": false, "model": "llama"}, []string{"ignore_eos", "max_tokens"}},
		{"public", nil, "/v1/chat/completions", map[string]any{"stream": true, "model": "default-model"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b.model = ""
			if c.meta == nil {
				b.model = "default-model"
			}
			r := req
			r.Tokentap = c.meta
			call, err := b.build(r)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(call.body, &m); err != nil || call.path != c.path {
				t.Fatalf("%s %s: %v", call.path, call.body, err)
			}
			for k, v := range c.want {
				if m[k] != v {
					t.Errorf("%s: %v, want %v", k, m[k], v)
				}
			}
			for _, k := range c.none {
				if _, ok := m[k]; ok {
					t.Errorf("%s is present", k)
				}
			}
			if c.name == "ollama" {
				if o, _ := m["options"].(map[string]any); o["num_predict"] != 7.0 {
					t.Errorf("options %v", m["options"])
				}
			}
		})
	}
	r := req
	r.HasOutputLength = false
	b.model = "m"
	call, _ := b.build(r)
	if strings.Contains(string(call.body), "max_tokens") || strings.Contains(string(call.body), "ignore_eos") || call.want != -1 {
		t.Errorf("no output_length: %s", call.body)
	}
}

func FuzzParseRates(f *testing.F) {
	for _, s := range []string{"1,1.5,2,3", "1", "0", "2,1", "1,,2", "NaN", "1e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParseRates(s)
		if err != nil {
			return
		}
		if len(rs) == 0 || len(rs) > MaxRates {
			t.Fatalf("%q: %v", s, rs)
		}
		for i, r := range rs {
			if !(r > 0) || (i > 0 && r <= rs[i-1]) {
				t.Fatalf("%q: %v", s, rs)
			}
		}
	})
}
