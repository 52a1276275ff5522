package engine

import (
	"bytes"
	"encoding/json"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// The one engine detector. An engine tells what it is in two ways, both
// read here and mapped onto the one list of kinds (normalise.go): the
// names of its metrics (Detect, which the scraper uses to normalise them)
// and the endpoints it serves (Identify, which package upstream runs at
// startup for the proxy's route classification and tokentap_upstream_info).

// prefixes detect the engine from its metric names, in this order: a
// Dynamo worker also exports its engine's own names, which win.
var prefixes = []struct {
	prefix string
	kind   Kind
}{
	{"vllm:", VLLM}, {"sglang:", SGLang}, {"trtllm_", TRTLLM}, {"tgi_", TGI}, {"llamacpp:", LlamaCpp},
	{"dynamo_frontend_", Dynamo}, {"dynamo_component_", Dynamo},
}

// Detect returns the engine whose metric name prefix appears among the
// families, or Unknown.
func Detect(fams map[string]*dto.MetricFamily) Kind {
	for _, p := range prefixes {
		for name := range fams {
			if strings.HasPrefix(name, p.prefix) {
				return p.kind
			}
		}
	}
	return Unknown
}

// Identity is what an engine says it is through its endpoints.
type Identity struct {
	Kind    Kind   // Unknown when no endpoint told
	Version string // "" when the engine does not say
	How     string // the endpoint that told; "" for Unknown
}

// Identify asks the engine what it is, through the endpoints each engine
// serves; get does one GET of a path and returns the status and the body
// (err when no answer came):
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
// yet).
func Identify(get func(path string) (status int, body []byte, err error)) (id Identity, reached bool) {
	obj := func(path string) (map[string]any, bool) {
		status, body, err := get(path)
		if err != nil {
			return nil, false
		}
		reached = true
		if status/100 != 2 {
			return nil, false
		}
		var m map[string]any
		if json.NewDecoder(bytes.NewReader(body)).Decode(&m) != nil {
			return nil, false
		}
		return m, true
	}
	str := func(m map[string]any, k string) string {
		s, _ := m[k].(string)
		return s
	}
	if m, ok := obj("/api/version"); ok && str(m, "version") != "" {
		return Identity{Kind: Ollama, Version: str(m, "version"), How: "/api/version"}, true
	}
	if m, ok := obj("/info"); ok && strings.Contains(str(m, "router"), "text-generation") {
		return Identity{Kind: TGI, Version: str(m, "version"), How: "/info"}, true
	}
	if m, ok := obj("/props"); ok {
		if _, has := m["default_generation_settings"]; has || str(m, "build_info") != "" {
			return Identity{Kind: LlamaCpp, Version: str(m, "build_info"), How: "/props"}, true
		}
	}
	if m, ok := obj("/v1/models"); ok {
		owner := ""
		if data, _ := m["data"].([]any); len(data) > 0 {
			if d, _ := data[0].(map[string]any); d != nil {
				owner = str(d, "owned_by")
			}
		}
		const how = "/v1/models owned_by"
		switch Kind(owner) {
		case VLLM:
			v, _ := obj("/version")
			return Identity{Kind: VLLM, Version: str(v, "version"), How: how}, true
		case SGLang:
			v, _ := obj("/get_server_info")
			return Identity{Kind: SGLang, Version: str(v, "version"), How: how}, true
		case LlamaCpp:
			return Identity{Kind: LlamaCpp, How: how}, true
		case "tokentap":
			return Identity{Kind: Simulator, How: how}, true
		}
	}
	return Identity{}, reached
}
