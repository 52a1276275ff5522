package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// requestInfo is what the bounded peek at a request body tells us.
type requestInfo struct {
	API          *stream.API // never nil once classified: stream.APIOther when no route matches
	Model        string
	Stream       bool
	MaxTokens    int64
	IncludeUsage bool // the client asked for usage itself (stream.Request.Usage)
	Temperature  *float64
	TopP         *float64
	Seed         *int64
	Whole        bool // the whole body was read and parsed
	// Read is "" when Whole, else why not (record.Record.RequestRead):
	// ReadPartial, ReadBudget or ReadUnparsed. The fields above were then
	// read best effort, and the response decides Stream (modifyResponse).
	Read string
	// Declared is what the body declares for the structure checks (its
	// tools, a JSON output), read only when they are on (peek's declare)
	// and the body was read whole; its schemas alias the body.
	Declared stream.Declared // Prefix is the peeked prefix of a body longer than the peek
	// (ReadPartial, ReadBudget), for the workload capture; nil otherwise.
	Prefix []byte
	// held is what the peek took from the proxy's PeekBudget (its
	// buffer's capacity), given back when the request ends.
	held int
}

// The values of requestInfo.Read and record.Record.RequestRead.
const (
	ReadPartial  = "partial"  // the body was longer than the peek
	ReadUnparsed = "unparsed" // the body was not one JSON object
	ReadBudget   = "budget"   // the peek budget was full before the body ended (PeekBudget)
)

// classify maps a route to the API it speaks (stream.Classify: the
// routes are in each API's description). Only POSTs are understood.
// engine is the detected engine kind ("" when unknown): two routes mean
// different things on different engines.
func classify(r *http.Request, engine string) *stream.API {
	if r.Method != http.MethodPost {
		return stream.APIOther
	}
	return stream.Classify(r.URL.Path, engine)
}

// The engine kinds classify depends on, as engine.Kind names them.
const (
	EngineTGI      = stream.EngineTGI
	EngineLlamaCpp = stream.EngineLlamaCpp
)

// formatOf is the wire format of an API's responses (stream.API's
// BodyFormat).
func formatOf(api *stream.API) stream.Format { return api.BodyFormat() }

// injectable reports whether the API has a way to ask the engine for
// usage in a stream (stream.Request.Usage).
func injectable(api *stream.API) bool { return api.Request.Usage != nil }

// bodyFields are the top-level members of a request body that the peek
// keeps: the model, the stream flag, and the raw values of peekKeys (the
// members some API's stream.Request names), aliasing the body.
type bodyFields struct {
	Model  string
	Stream *bool
	vals   [][]byte // by index in peekKeys; nil: absent
}

