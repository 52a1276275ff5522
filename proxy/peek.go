package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// requestInfo is what the bounded peek at a request body tells us.
type requestInfo struct {
	API          record.API
	Model        string
	Stream       bool
	MaxTokens    int64
	IncludeUsage bool // the client asked for the usage chunk itself
	Temperature  *float64
	TopP         *float64
	Seed         *int64
	Whole        bool // the whole body was read and parsed
}

// classify maps a route to the API it speaks (docs/records.md, api). Only
// POSTs are understood; the "/v1" prefix of the OpenAI routes is optional
// because some engines and gateways serve them at the root. engine is the
// detected engine kind ("" when unknown): two routes mean different
// things on different engines. llama.cpp serves its native completion
// API at /completions, not the OpenAI one (tools/server/server.cpp), and
// /generate is TGI's native route only on TGI (SGLang has another
// /generate). A llama.cpp native payload reaching the completions
// adapter is read all the same (stream.ParseOpenAI hands it over).
func classify(r *http.Request, engine string) record.API {
	if r.Method != http.MethodPost {
		return record.APIOther
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(p, "/chat/completions"):
		return record.APIChat
	case p == "/completions" && engine == EngineLlamaCpp:
		return record.APILlamaCppCompletion
	case strings.HasSuffix(p, "/completions"):
		return record.APICompletions
	case strings.HasSuffix(p, "/v1/responses") || p == "/responses":
		return record.APIResponses
	case strings.HasSuffix(p, "/v1/messages") || p == "/messages":
		return record.APIMessages
	case strings.HasSuffix(p, "/api/chat"):
		return record.APIOllamaChat
	case strings.HasSuffix(p, "/api/generate"):
		return record.APIOllamaGenerate
	case strings.HasSuffix(p, "/generate_stream"), p == "/generate" && engine == EngineTGI:
		return record.APITGIGenerate
	case p == "/completion":
		return record.APILlamaCppCompletion
	}
	return record.APIOther
}

// Engine kinds, as app's detection names them; classify depends on some.
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineTGI      = "tgi"
	EngineLlamaCpp = "llamacpp"
	EngineOllama   = "ollama"
)

// formatOf is the wire format of an API's responses.
func formatOf(api record.API) stream.Format { return stream.FormatOfAPI(string(api)) }

// injectable reports whether the API has a way to ask the engine for
// usage in a stream: only OpenAI's stream_options.include_usage (chat and
// completions). The other formats report their counts unasked (Responses
// in response.completed, Messages in message_delta, Ollama in its done
// line, TGI in details, llama.cpp in its stop event) or not at all.
func injectable(api record.API) bool {
	return api == record.APIChat || api == record.APICompletions
}

type sampling struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	Seed        *int64   `json:"seed"`
}

type bodyFields struct {
	Model               string          `json:"model"`
	Stream              *bool           `json:"stream"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	MaxOutputTokens     *int64          `json:"max_output_tokens"` // Responses
	NPredict            *int64          `json:"n_predict"`         // llama.cpp native
	StreamOptions       json.RawMessage `json:"stream_options"`
	sampling
	// Options are Ollama's (api/types.go: num_predict and the sampling
	// options live there).
	Options *struct {
		NumPredict *int64 `json:"num_predict"`
		sampling
	} `json:"options"`
	// Parameters are TGI's (router/src/lib.rs GenerateParameters).
	Parameters *struct {
		MaxNewTokens *int64 `json:"max_new_tokens"`
		sampling
	} `json:"parameters"`
}

func (b *bodyFields) info(api record.API, whole bool, path string) requestInfo {
	in := requestInfo{API: api, Model: b.Model, Whole: whole, Temperature: b.Temperature, TopP: b.TopP, Seed: b.Seed}
	in.Stream = b.Stream != nil && *b.Stream
	first := func(ps ...*int64) {
		for _, p := range ps {
			if p != nil {
				in.MaxTokens = *p
				return
			}
		}
	}
	switch api {
	case record.APIOllamaChat, record.APIOllamaGenerate:
		// Ollama streams unless told not to (server/routes.go: only
		// "stream":false gives application/json).
		in.Stream = b.Stream == nil || *b.Stream
		if o := b.Options; o != nil {
			first(o.NumPredict)
			in.Temperature, in.TopP, in.Seed = o.Temperature, o.TopP, o.Seed
		}
	case record.APITGIGenerate:
		in.Stream = in.Stream || strings.HasSuffix(strings.TrimSuffix(path, "/"), "/generate_stream")
		if p := b.Parameters; p != nil {
			first(p.MaxNewTokens)
			in.Temperature, in.TopP, in.Seed = p.Temperature, p.TopP, p.Seed
		}
	case record.APIResponses:
		first(b.MaxOutputTokens)
	case record.APILlamaCppCompletion:
		first(b.NPredict, b.MaxCompletionTokens, b.MaxTokens)
	default:
		first(b.MaxCompletionTokens, b.MaxTokens)
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if injectable(api) && len(b.StreamOptions) > 0 && json.Unmarshal(b.StreamOptions, &so) == nil {
		in.IncludeUsage = so.IncludeUsage
	}
	return in
}

// peek reads at most limit bytes of the body. If the body ends within
// them, it is parsed whole and returned in full; otherwise the fields are
// read best-effort from the prefix, and the returned reader replays the
// prefix followed by the rest of the body, so nothing is lost or delayed
// past the peek.
func peek(body io.ReadCloser, api record.API, path string, limit int) (requestInfo, []byte, io.ReadCloser, error) {
	var none bodyFields
	if body == nil || body == http.NoBody {
		return none.info(api, true, path), nil, body, nil
	}
	buf, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return none.info(api, false, path), nil, nil, err
	}
	if len(buf) <= limit {
		body.Close()
		var f bodyFields
		if json.Unmarshal(buf, &f) != nil {
			return none.info(api, false, path), buf, io.NopCloser(bytes.NewReader(buf)), nil
		}
		return f.info(api, true, path), buf, io.NopCloser(bytes.NewReader(buf)), nil
	}
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), body), body}
	return prefixFields(buf).info(api, false, path), nil, rest, nil
}

// prefixFields reads top-level members from a truncated JSON object until
// the truncation point.
func prefixFields(prefix []byte) *bodyFields {
	var f bodyFields
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return &f
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			break
		}
		switch key {
		case "model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict", "stream_options",
			"temperature", "top_p", "seed", "options", "parameters":
			one := append(append([]byte(`{"`), key...), `":`...)
			one = append(append(one, raw...), '}')
			_ = json.Unmarshal(one, &f)
		}
	}
	return &f
}

// withIncludeUsage returns the body with stream_options.include_usage set
// to true, every other member kept as it was.
func withIncludeUsage(body []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	so := map[string]json.RawMessage{}
	if raw, ok := top["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, err
		}
	}
	so["include_usage"] = json.RawMessage("true")
	enc, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	top["stream_options"] = enc
	return json.Marshal(top)
}
