package capture_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/prefix"
	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// canned answers every request at once with the same 64-token stream
// and its usage.
type canned struct{ body []byte }

func (c canned) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(c.body)), Request: r}, nil
}

func cannedStream(tokens int) []byte {
	var b strings.Builder
	for range tokens {
		b.WriteString(`data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"content":" tok"}}]}` + "\n\n")
	}
	fmt.Fprintf(&b, `data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", 1000, tokens, 1000+tokens)
	b.WriteString("data: [DONE]\n\n")
	return []byte(b.String())
}

// newProxy is a proxy in front of the canned engine, with c as its
// pipeline's capture (nil: off).
func newProxy(b *testing.B, c *capture.Capture) *proxy.Proxy {
	opts := pipeline.Options{}
	if c != nil {
		opts.Capture = c
	}
	up, _ := url.Parse("http://engine.invalid")
	p, err := proxy.New(proxy.Options{Upstream: up, Transport: canned{cannedStream(64)}, Pipeline: pipeline.New(opts)})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func chatBody(size int) []byte {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("be brief. ", size/20)}, {"role": "user", "content": strings.Repeat("what now? ", size/20)}}
	body, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	return body
}

// BenchmarkCaptureCost is the capture's cost per request as a ratio to
// the same request without it, measured in the same run
// (docs/performance.md, "Workload capture"): one whole streamed request
// (64 tokens) through the proxy and the pipeline, alternately through a
// proxy without the capture and one with it, each timed on its own; the
// medians are reported (off-µs, on-µs) and their ratio. Alternating
// makes both see the same machine, busy or not.
func BenchmarkCaptureCost(b *testing.B) {
	for _, size := range []int{2 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKiB", size>>10), func(b *testing.B) {
			body := chatBody(size)
			c, err := capture.Open(capture.Options{Path: filepath.Join(b.TempDir(), "c.jsonl"), Secret: bytes.Repeat([]byte{3}, 32)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			ps := [2]*proxy.Proxy{newProxy(b, nil), newProxy(b, c)}
			var took [2][]time.Duration
			one := func(k int) {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				start := time.Now()
				ps[k].ServeHTTP(httptest.NewRecorder(), r)
				took[k] = append(took[k], time.Since(start))
			}
			i := 0
			for b.Loop() {
				one(i % 2)
				one(1 - i%2)
				i++
			}
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2]) / 1e3
			}
			off, on := med(took[0]), med(took[1])
			b.ReportMetric(off, "off-µs")
			b.ReportMetric(on, "on-µs")
			b.ReportMetric(on/off, "ratio")
		})
	}
}

// BenchmarkRequest is the capture's cost per request (docs/performance.md,
// "Workload capture"): one whole streamed request (64 tokens) through the
// proxy and the pipeline, with the capture off (the baseline) and on, for
// a 2 KiB and a 32 KiB prompt, in the same run.
func BenchmarkRequest(b *testing.B) {
	for _, size := range []int{2 << 10, 32 << 10} {
		msgs := []map[string]string{{"role": "system", "content": strings.Repeat("be brief. ", size/20)}, {"role": "user", "content": strings.Repeat("what now? ", size/20)}}
		body, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs, "stream": true, "stream_options": map[string]any{"include_usage": true}})
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("prompt=%dKiB/capture=off", size>>10)
			if on {
				name = fmt.Sprintf("prompt=%dKiB/capture=on", size>>10)
			}
			b.Run(name, func(b *testing.B) {
				var c *capture.Capture
				if on {
					var err error
					c, err = capture.Open(capture.Options{Path: filepath.Join(b.TempDir(), "c.jsonl"), Secret: bytes.Repeat([]byte{3}, 32)})
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close(context.Background())
				}
				p := newProxy(b, c)
				b.ReportAllocs()
				for b.Loop() {
					r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
					w := httptest.NewRecorder()
					p.ServeHTTP(w, r)
				}
				if c != nil {
					c.Close(context.Background())
					if st := c.Stats(); st.Written+st.FileDropped == 0 {
						b.Fatal("nothing captured")
					}
				}
			})
		}
	}
}

// BenchmarkEnd is the capture's own work at the end of one request, on
// the request's goroutine: the canonical prompt scanned and hashed, the
// line's item built and queued (the writer's encoding is off this
// goroutine).
func BenchmarkEnd(b *testing.B) {
	for _, size := range []int{2 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKiB", size>>10), func(b *testing.B) {
			msgs := []map[string]string{{"role": "system", "content": strings.Repeat("be brief. ", size/20)}, {"role": "user", "content": strings.Repeat("what now? ", size/20)}}
			body, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs})
			c, err := capture.Open(capture.Options{Path: filepath.Join(b.TempDir(), "c.jsonl"), Secret: bytes.Repeat([]byte{3}, 32)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(context.Background())
			rec := record.New(0)
			rec.API, rec.Outcome, rec.InputTokens, rec.OutputTokens, rec.TokenSource = stream.NameChat, record.Success, int64(len(body)/4), 64, "usage"
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				rec.Arrive = time.Now()
				c.Track(capture.Request{Arrive: rec.Arrive, API: stream.NameChat, Body: body}).End(rec, "m1")
			}
		})
	}
}

// BenchmarkReuseCost is the live reuse's cost per request as a ratio to
// the capture's own (docs/performance.md, "Live reuse"): the capture's
// work at the end of one request (prompt hashed, line built and handed
// to the file: a hold of 1 emits the previous line at once), alternately
// by a capture without the reuse and one with it (window 1 h, caches of
// 256 and 2048 blocks), each timed on its own; the medians (off-µs,
// on-µs) and their ratio. Every request's prompt is the one before's
// but for a number at its end: all its blocks but the last are reused.
func BenchmarkReuseCost(b *testing.B) {
	for _, size := range []int{2 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKiB", size>>10), func(b *testing.B) {
			var cs [2]*capture.Capture
			for k := range cs {
				o := capture.Options{Path: filepath.Join(b.TempDir(), "c.jsonl"), Secret: bytes.Repeat([]byte{3}, 32), Hold: 1}
				if k == 1 {
					o.Reuse = &prefix.Options{Window: time.Hour, Sizes: []int{256, 2048}}
				}
				c, err := capture.Open(o)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close(context.Background())
				cs[k] = c
			}
			shared := strings.Repeat("be brief. ", size/20)
			rec := record.New(0)
			rec.API, rec.Outcome, rec.OutputTokens, rec.TokenSource = stream.NameChat, record.Success, 64, "usage"
			var took [2][]time.Duration
			n := 0
			one := func(k int) {
				msgs := []map[string]string{{"role": "system", "content": shared}, {"role": "user", "content": fmt.Sprintf("%s %d", strings.Repeat("what now? ", size/20), n)}}
				body, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs})
				rec.InputTokens = int64(len(body) / 4)
				rec.Arrive = time.Now()
				start := time.Now()
				cs[k].Track(capture.Request{Arrive: rec.Arrive, API: stream.NameChat, Body: body}).End(rec, "m1")
				took[k] = append(took[k], time.Since(start))
			}
			i := 0
			for b.Loop() {
				n++
				one(i % 2)
				one(1 - i%2)
				i++
			}
			if st := cs[1].Stats().Reuse; st.Reused == 0 {
				b.Fatalf("no reuse counted: %+v", st)
			}
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2]) / 1e3
			}
			off, on := med(took[0]), med(took[1])
			b.ReportMetric(off, "off-µs")
			b.ReportMetric(on, "on-µs")
			b.ReportMetric(on/off, "ratio")
		})
	}
}
