package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// engineInfo is what the sidecar learns about its engine at startup.
type engineInfo struct {
	Kind    string // vllm, sglang, tgi, llamacpp, ollama, simulator, or unknown
	Version string // "" when the engine does not say
	How     string // the endpoint that told
}

// Engine kinds. They are config.EngineKinds' names (the engine scraper
// labels its series with the same ones), and proxy's Engine* constants.
const (
	kindUnknown = "unknown"
	kindSim     = "simulator"
)

// detectEngine asks the engine what it is, through the endpoints each
// engine serves:
//
//   - GET /api/version: Ollama ({"version":"0.17.4"}; ollama/ollama
//     server/routes.go);
//   - GET /info: TGI ({"router":"text-generation-router","version":...};
//     huggingface/text-generation-inference router/src/lib.rs Info);
//   - GET /props: llama.cpp ({"build_info":...}; tools/server);
//   - GET /v1/models: the owned_by of the models: "vllm", "sglang",
//     "llamacpp", and "tokentap" for the built-in simulator;
//   - GET /version (vLLM: {"version":...}) and GET /get_server_info
//     (SGLang: its "version") for the version of those two.
//
// reached is false when the engine answered none of them (it is not up
// yet): detection is then tried again later.
func detectEngine(ctx context.Context, client *http.Client, base *url.URL) (info engineInfo, reached bool) {
	get := func(path string) (map[string]any, bool) {
		u := *base
		u.Path = joinPath(u.Path, path)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		resp, err := client.Do(req)
		if err != nil {
			return nil, false
		}
		defer resp.Body.Close()
		reached = true
		if resp.StatusCode/100 != 2 {
			return nil, false
		}
		var m map[string]any
		if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m) != nil {
			return nil, false
		}
		return m, true
	}
	str := func(m map[string]any, k string) string {
		s, _ := m[k].(string)
		return s
	}
	if m, ok := get("/api/version"); ok && str(m, "version") != "" {
		return engineInfo{Kind: "ollama", Version: str(m, "version"), How: "/api/version"}, true
	}
	if m, ok := get("/info"); ok && strings.Contains(str(m, "router"), "text-generation") {
		return engineInfo{Kind: "tgi", Version: str(m, "version"), How: "/info"}, true
	}
	if m, ok := get("/props"); ok {
		if _, has := m["default_generation_settings"]; has || str(m, "build_info") != "" {
			return engineInfo{Kind: "llamacpp", Version: str(m, "build_info"), How: "/props"}, true
		}
	}
	if m, ok := get("/v1/models"); ok {
		owner := ""
		if data, _ := m["data"].([]any); len(data) > 0 {
			if d, _ := data[0].(map[string]any); d != nil {
				owner = str(d, "owned_by")
			}
		}
		switch owner {
		case "vllm":
			v, _ := get("/version")
			return engineInfo{Kind: "vllm", Version: str(v, "version"), How: "/v1/models owned_by"}, true
		case "sglang":
			v, _ := get("/get_server_info")
			return engineInfo{Kind: "sglang", Version: str(v, "version"), How: "/v1/models owned_by"}, true
		case "llamacpp":
			return engineInfo{Kind: "llamacpp", How: "/v1/models owned_by"}, true
		case "tokentap":
			return engineInfo{Kind: kindSim, How: "/v1/models owned_by"}, true
		}
	}
	return engineInfo{Kind: kindUnknown}, reached
}

// boundLabel keeps a label value from the engine short and printable.
func boundLabel(s string) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 64 {
			break
		}
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune(".-_+:", c):
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// upstreamInfo is tokentap_upstream_info{engine,version} = 1: one series,
// replaced when the engine is detected.
type upstreamInfo struct{ g *prometheus.GaugeVec }

func newUpstreamInfo(reg prometheus.Registerer) *upstreamInfo {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tokentap_upstream_info",
		Help: "The engine in front of which the sidecar runs, as detected at startup (engine kind and version); always 1."},
		[]string{"engine", "version"})
	reg.MustRegister(g)
	g.WithLabelValues(kindUnknown, "").Set(1)
	return &upstreamInfo{g: g}
}

func (u *upstreamInfo) set(info engineInfo) {
	u.g.Reset()
	u.g.WithLabelValues(boundLabel(info.Kind), boundLabel(info.Version)).Set(1)
}

// watchEngine detects the engine at startup, retrying while it is not up
// (every 2 s, then every 30 s after the first minute), logs what it
// found, exports it and hands the kind to set (the proxy's route
// classification). A kind given in the configuration (engine.kind) is
// used as it is, without asking.
func watchEngine(ctx context.Context, base *url.URL, fixed string, info *upstreamInfo, set func(string), log *slog.Logger) {
	if fixed != "" && fixed != "auto" {
		info.set(engineInfo{Kind: fixed})
		set(fixed)
		log.Info("engine", "kind", fixed, "how", "engine.kind")
		return
	}
	client := &http.Client{Timeout: 2 * time.Second}
	start := time.Now()
	for {
		e, reached := detectEngine(ctx, client, base)
		if reached {
			info.set(e)
			if e.Kind != kindUnknown {
				set(e.Kind)
				log.Info("engine detected", "kind", e.Kind, "version", e.Version, "how", e.How)
			} else {
				log.Info("engine not recognised (none of /api/version, /info, /props, /v1/models owned_by told); routes are read by their paths alone")
			}
			return
		}
		wait := 2 * time.Second
		if time.Since(start) > time.Minute {
			wait = 30 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
