package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
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
	// Read is "" when Whole, else why not (record.Record.RequestRead):
	// ReadPartial or ReadUnparsed. The fields above were then read best
	// effort, and the response decides Stream (modifyResponse).
	Read string
}

// The values of requestInfo.Read and record.Record.RequestRead.
const (
	ReadPartial  = "partial"  // the body was longer than the peek
	ReadUnparsed = "unparsed" // the body was not one JSON object
)

// classify maps a route to the API it speaks (stream.Classify: the
// routes are in each API's description). Only POSTs are understood.
// engine is the detected engine kind ("" when unknown): two routes mean
// different things on different engines.
func classify(r *http.Request, engine string) record.API {
	if r.Method != http.MethodPost {
		return record.APIOther
	}
	return record.API(stream.Classify(r.URL.Path, engine).Name)
}

// The engine kinds classify depends on, as engine.Kind names them.
const (
	EngineTGI      = stream.EngineTGI
	EngineLlamaCpp = stream.EngineLlamaCpp
)

// formatOf is the wire format of an API's responses.
func formatOf(api record.API) stream.Format { return stream.FormatOfAPI(string(api)) }

// injectable reports whether the API has a way to ask the engine for
// usage in a stream (stream.Request.UsageOption: OpenAI's
// stream_options.include_usage).
func injectable(api record.API) bool {
	a := stream.LookupAPI(string(api))
	return a != nil && a.Request.UsageOption
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
	a := stream.LookupAPI(string(api))
	if a == nil {
		return in
	}
	rq := a.Request
	if rq.StreamUnlessFalse {
		in.Stream = b.Stream == nil || *b.Stream
	}
	if rq.StreamRoute != "" && strings.HasSuffix(strings.TrimSuffix(path, "/"), rq.StreamRoute) {
		in.Stream = true
	}
	var inner *sampling
	switch rq.Sampling {
	case "options":
		if o := b.Options; o != nil {
			inner = &o.sampling
		}
	case "parameters":
		if p := b.Parameters; p != nil {
			inner = &p.sampling
		}
	}
	if inner != nil {
		in.Temperature, in.TopP, in.Seed = inner.Temperature, inner.TopP, inner.Seed
	}
	for _, name := range rq.MaxTokens {
		if p := b.maxTokens(name); p != nil {
			in.MaxTokens = *p
			break
		}
	}
	var so struct {
		IncludeUsage bool `json:"include_usage"`
	}
	if rq.UsageOption && len(b.StreamOptions) > 0 && json.Unmarshal(b.StreamOptions, &so) == nil {
		in.IncludeUsage = so.IncludeUsage
	}
	return in
}

// maxTokens is the member of stream.Request.MaxTokens called name, nil
// when the body has none.
func (b *bodyFields) maxTokens(name string) *int64 {
	switch name {
	case "max_tokens":
		return b.MaxTokens
	case "max_completion_tokens":
		return b.MaxCompletionTokens
	case "max_output_tokens":
		return b.MaxOutputTokens
	case "n_predict":
		return b.NPredict
	case "options.num_predict":
		if b.Options != nil {
			return b.Options.NumPredict
		}
	case "parameters.max_new_tokens":
		if b.Parameters != nil {
			return b.Parameters.MaxNewTokens
		}
	default:
		panic("proxy: stream.Request.MaxTokens names an unknown member " + name)
	}
	return nil
}

// member reads one top-level member of a request body into b, if it is
// one of those the sidecar uses; a value of the wrong type is ignored.
// Only these small values are decoded: the messages and prompt, nearly
// all of a large body, are skipped over where they lie.
func (b *bodyFields) member(key, val []byte) {
	switch string(key) {
	case "model":
		var m string
		if json.Unmarshal(val, &m) == nil {
			// Keep no more than the record can: the string would
			// otherwise hold a client's arbitrarily long name.
			if len(m) > record.MaxModelBytes {
				m = strings.Clone(m[:record.MaxModelBytes+1])
			}
			b.Model = m
		}
	case "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict", "stream_options",
		"temperature", "top_p", "seed", "options", "parameters":
		one := make([]byte, 0, len(key)+len(val)+5)
		one = append(append(append(one, `{"`...), key...), `":`...)
		one = append(append(one, val...), '}')
		_ = json.Unmarshal(one, b)
	}
}

