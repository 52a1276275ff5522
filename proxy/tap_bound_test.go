package proxy

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
)

// Strip mode's bounds: what it holds, single-LF framing, compression.

const (
	boundTok   = `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`
	boundUsage = `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`
)

// reasonObs counts the tap's give-ups; everything else it ignores.
type reasonObs struct {
	record.Observation
	mu      sync.Mutex
	reasons []string
}

func newReasonObs() *reasonObs {
	return &reasonObs{Observation: record.Nop{}.Begin(record.Key{})}
}

func (o *reasonObs) Begin(record.Key) record.Observation { return o }
func (o *reasonObs) TapFailed(r string) {
	o.mu.Lock()
	o.reasons = append(o.reasons, r)
	o.mu.Unlock()
}
func (o *reasonObs) got() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.reasons)
}

// plainClient neither asks for compression nor decodes it: what the
// sidecar sends is what it reads.
func plainClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableCompression: true}}
}

func post(t *testing.T, c *http.Client, url string, hdr http.Header) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// upstreamSaw is what the engine got: whether usage was asked for, and
// the Accept-Encoding.
type upstreamSaw struct {
	mu             sync.Mutex
	includeUsage   bool
	streamOptions  bool
	acceptEncoding []string
}

func (u *upstreamSaw) note(t *testing.T, r *http.Request) {
	var req struct {
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		t.Errorf("upstream: %v", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.streamOptions = req.StreamOptions != nil
	u.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	u.acceptEncoding = r.Header.Values("Accept-Encoding")
}

// An upstream that sends comment lines without ending an event (150 MB
// of them), then a usage chunk: the client gets every comment line as it
// comes (from the first 64 KiB on rather than at the end), the sidecar's
// heap stays flat, nothing is given up, and the usage chunk is cut.
func TestStripCommentFloodIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("150 MB through the proxy")
	}
	const total = 150 << 20
	block := bytes.Repeat([]byte(": comment\n"), 6554) // 65,540 bytes
	const tail = "\n" + boundUsage + "\n\ndata: [DONE]\n\n"
	want := sha256.New()
	for n := 0; n < total; n += len(block) {
		want.Write(block[:min(len(block), total-n)])
	}
	want.Write([]byte("\ndata: [DONE]\n\n"))
	var upDone atomic.Int64
	var saw upstreamSaw
	obs := newReasonObs()
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw.note(t, r)
		w.Header().Set("Content-Type", "text/event-stream")
		for n := 0; n < total; n += len(block) {
			if _, err := w.Write(block[:min(len(block), total-n)]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		upDone.Store(time.Now().UnixNano())
		io.WriteString(w, tail)
	}), Options{InjectUsage: true}, obs)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	resp := post(t, plainClient(), fs.URL, nil)
	got := sha256.New()
	buf := make([]byte, 32<<10)
	var n int64
	var first time.Time
	for {
		k, err := resp.Body.Read(buf)
		if k > 0 && first.IsZero() {
			first = time.Now()
		}
		got.Write(buf[:k])
		n += int64(k)
		if err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
	}
	resp.Body.Close()
	end := time.Now()
	close(stop)
	<-sampled

	if wantN := int64(total + len(tail) - len(boundUsage) - 2); n != wantN || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("client got %d bytes (want %d), same bytes: %v", n, wantN, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	upEnd := time.Unix(0, upDone.Load())
	if !first.Before(upEnd) {
		t.Fatalf("first bytes at %v, upstream finished at %v: held to the end", first.Sub(start), upEnd.Sub(start))
	}
	growth := int64(peak.Load()) - int64(base)
	t.Logf("150 MB in %v; first bytes after %v, upstream done after %v; heap in use %d MB at start, peak %d MB (growth %.1f MB)",
		end.Sub(start).Round(time.Millisecond), first.Sub(start).Round(time.Microsecond), upEnd.Sub(start).Round(time.Millisecond),
		base>>20, peak.Load()>>20, float64(growth)/(1<<20))
	if growth > 100<<20 {
		t.Fatalf("heap grew by %d MB", growth>>20)
	}
	r := only(t, sink)
	if !saw.includeUsage || !r.UsageInjected {
		t.Fatal("usage was not injected: strip mode not exercised")
	}
	if r.TapFailed != "" || len(obs.got()) != 0 {
		t.Fatalf("TapFailed %q, give-ups counted %v: comment lines are never held", r.TapFailed, obs.got())
	}
	if r.TokenSource != "usage" || r.OutputTokens != 7 || r.InputTokens != 3 {
		t.Fatalf("tokens %d in, %d out from %s", r.InputTokens, r.OutputTokens, r.TokenSource)
	}
}

