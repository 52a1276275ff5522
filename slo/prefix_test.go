package slo

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
)

// /slo shows the prefix reuse section it is given, in HTML and JSON, at
// the page's instant; without one the section is absent.
func TestPrefixReuseSection(t *testing.T) {
	_, sc, now := scored(config.Cost{}, false, nil)
	get := func(q string) string {
		w := httptest.NewRecorder()
		sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo"+q, nil))
		b, _ := io.ReadAll(w.Result().Body)
		return string(b)
	}
	if h, j := get(""), get("?format=json"); strings.Contains(h, "Prefix reuse") || strings.Contains(j, "prefix_reuse") {
		t.Errorf("section without a source:\n%s\n%s", h, j)
	}
	reuse, half := 0.5, 0.25
	var asked time.Time
	sc.SetPrefixReuse(func(at time.Time) *PrefixReuse {
		asked = at
		return &PrefixReuse{WindowSeconds: 3600, SpanSeconds: 90, BlockTokens: 512, Requests: 7, Blocks: 40, Reused: 20, Reuse: &reuse,
			IdealCaches: []IdealCache{{Blocks: 4, Tokens: 2048, Hits: 10, HitRatio: &half}},
			Engine:      &EnginePrefix{Engine: "vllm", HitRatio: 0.125, From: "increase(vllm:prefix_cache_hits_total) / increase(vllm:prefix_cache_queries_total)"}}
	})
	h := get("")
	for _, want := range []string{"Prefix reuse", "20 of 40 (7 requests)", "50%", "ideal LRU cache of 4 blocks (2048 tokens)", "25%", "vllm: increase(vllm:prefix_cache_hits_total)", "12.5%"} {
		if !strings.Contains(h, want) {
			t.Errorf("HTML has no %q", want)
		}
	}
	var p Page
	if err := json.Unmarshal([]byte(get("?format=json")), &p); err != nil || p.PrefixReuse == nil || *p.PrefixReuse.Reuse != 0.5 ||
		p.PrefixReuse.IdealCaches[0].Hits != 10 || p.PrefixReuse.Engine.HitRatio != 0.125 || !asked.Equal(*now) {
		t.Errorf("JSON %+v %v (asked at %v)", p.PrefixReuse, err, asked)
	}
}