// peekKeys are the top-level members some API's request description
// names: its output-token limit, its sampling object and parameters, its
// usage option.
var peekKeys = func() []string {
	var keys []string
	add := func(k string) {
		k, _, _ = strings.Cut(k, ".")
		if k != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, a := range stream.APIs() {
		rq := a.Request
		for _, k := range rq.MaxTokens {
			add(k)
		}
		add(rq.Sampling)
		for _, k := range rq.SamplingNames() {
			add(k)
		}
		for _, k := range rq.DeclareKeys {
			add(k)
		}
		if rq.Usage != nil {
			add(rq.Usage.Object)
		}
	}
	return keys
}()

// raw returns the value of a member path ("max_tokens",
// "options.num_predict"), nil when the body has none or a level of it is
// not an object.
func (b *bodyFields) raw(path string) []byte {
	top, rest, nested := strings.Cut(path, ".")
	i := slices.Index(peekKeys, top)
	if i < 0 || b.vals == nil {
		return nil
	}
	v := b.vals[i]
	if !nested || v == nil {
		return v
	}
	var inner []byte
	stream.TopMembers(v, func(k []byte, s, e int) {
		if string(k) == rest {
			inner = v[s:e]
		}
	})
	return inner
}

// object reports whether the member path holds a JSON object.
func (b *bodyFields) object(path string) bool {
	v := bytes.TrimLeft(b.raw(path), " \t\r\n")
	return len(v) > 0 && v[0] == '{'
}

// decode reads the member path into a new *T: nil when it is absent,
// null or not a T.
func decode[T any](b *bodyFields, path string) *T {
	v := b.raw(path)
	if v == nil {
		return nil
	}
	var p *T
	if json.Unmarshal(v, &p) != nil {
		return nil
	}
	return p
}

func (b *bodyFields) info(api *stream.API, whole bool, path string) requestInfo {
	in := requestInfo{API: api, Model: b.Model, Whole: whole}
	in.Stream = b.Stream != nil && *b.Stream
	rq := api.Request
	if in.Model == "" && rq.ModelFromPath != nil {
		m := rq.ModelFromPath(path)
		if len(m) > record.MaxModelBytes { // as member keeps it
			m = m[:record.MaxModelBytes+1]
		}
		in.Model = strings.Clone(m)
	}
	if rq.StreamUnlessFalse {
		in.Stream = b.Stream == nil || *b.Stream
	}
	if rq.StreamRoute != "" && strings.HasSuffix(strings.TrimSuffix(path, "/"), rq.StreamRoute) {
		in.Stream = true
	}
	// The sampling parameters are the sampling object's when the body has
	// one, else the top level's.
	names, prefix := rq.SamplingNames(), ""
	if rq.Sampling != "" && b.object(rq.Sampling) {
		prefix = rq.Sampling + "."
	} else {
		names = stream.Request{}.SamplingNames()
	}
	in.Temperature, in.TopP, in.Seed = decode[float64](b, prefix+names[0]), decode[float64](b, prefix+names[1]), decode[int64](b, prefix+names[2])
	for _, name := range rq.MaxTokens {
		if p := decode[int64](b, name); p != nil {
			in.MaxTokens = *p
			break
		}
	}
	if u := rq.Usage; u != nil {
		if asked := decode[bool](b, u.Object+"."+u.Member); asked != nil {
			in.IncludeUsage = *asked
		}
	}
	return in
}

// member reads one top-level member of a request body into b, if it is
// one of those the sidecar uses; a value of the wrong type is ignored.
// Only these small values are decoded, when they are used: the messages
// and prompt, nearly all of a large body, are skipped over where they
// lie.
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
	case "stream":
		var s *bool
		if json.Unmarshal(val, &s) == nil {
			b.Stream = s
		}
	default:
		if i := slices.Index(peekKeys, string(key)); i >= 0 {
			if b.vals == nil {
				b.vals = make([][]byte, len(peekKeys))
			}
			b.vals[i] = val
		}
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
// delayed past the peek. The peek's buffer is taken from budget as it
// grows (readAtMost); when budget has no room the peek stops where it
// is, as at the limit, with Read ReadBudget (counted in budget's Full).
// What it holds is requestInfo.held: the caller gives it back when the
// request ends (on an error, peek has).
//
// Design note: memory. A request body costs its own size, in the buffer
// it is read into, and a third more in the smaller buffers it outgrew:
// the buffer grows with the bytes that arrived, four times at a step
// (readAtMost), never to a size the request only claims (a client that
// declares a 1 MiB Content-Length and sends a byte every few seconds held
// 1 MiB of heap; TestPeekHeapPerSlowClient). The members the sidecar
// needs are found by stream's scanner, which allocates nothing, and only
// their small values are decoded (json.Unmarshal of the whole body into
// the fields walked every message; withUsage then decoded the body
// into a map and encoded it again: 4.9 MB allocated for a 1 MB body,
// about 8 MB of RSS per request in flight; now 1.4 MB;
// TestPrepareBytesPer1MBRequest, docs/performance.md).
//
// declare: the structure checks are on; the body's declared tools and
// JSON output are read (requestInfo.Declared) when it is read whole.
func peek(body io.ReadCloser, api *stream.API, path string, limit int, size int64, declare bool, budget *PeekBudget) (requestInfo, []byte, io.ReadCloser, error) {
	var none bodyFields
	if body == nil || body == http.NoBody {
		return none.info(api, true, path), nil, body, nil
	}
	buf, held, full, err := readAtMost(body, limit+1, size, budget)
	if err != nil {
		budget.give(held)
		return none.info(api, false, path), nil, nil, err
	}
	var f bodyFields
	end := readFields(buf, &f)
	if len(buf) <= limit && !full {
		body.Close()
		rest := io.NopCloser(bytes.NewReader(buf))
		if end < 0 || len(bytes.TrimLeft(buf[end:], " \t\r\n")) > 0 || !json.Valid(buf) {
			// Not one JSON object (an object followed by junk, say, which
			// some engines accept): what the object that starts it says,
			// best effort.
			in := f.info(api, false, path)
			in.Read, in.held = ReadUnparsed, held
			return in, buf, rest, nil
		}
		in := f.info(api, true, path)
		if declare && api.Request.Declares != nil {
			in.Declared = api.Request.Declares(f.raw)
		}
		in.held = held
		return in, buf, rest, nil
	}
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), body), body}
	in := f.info(api, false, path)
	in.Read, in.Prefix, in.held = ReadPartial, buf[:min(len(buf), limit)], held
	if full {
		budget.full.Add(1)
		in.Read = ReadBudget
	}
	return in, nil, rest, nil
}