// What the tap holds of an event that does not end, read in pieces of
// every size: comment lines and a data line that is no JSON object, none
// of it (forwarded as it comes, nothing given up); lines of another field,
// or a JSON data line that never shows what it is, at most stripHoldMax
// plus one read, after which that event is forwarded as it is and
// counted, and strip mode goes on: the next usage chunk is still cut and
// counted, and the events after it timed.
func TestStripHoldsAtMostTheCap(t *testing.T) {
	flood := strings.Repeat(": comment\n", 100_000)                    // 1 MB
	fields := strings.Repeat("event: x\n", 100_000)                    // 900 KB
	line := "data: " + strings.Repeat("x", 200_000)                    // one line larger than the cap
	undecided := `data: {"id":"` + strings.Repeat("x", 200_000) + `"}` // no "choices" before the cap
	for _, tc := range []struct {
		name, in string
		passed   bool // the event after the first is forwarded for its size
	}{
		{"comments", boundTok + "\n\n" + flood + "\n" + boundTok + "\n\n" + boundUsage + "\n\n", false},
		{"long line", boundTok + "\r\n\r\n" + line + "\r\n\r\n" + boundTok + "\r\n\r\n" + boundUsage + "\r\n\r\n", false},
		{"other fields", boundTok + "\n\n" + fields + "\n" + boundTok + "\n\n" + boundUsage + "\n\n", true},
		{"undecided JSON", boundTok + "\n\n" + undecided + "\n\n" + boundTok + "\n\n" + boundUsage + "\n\n", true},
	} {
		for _, size := range []int{1, 7, 4096, 32 << 10} {
			maxHeld := 0
			out, tp := runStripTap([]byte(tc.in), []int{size}, 32<<10, func(tp *tap) {
				maxHeld = max(maxHeld, len(tp.held))
			})
			rec := tp.st.rec
			want := strings.TrimSuffix(tc.in, boundUsage+"\n\n")
			if strings.HasSuffix(tc.in, "\r\n") {
				want = strings.TrimSuffix(tc.in, boundUsage+"\r\n\r\n")
			}
			if out := string(out); out != want {
				t.Fatalf("%s, reads of %d: client bytes differ (%d of %d)", tc.name, size, len(out), len(want))
			}
			limit := stripHoldMax + size
			if !tc.passed {
				limit = len(boundUsage) + 4 + size // an event never forwarded before it ends: the usage chunk
			}
			if maxHeld > limit {
				t.Fatalf("%s, reads of %d: held %d bytes (limit %d)", tc.name, size, maxHeld, limit)
			}
			wantFailed := ""
			if tc.passed {
				wantFailed = "strip_overflow"
			}
			if rec.TapFailed != wantFailed || tp.gaveUpAt != -1 || tp.degraded {
				t.Fatalf("%s, reads of %d: TapFailed %q, gave up at %d", tc.name, size, rec.TapFailed, tp.gaveUpAt)
			}
			if rec.TokenEvents() != 2 || !tp.sawUsage || tp.usageOut != 7 {
				t.Fatalf("%s, reads of %d: %d token events, usage %v/%d: timing stopped", tc.name, size, rec.TokenEvents(), tp.sawUsage, tp.usageOut)
			}
		}
	}
	// A large event that arrives whole is complete when framed: nothing
	// held, nothing given up, the usage event still cut.
	in := boundTok + "\n\n" + undecided + "\n\n" + boundUsage + "\n\n"
	out, tp := runStripTap([]byte(in), []int{len(in)}, len(in), nil)
	if string(out) != boundTok+"\n\n"+undecided+"\n\n" || tp.st.rec.TapFailed != "" {
		t.Fatalf("a whole large event: TapFailed %q, %d bytes out", tp.st.rec.TapFailed, len(out))
	}
}

// An engine that ends its events with a single LF: each event reaches the
// client when its line ends (not when the stream does), strip mode gives
// up from the second one and says so, and the client gets exactly what
// the engine sent, the usage chunk included.
func TestStripSingleLFIsNotHeld(t *testing.T) {
	const gap = 200 * time.Millisecond
	events := []string{boundTok + "\n", boundTok + "\n", boundUsage + "\n", "data: [DONE]\n"}
	wrote := make([]time.Time, len(events))
	var saw upstreamSaw
	obs := newReasonObs()
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw.note(t, r)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, e := range events {
			if i > 0 {
				time.Sleep(gap)
			}
			saw.mu.Lock()
			wrote[i] = time.Now()
			saw.mu.Unlock()
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}), Options{InjectUsage: true}, obs)
	resp := post(t, plainClient(), fs.URL, nil)
	var body []byte
	var arrived []time.Time // when the client had each event whole
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		body = append(body, buf[:n]...)
		for len(arrived) < len(events) && len(body) >= len(strings.Join(events[:len(arrived)+1], "")) {
			arrived = append(arrived, time.Now())
		}
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	if string(body) != strings.Join(events, "") {
		t.Fatalf("client got %q", body)
	}
	saw.mu.Lock()
	defer saw.mu.Unlock()
	for i := range events[:len(events)-1] {
		if !arrived[i].Before(wrote[i+1]) {
			t.Fatalf("event %d reached the client %v after it was sent, after the next one was", i, arrived[i].Sub(wrote[i]))
		}
	}
	t.Logf("first event reached the client %v after the engine sent it (next event %v later)",
		arrived[0].Sub(wrote[0]).Round(time.Microsecond), gap)
	r := only(t, sink)
	if !saw.includeUsage || !r.UsageInjected {
		t.Fatal("usage was not injected: strip mode not exercised")
	}
	if r.TapFailed != "single_lf_framing" {
		t.Fatalf("TapFailed %q, want single_lf_framing", r.TapFailed)
	}
	if g := obs.got(); !slices.Equal(g, []string{"single_lf_framing"}) {
		t.Fatalf("give-ups counted %v", g)
	}
}

