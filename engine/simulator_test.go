package engine

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/simengine"
)

// In front of the built-in simulator with its prefix cache on, the
// scraper reads the simulator's vLLM prefix-cache counters into
// tokentap_engine_prefix_cache_hit_ratio{engine="simulator"}: the same
// prompt twice, 5 blocks of 16 tokens each time, the second hitting all
// of them, is 80 of the 2 × prompt tokens queried.
func TestSimulatorPrefixCacheHitRatio(t *testing.T) {
	e := simengine.NewEngine(config.Simulator{MaxBatch: 2, DecodeBase: time.Millisecond, PrefixCacheBlocks: 64, PrefixCacheBlockTokens: 16})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.Run(ctx)
	srv := httptest.NewServer(simengine.NewServer(e))
	defer srv.Close()
	body := `{"max_tokens":1,"prompt":"` + strings.Repeat("x", 320) + `"}` // canonical: 330 bytes, 83 tokens, 5 full blocks
	for range 2 {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	reg := prometheus.NewRegistry()
	s := newScraper(t, srv.URL, reg, func(c *config.Engine) { c.Kind = string(Simulator) })
	s.Scrape(t.Context())
	if q, h := e.PrefixCounters(); q != 2*83 || h != 80 {
		t.Fatalf("the simulator's counters: queries %d hits %d, want 166 and 80", q, h)
	}
	if v, ok := series(t, reg)["tokentap_engine_prefix_cache_hit_ratio{engine=simulator}"]; !ok || v != 80.0/166 {
		t.Fatalf("hit ratio %v (%v), want 80/166", v, ok)
	}
}