// A peek's buffer starts at peekFirst bytes (less when the body says it
// is shorter) and grows peekGrowth times when it is full.
const (
	peekFirst  = 4 << 10
	peekGrowth = 4
)

// readAtMost reads r until EOF or n bytes. size is how long r says it is
// (-1: unknown): the buffer is never made longer than that (plus one
// byte, to see EOF without growing), but it is not made that long either
// until the bytes arrive: it starts at peekFirst and grows peekGrowth
// times when full, each growth first taken from budget (nil: no bound).
// held is what it took, the buffer's capacity; full reports that budget
// refused a growth, and buf is then what had arrived.
func readAtMost(r io.Reader, n int, size int64, budget *PeekBudget) (buf []byte, held int, full bool, err error) {
	for len(buf) < n {
		if len(buf) == cap(buf) {
			c := min(max(peekFirst, peekGrowth*cap(buf)), n)
			if n-c < c/4 {
				c = n // no last growth by a few bytes (1 MiB, then 1 MiB and a byte)
			}
			if size >= 0 && int64(len(buf)) <= size && int64(c) > size+1 {
				c = int(size + 1)
			}
			if !budget.take(c - held) {
				return buf, held, true, nil
			}
			buf, held = append(make([]byte, 0, c), buf...), c
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, held, false, nil
		}
		if err != nil {
			return buf, held, false, err
		}
	}
	return buf, held, false, nil
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

// withUsage returns the body asking for usage as u says (OpenAI's
// stream_options.include_usage set to true), every other member kept as
// it was, byte for byte and in its place: a u.Object object is replaced
// by one with u.Member added, a null one by {"<Member>":true}, and a
// body without one gets that member first. body must be one JSON object
// (peek's Whole). Of several u.Object members the last is replaced (the
// one JSON decoders keep).
func withUsage(body []byte, u *stream.UsageOption) (*splicedBody, error) {
	so, soEnd := -1, -1
	end := stream.TopMembers(body, func(k []byte, s, e int) {
		if string(k) == u.Object {
			so, soEnd = s, e
		}
	})
	if end < 0 {
		return nil, errors.New("not a JSON object")
	}
	if so < 0 {
		open := bytes.IndexByte(body, '{') + 1
		member := strconv.Quote(u.Object) + ":{" + strconv.Quote(u.Member) + ":true}"
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
	m[u.Member] = json.RawMessage("true")
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