// A stream framed with blank lines, written in pieces (each line apart
// from the blank line that ends its event): byte-identical to the stream
// less the usage event, nothing given up, usage counted.
func TestStripBlankLineStreamInPieces(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		var pieces []string
		for _, e := range []string{": ping", boundTok, boundTok, "event: x" + eol + "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}", boundUsage, "data: [DONE]"} {
			pieces = append(pieces, e+eol, eol)
		}
		obs := newReasonObs()
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, p := range pieces {
				io.WriteString(w, p)
				w.(http.Flusher).Flush()
				time.Sleep(3 * time.Millisecond)
			}
		}), Options{InjectUsage: true}, obs)
		resp := post(t, plainClient(), fs.URL, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := strings.Join(slices.Concat(pieces[:8], pieces[10:]), "")
		if string(body) != want {
			t.Fatalf("eol %q: client got %q\nwant %q", eol, body, want)
		}
		r := only(t, sink)
		if !r.UsageInjected || r.TapFailed != "" || len(obs.got()) != 0 {
			t.Fatalf("eol %q: injected %v, TapFailed %q, counted %v", eol, r.UsageInjected, r.TapFailed, obs.got())
		}
		if r.TokenSource != "usage" || r.OutputTokens != 7 || r.TokenEvents() != 3 {
			t.Fatalf("eol %q: %d tokens from %s, %d token events", eol, r.OutputTokens, r.TokenSource, r.TokenEvents())
		}
	}
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	io.WriteString(z, s)
	z.Close()
	return b.Bytes()
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	z, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// gzipEngine answers in gzip whatever it was asked, with the usage event
// when it was asked for it.
// gzipEngine compresses its stream when the request asks for gzip, or
// always (a misbehaving engine).
func gzipEngine(t *testing.T, saw *upstreamSaw, sent *[]byte, always bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		saw.note(t, r)
		s := boundTok + "\n\n"
		saw.mu.Lock()
		if saw.includeUsage {
			s += boundUsage + "\n\n"
		}
		s += "data: [DONE]\n\n"
		b := []byte(s)
		gz := always || strings.Contains(r.Header.Get("Accept-Encoding"), "gzip")
		if gz {
			b = gzipped(s)
		}
		*sent = b
		saw.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if gz {
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.(http.Flusher).Flush() // chunked: the client's EOF comes after the record
		w.Write(b)
	}
}

// A client that asks for compression still gets the injection: the
// engine is asked for identity (allowed unless the client refuses it),
// the client's bytes are the engine's minus the usage chunk. Go's default
// client asks for gzip by itself; it too gets exact counts. A client that
// refuses identity gets no injection and the engine's bytes as they came.
func TestInjectionAsksForIdentityEvenWhenTheClientAcceptsGzip(t *testing.T) {
	for _, client := range []struct {
		name string
		c    *http.Client
		h    http.Header
	}{{"explicit gzip", plainClient(), http.Header{"Accept-Encoding": {"gzip, deflate"}}}, {"Go default client", http.DefaultClient, nil}} {
		var saw upstreamSaw
		var sent []byte
		fs, sink := front(t, gzipEngine(t, &saw, &sent, false), Options{InjectUsage: true})
		resp := post(t, client.c, fs.URL, client.h)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		saw.mu.Lock()
		if !saw.streamOptions || !slices.Equal(saw.acceptEncoding, []string{"identity"}) {
			t.Fatalf("%s: upstream saw stream_options %v, Accept-Encoding %q", client.name, saw.streamOptions, saw.acceptEncoding)
		}
		saw.mu.Unlock()
		if resp.Header.Get("Content-Encoding") != "" || string(body) != boundTok+"\n\ndata: [DONE]\n\n" {
			t.Fatalf("%s: client got %q (encoding %q)", client.name, body, resp.Header.Get("Content-Encoding"))
		}
		if r := only(t, sink); !r.UsageInjected || r.TokenSource != "usage" || r.TapFailed != "" {
			t.Fatalf("%s: record injected %v source %s tap_failed %q", client.name, r.UsageInjected, r.TokenSource, r.TapFailed)
		}
	}
	for _, refuse := range []string{"gzip, identity;q=0", "gzip, *;q=0"} {
		var saw upstreamSaw
		var sent []byte
		fs, sink := front(t, gzipEngine(t, &saw, &sent, false), Options{InjectUsage: true})
		resp := post(t, plainClient(), fs.URL, http.Header{"Accept-Encoding": {refuse}})
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		saw.mu.Lock()
		if saw.streamOptions || !bytes.Equal(body, sent) {
			t.Fatalf("%q: upstream saw stream_options %v; client bytes equal %v", refuse, saw.streamOptions, bytes.Equal(body, sent))
		}
		saw.mu.Unlock()
		if r := only(t, sink); r.UsageInjected {
			t.Fatalf("%q: usage injected for a client that refuses identity", refuse)
		}
	}
}

