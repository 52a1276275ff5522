package probe

import (
	"net/url"
	"testing"

	"github.com/tokentap/tokentap/stream"
)

// The prober builds one proxy per target and engine kind, once, in New
// (issue 34, one wiring): two probes of the engine share one, a probe
// with its own URL and one of TGI's API (an engine kind of its own)
// each have theirs; each probe's name, check and timeout ride on its
// requests (proxy.Hook), which the other probe tests exercise.
func TestOneProxyPerTarget(t *testing.T) {
	up, _ := url.Parse("http://127.0.0.1:9")
	cfg := Config{Probes: []Def{
		{Name: "a", API: stream.NameChat},
		{Name: "b", API: stream.NameChat, MaxTokens: 3},
		{Name: "c", API: stream.NameChat, URL: "http://127.0.0.2:9"},
		{Name: "d", API: stream.NameTGIGenerate},
	}}
	p := New(Options{Config: cfg, Upstream: up})
	px := func(i int) any {
		s := p.defs[i]
		if s.px == nil || s.pxErr != nil {
			t.Fatalf("probe %s: proxy %v, %v", s.def.Name, s.px, s.pxErr)
		}
		return s.px
	}
	if px(0) != px(1) {
		t.Error("probes a and b (the same engine) have two proxies")
	}
	if px(2) == px(0) || px(3) == px(0) || px(2) == px(3) {
		t.Error("probes c (its own URL) and d (TGI) share a proxy with another")
	}
}
