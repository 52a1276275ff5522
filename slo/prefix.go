package slo

import (
	"html/template"
	"time"
)

// PrefixReuse is /slo's "Prefix reuse" section (docs/capture.md, "Live
// reuse"; docs/measurement.md §8b): over the reuse window, the share of
// the live prompts' blocks seen within it before (what any prefix cache
// could at most have served), the ideal LRU caches' share by size, and
// beside them the engine's own prefix-cache hit ratio where its metrics
// have one. Null figures have no blocks yet.
type PrefixReuse struct {
	// WindowSeconds is the reuse window; SpanSeconds the time the sums
	// cover (from the first request they count to now).
	WindowSeconds float64 `json:"window_seconds"`
	SpanSeconds   float64 `json:"span_seconds"`
	// BlockTokens is the tokens per block (capture.block_size).
	BlockTokens int `json:"block_tokens"`
	// Requests and Blocks that arrived within the window; Reused those
	// blocks seen within the window before them; Reuse = Reused/Blocks.
	Requests int64    `json:"requests"`
	Blocks   int64    `json:"blocks"`
	Reused   int64    `json:"reused_blocks"`
	Reuse    *float64 `json:"reuse"`
	// IdealCaches are the bounds by size, in reuse.cache_blocks order.
	IdealCaches []IdealCache `json:"ideal_caches"`
	// IDs is the ids the window remembers; Forgotten those forgotten for
	// its bound since start (reuse then missed counts as new).
	IDs       int64  `json:"ids_held"`
	Forgotten uint64 `json:"ids_forgotten"`
	// Engine is the engine's own prefix-cache hit ratio; null when its
	// metrics have none (or the engine scraper is off).
	Engine *EnginePrefix `json:"engine"`
}

// IdealCache is one ideal LRU cache's share of the window's blocks.
type IdealCache struct {
	Blocks   int      `json:"cache_blocks"`
	Tokens   int64    `json:"cache_tokens"`
	Hits     int64    `json:"hit_blocks"`
	HitRatio *float64 `json:"hit_ratio"`
}

// EnginePrefix is the engine's prefix-cache hit ratio as the engine
// scraper last exported it (tokentap_engine_prefix_cache_hit_ratio), and
// the engine's metric it comes from.
type EnginePrefix struct {
	Engine   string  `json:"engine"`
	HitRatio float64 `json:"hit_ratio"`
	From     string  `json:"from"`
}

// SetPrefixReuse makes /slo show the prefix reuse section that f
// returns at the page's instant (nil from f: none). Call it before
// serving; without it (the default) the section is absent.
func (sc *Scorecard) SetPrefixReuse(f func(now time.Time) *PrefixReuse) { sc.prefix = f }

var _ = template.Must(pageHTML.New("prefix").Parse(`{{with .PrefixReuse}}<h2 id="prefix-reuse">Prefix reuse</h2>
<p>The live prompts' blocks of {{.BlockTokens}} tokens over the last {{num .WindowSeconds}} s (the sums cover {{num .SpanSeconds}} s): a block is reused when its whole prefix was seen within the window before it, the most any prefix cache could serve; an ideal LRU cache of a size is the most a cache of that size could (<a href="https://github.com/tokentap/tokentap/blob/main/docs/capture.md#live-reuse">docs/capture.md</a>). This sidecar's traffic only.</p>
<table class="prefix"><tr><th>of the window's blocks</th><th>blocks</th><th>share</th></tr>
<tr><td style="text-align:left">reused (within the window)</td><td>{{.Reused}} of {{.Blocks}} ({{.Requests}} requests)</td><td>{{if .Reuse}}{{pct (deref .Reuse)}}{{else}}–{{end}}</td></tr>
{{range .IdealCaches}}<tr><td style="text-align:left">ideal LRU cache of {{.Blocks}} blocks ({{.Tokens}} tokens)</td><td>{{.Hits}}</td><td>{{if .HitRatio}}{{pct (deref .HitRatio)}}{{else}}–{{end}}</td></tr>{{end}}
<tr><td style="text-align:left">the engine's own prefix-cache hit ratio</td><td>{{if .Engine}}{{.Engine.Engine}}: {{.Engine.From}}{{else}}–{{end}}</td><td>{{if .Engine}}{{pct .Engine.HitRatio}}{{else}}not exported{{end}}</td></tr></table>
<p>Ids held: {{.IDs}}; forgotten for the bound since start: {{.Forgotten}}. The engine's ratio is its own (tokens, over its last scrape interval or its own window), set beside the workload's bound: well below it, the engine's cache is too small or evicts; near it, the workload allows no more.</p>{{end}}`))