// A client that does not ask for compression gets injection, and the
// engine is asked for identity.
func TestInjectionAsksForIdentity(t *testing.T) {
	for _, ae := range [][]string{nil, {"identity"}, {"gzip;q=0, identity"}, {"br; q=0.0", "identity;q=1"}} {
		var saw upstreamSaw
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			saw.note(t, r)
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush() // chunked: the client's EOF comes after the record
			io.WriteString(w, boundTok+"\n\n"+boundUsage+"\n\ndata: [DONE]\n\n")
		}), Options{InjectUsage: true})
		var hdr http.Header
		if ae != nil {
			hdr = http.Header{"Accept-Encoding": ae}
		}
		resp := post(t, plainClient(), fs.URL, hdr)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		saw.mu.Lock()
		if !saw.includeUsage || !slices.Equal(saw.acceptEncoding, []string{"identity"}) {
			t.Fatalf("client Accept-Encoding %q: upstream saw include_usage %v, Accept-Encoding %q", ae, saw.includeUsage, saw.acceptEncoding)
		}
		saw.mu.Unlock()
		if string(body) != boundTok+"\n\ndata: [DONE]\n\n" {
			t.Fatalf("client Accept-Encoding %q: body %q", ae, body)
		}
		if r := only(t, sink); !r.UsageInjected || r.TapFailed != "" || r.OutputTokens != 7 {
			t.Fatalf("client Accept-Encoding %q: injected %v TapFailed %q tokens %d", ae, r.UsageInjected, r.TapFailed, r.OutputTokens)
		}
	}
}

// An engine that compresses although asked for identity: the client gets
// the engine's bytes, and in them the usage chunk (the one case it cannot
// be removed); the record says why.
func TestCompressedAnswerAfterInjection(t *testing.T) {
	var saw upstreamSaw
	var sent []byte
	obs := newReasonObs()
	fs, sink := front(t, gzipEngine(t, &saw, &sent, true), Options{InjectUsage: true}, obs)
	resp := post(t, plainClient(), fs.URL, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	saw.mu.Lock()
	defer saw.mu.Unlock()
	if !saw.includeUsage || !bytes.Equal(body, sent) {
		t.Fatalf("include_usage %v; client bytes equal the engine's: %v", saw.includeUsage, bytes.Equal(body, sent))
	}
	if !strings.Contains(gunzip(t, body), boundUsage) {
		t.Fatal("the usage chunk was expected in the client's (compressed) bytes")
	}
	r := only(t, sink)
	if !r.UsageInjected || r.TapFailed != "content_encoding" {
		t.Fatalf("injected %v, TapFailed %q", r.UsageInjected, r.TapFailed)
	}
	if g := obs.got(); !slices.Equal(g, []string{"content_encoding"}) {
		t.Fatalf("give-ups counted %v", g)
	}
}

func TestRefusesIdentity(t *testing.T) {
	for _, tc := range []struct {
		ae   []string
		want bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{"identity"}, false},
		{[]string{"gzip, deflate, br, zstd"}, false},
		{[]string{"*"}, false},
		{[]string{"identity;q=0"}, true},
		{[]string{"gzip", "Identity; q=0.000"}, true},
		{[]string{"gzip, *;q=0"}, true},
		{[]string{"identity, *;q=0"}, false},
		{[]string{"identity;q=0.5"}, false},
		{[]string{"identity;q=bogus"}, false},
	} {
		h := http.Header{}
		for _, v := range tc.ae {
			h.Add("Accept-Encoding", v)
		}
		if got := refusesIdentity(h); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.ae, got, tc.want)
		}
	}
}