// readFields reads the top-level members of the object that starts buf
// (all of them, or those complete before a truncation) and returns the
// index just after the object, -1 if it does not end within buf.
func readFields(buf []byte, f *bodyFields) int {
	return stream.TopMembers(buf, func(k []byte, s, e int) { f.member(k, buf[s:e]) })
}

// peek reads at most limit bytes of the body; size is its length when
// known (the request's Content-Length), else -1. If the body ends within
// the limit, it is read whole and returned in full; otherwise the fields
// are read best-effort from the prefix, and the returned reader replays
// the prefix followed by the rest of the body, so nothing is lost or
// delayed past the peek.
//
// Design note: memory. A request body costs its own size once, in the
// buffer it is read into (sized from Content-Length when it has one, so
// that it is not grown and copied), and nothing more: the members the
// sidecar needs are found by stream's scanner, which allocates nothing,
// and only their small values are decoded (json.Unmarshal of the whole
// body into the fields walked every message; withIncludeUsage then
// decoded the body into a map and encoded it again: 4.9 MB allocated for
// a 1 MB body, about 8 MB of RSS per request in flight; now 1.0 MB;
// TestPrepareBytesPer1MBRequest, docs/performance.md).
func peek(body io.ReadCloser, api record.API, path string, limit int, size int64) (requestInfo, []byte, io.ReadCloser, error) {
	var none bodyFields
	if body == nil || body == http.NoBody {
		return none.info(api, true, path), nil, body, nil
	}
	buf, err := readAtMost(body, limit+1, size)
	if err != nil {
		return none.info(api, false, path), nil, nil, err
	}
	var f bodyFields
	end := readFields(buf, &f)
	if len(buf) <= limit {
		body.Close()
		rest := io.NopCloser(bytes.NewReader(buf))
		if end < 0 || len(bytes.TrimLeft(buf[end:], " \t\r\n")) > 0 || !json.Valid(buf) {
			// Not one JSON object (an object followed by junk, say, which
			// some engines accept): what the object that starts it says,
			// best effort.
			in := f.info(api, false, path)
			in.Read = ReadUnparsed
			return in, buf, rest, nil
		}
		return f.info(api, true, path), buf, rest, nil
	}
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), body), body}
	in := f.info(api, false, path)
	in.Read = ReadPartial
	return in, nil, rest, nil
}

// readAtMost reads r until EOF or n bytes. size is how long r says it is
// (-1: unknown): the buffer is allocated at that size, up to n, at once.
func readAtMost(r io.Reader, n int, size int64) ([]byte, error) {
	c := 512
	if size >= 0 {
		c = int(min(size+1, int64(n))) // +1: EOF is seen without growing
	}
	buf := make([]byte, 0, c)
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grow
		}
		m, err := r.Read(buf[len(buf):min(cap(buf), n)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// splicedBody is a request body made of pieces sent one after the other:
// the client's body, cut where the sidecar inserts or replaces a member,
// with that member between, so the body is never copied.
type splicedBody struct {
	net.Buffers
	n int64 // its length
}

// Close implements io.Closer.
func (*splicedBody) Close() error { return nil }

// withIncludeUsage returns the body with stream_options.include_usage set
// to true, every other member kept as it was, byte for byte and in its
// place: a stream_options object is replaced by one with include_usage
// added, a null one by {"include_usage":true}, and a body without one
// gets that member first. body must be one JSON object (peek's Whole).
// Of several stream_options members the last is replaced (the one JSON
// decoders keep).
func withIncludeUsage(body []byte) (*splicedBody, error) {
	so, soEnd := -1, -1
	end := stream.TopMembers(body, func(k []byte, s, e int) {
		if string(k) == "stream_options" {
			so, soEnd = s, e
		}
	})
	if end < 0 {
		return nil, errors.New("not a JSON object")
	}
	if so < 0 {
		open := bytes.IndexByte(body, '{') + 1
		member := `"stream_options":{"include_usage":true}`
		if len(bytes.TrimSpace(body[open:end-1])) > 0 {
			member += ","
		}
		return splice(body[:open], []byte(member), body[open:]), nil
	}
	m := map[string]json.RawMessage{}
	if raw := body[so:soEnd]; string(raw) != "null" {
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
	}
	m["include_usage"] = json.RawMessage("true")
	enc, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return splice(body[:so], enc, body[soEnd:]), nil
}

func splice(pieces ...[]byte) *splicedBody {
	b := &splicedBody{Buffers: pieces}
	for _, p := range pieces {
		b.n += int64(len(p))
	}
	return b
}
