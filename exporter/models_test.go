package exporter

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Model names a client or an engine chose become label values that are
// valid UTF-8 with no control characters: CR, LF, ESC, NUL, C1 and
// U+2028 are escaped, invalid bytes replaced, whether the name was
// declared, listed by the engine or admitted as served; the one ITL
// series the request observed live, too.
func TestModelLabelValuesAreSafe(t *testing.T) {
	hostile := []string{"decl\r\nfake_metric 1", "list\x1b[31m", "a\xffb", "nul\x00", "sep\u2028x", "c1\u0085",
		strings.Repeat("é", 60) + "\xc3"} // 121 bytes, cut inside its last character
	m := New(Config{MaxModels: 20, Models: hostile[:1]})
	m.Models().SetListed(hostile[1:2])
	for _, model := range hostile {
		r := record.New(2)
		r.Arrive = time.Now()
		r.API, r.Model, r.Traffic, r.Stream, r.Outcome = stream.NameChat, model, "live", true, record.Success
		k := record.Key{API: r.API, Model: model, Traffic: r.Traffic}
		q := m.Begin(k)
		q.(*Request).Gap(10 * time.Millisecond)
		q.Done()
		r.AddToken(r.Arrive.Add(50*time.Millisecond), 1, true)
		r.AddToken(r.Arrive.Add(60*time.Millisecond), 1, true)
		r.Terminal = r.Arrive.Add(70 * time.Millisecond)
		k.Model = m.Models().Admit(model)
		m.Publish(r, k)
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		for _, mt := range mf.Metric {
			for _, lp := range mt.Label {
				v := lp.GetValue()
				if !utf8.ValidString(v) || strings.IndexFunc(v, func(r rune) bool {
					return r < 0x20 || r >= 0x7f && r <= 0x9f || r == '\u2028' || r == '\u2029'
				}) >= 0 {
					t.Errorf("%s{%s=%q}: not valid UTF-8, or a control character", mf.GetName(), lp.GetName(), v)
				}
				if lp.GetName() == "gen_ai_request_model" {
					seen[v] = true
				}
			}
		}
	}
	for _, want := range []string{`decl\x0d\x0afake_metric 1`, `list\x1b[31m`, "a\uFFFDb", `nul\x00`, `sep\u2028x`, `c1\x85`,
		strings.Repeat("é", 60) + "\uFFFD"} {
		if !seen[want] {
			t.Errorf("no series with gen_ai_request_model=%q; have %v", want, seen)
		}
	}
}
