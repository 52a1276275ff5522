package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/tokentap/tokentap/record"
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

// classify maps a route to the API it speaks. Only POSTs to the OpenAI
// routes are understood; the "/v1" prefix is optional because some
// engines and gateways serve the routes at the root.
func classify(r *http.Request) record.API {
	if r.Method != http.MethodPost {
		return record.APIOther
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(p, "/chat/completions"):
		return record.APIChat
	case strings.HasSuffix(p, "/completions"):
		return record.APICompletions
	}
	return record.APIOther
}

type bodyFields struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Seed                *int64          `json:"seed"`
}

func (b *bodyFields) info(api record.API, whole bool) requestInfo {
	in := requestInfo{API: api, Model: b.Model, Stream: b.Stream, Whole: whole, Temperature: b.Temperature, TopP: b.TopP, Seed: b.Seed}
	if b.MaxCompletionTokens != nil {
		in.MaxTokens = *b.MaxCompletionTokens
	} else if b.MaxTokens != nil {
		in.MaxTokens = *b.MaxTokens
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if len(b.StreamOptions) > 0 && json.Unmarshal(b.StreamOptions, &so) == nil {
		in.IncludeUsage = so.IncludeUsage
	}
	return in
}

// peek reads at most limit bytes of the body. If the body ends within
// them, it is parsed whole and returned in full; otherwise the fields are
// read best-effort from the prefix, and the returned reader replays the
// prefix followed by the rest of the body, so nothing is lost or delayed
// past the peek.
func peek(body io.ReadCloser, api record.API, limit int) (requestInfo, []byte, io.ReadCloser, error) {
	if body == nil || body == http.NoBody {
		return requestInfo{API: api, Whole: true}, nil, body, nil
	}
	buf, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return requestInfo{API: api}, nil, nil, err
	}
	if len(buf) <= limit {
		body.Close()
		var f bodyFields
		if json.Unmarshal(buf, &f) != nil {
			return requestInfo{API: api}, buf, io.NopCloser(bytes.NewReader(buf)), nil
		}
		return f.info(api, true), buf, io.NopCloser(bytes.NewReader(buf)), nil
	}
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), body), body}
	return prefixFields(buf).info(api, false), nil, rest, nil
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
		case "model", "stream", "max_tokens", "max_completion_tokens", "stream_options", "temperature", "top_p", "seed":
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
