package proxy

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
)

// judged runs a proxy with opts in front of h through a pipeline with
// the real Prometheus backend (live and at the end) and a judge of one
// TTFT SLO (1 min: every request here meets it), as the sidecar wires
// them.
func judged(t *testing.T, h http.Handler, opts Options) (*httptest.Server, *collect, *exporter.Metrics) {
	t.Helper()
	return judgedWith(t, h, opts, nil)
}

// judgedWith is judged whose every request carries hk (WithHook), as
// the in-process senders' do; nil: none.
func judgedWith(t *testing.T, h http.Handler, opts Options, hk *Hook) (*httptest.Server, *collect, *exporter.Metrics) {
	t.Helper()
	us := httptest.NewServer(h)
	t.Cleanup(us.Close)
	opts.Upstream, _ = url.Parse(us.URL)
	m := exporter.New(exporter.Config{})
	var sink collect
	judge := slo.NewJudge(slo.Config{Objectives: []slo.Objective{{Name: "fast", Target: 0.9, Thresholds: slo.Thresholds{TTFT: time.Minute}}}})
	opts.Pipeline = pipeline.New(pipeline.Options{Live: m, Models: m.Models(), Prometheus: m, Judge: judge, Sinks: []record.Sink{&sink}})
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var served http.Handler = p
	if hk != nil {
		served = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.ServeHTTP(w, r.WithContext(WithHook(r.Context(), hk))) })
	}
	fs := httptest.NewServer(served)
	t.Cleanup(fs.Close)
	return fs, &sink, m
}

// modelLabels returns the gen_ai_request_model values of a metric's series.
func modelLabels(t *testing.T, m *exporter.Metrics, name string) []string {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if s.GetHistogram() != nil && s.GetHistogram().GetSampleCount() == 0 {
				continue
			}
			out = append(out, labelOf(s, "gen_ai_request_model"))
		}
	}
	return out
}

func labelOf(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// counterValue returns the value of a counter's series with label=value.
func counterValue(t *testing.T, m *exporter.Metrics, name, label, value string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if labelOf(s, label) == value {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A request whose body was not read whole (longer than the peek with
// "stream" last, as the Vercel AI SDK writes it; or not one JSON object)
// is a stream when its answer is one: stream true, TTFT observed and
// judged, the model from the response when the request's was not read,
// and the record says the body was not read whole (issue 20, item 3).
func TestStreamDecidedByTheResponseWhenTheBodyWasNotReadWhole(t *testing.T) {
	content := strings.Repeat("x", 2<<20) // a 2 MiB prompt: over the 1 MiB peek
	msgs := `"messages":[{"role":"user","content":"` + content + `"}]`
	cases := []struct {
		name, body string
		read       string
		model      string // the record's model, and its label
	}{
		{"stream last", `{"model":"m",` + msgs + `,"max_tokens":3,"stream":true}`, ReadPartial, "m"},
		{"model and stream last", `{` + msgs + `,"model":"m","stream":true}`, ReadPartial, "served-m"},
		{"junk after the object", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true} junk`, ReadUnparsed, "m"},
	}
	events := []string{
		`data: {"model":"served-m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}` + "\n\n",
		`data: {"model":"served-m","choices":[{"index":0,"delta":{"content":"b"}}]}` + "\n\n",
		`data: {"model":"served-m","choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}` + "\n\n",
		"data: [DONE]\n\n",
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got <- b
				sse(events...)(w, r)
			})
			fs, sink, m := judged(t, h, Options{InjectUsage: true})
			resp, body := do(t, fs, "/v1/chat/completions", c.body)
			if resp.StatusCode != 200 || body != strings.Join(events, "") {
				t.Fatalf("status %d, body %q: want the engine's bytes", resp.StatusCode, body)
			}
			if b := <-got; string(b) != c.body {
				t.Fatalf("the engine got %d bytes, want the client's %d unchanged", len(b), len(c.body))
			}
			r := only(t, sink)
			if !r.Stream || r.RequestRead != c.read || r.Outcome != record.Success || r.Model != c.model {
				t.Fatalf("stream %v request_read %q outcome %s model %q, want a stream, %q, success, %q",
					r.Stream, r.RequestRead, r.Outcome, r.Model, c.read, c.model)
			}
			if _, ok := r.TTFT(); !ok || r.TokenEvents() != 3 || r.OutputTokens != 3 {
				t.Fatalf("TTFT observed %v, %d token events, %d output tokens: want a TTFT and 3", ok, r.TokenEvents(), r.OutputTokens)
			}
			if len(r.SLO) != 1 || !r.SLO[0].Qualified || len(r.SLO[0].NotApplicable) != 0 {
				t.Fatalf("verdicts %+v, want the TTFT SLO judged and met", r.SLO)
			}
			ttft := "gen_ai_server_time_to_first_token_seconds"
			if l := modelLabels(t, m, ttft); !slices.Equal(l, []string{c.model}) {
				t.Errorf("%s observed under models %q, want [%q]", ttft, l, c.model)
			}
			itl := "tokentap_inter_token_latency_seconds"
			if l := modelLabels(t, m, itl); !slices.Equal(l, []string{c.model}) {
				t.Errorf("%s (live) observed under models %q, want [%q]", itl, l, c.model)
			}
			if !strings.Contains(string(mustJSON(t, r)), `"request_read":"`+c.read+`"`) {
				t.Errorf("the record line does not say request_read %q", c.read)
			}
		})
	}
	// A body read whole says nothing of it.
	fs, sink, _ := judged(t, sse(events...), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	if r := only(t, sink); r.RequestRead != "" || strings.Contains(string(mustJSON(t, r)), "request_read") {
		t.Errorf("a body read whole: request_read %q", r.RequestRead)
	}
}

func mustJSON(t *testing.T, r *record.Record) []byte {
	t.Helper()
	b, err := r.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A stream with one event over the tap's 1 MiB bound (a base64 image in
// one chunk) is measured around it: the event is forwarded and counted,
// the events after it timed, and the stream that ends with a finish
// reason, usage and [DONE] is a success with usage's token counts, its
// bytes at the client the engine's (issue 20, item 3).
func TestOversizedEventIsCountedAndTheRestMeasured(t *testing.T) {
	huge := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, 3<<19)) // 2 MiB of base64
	sseEvents := []string{
		`data: {"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}` + "\n\n",
		`data: {"model":"m","choices":[{"index":0,"delta":{"content":"` + huge + `"}}]}` + "\n\n",
		`data: {"model":"m","choices":[{"index":0,"delta":{"content":"b"}}]}` + "\n\n",
		`data: {"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n",
		`data: {"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	ndjsonLines := []string{
		`{"model":"m","message":{"role":"assistant","content":"a"},"done":false}` + "\n",
		`{"model":"m","message":{"role":"assistant","content":"` + huge + `"},"done":false}` + "\n",
		`{"model":"m","message":{"role":"assistant","content":"b"},"done":false}` + "\n",
		`{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":5,"eval_count":7}` + "\n",
	}
	cases := []struct {
		name, path, body, ctype string
		events                  []string
		tapFailed               string
	}{
		{"sse, usage asked by the client", "/v1/chat/completions",
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, "text/event-stream", sseEvents, ""},
		// Strip mode forwards the 2 MiB content chunk as it arrives (its
		// choices begin it) and still cuts the usage chunk after it.
		{"sse, usage injected", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[]}`, "text/event-stream", sseEvents, ""},
		{"ndjson", "/api/chat", `{"model":"m","messages":[]}`, "application/x-ndjson", ndjsonLines, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", c.ctype)
				for _, e := range c.events {
					io.WriteString(w, e)
					w.(http.Flusher).Flush()
				}
			})
			fs, sink, m := judged(t, h, Options{InjectUsage: true})
			_, body := do(t, fs, c.path, c.body)
			want := strings.Join(c.events, "")
			if c.name == "sse, usage injected" { // less the usage chunk the sidecar asked for
				want = strings.Join(slices.Concat(c.events[:4], c.events[5:]), "")
			}
			if body != want {
				t.Fatalf("the client got %d bytes, want the engine's %d byte for byte", len(body), len(want))
			}
			r := only(t, sink)
			if r.Outcome != record.Success || r.ErrorType != "" || r.FinishReason != "stop" {
				t.Fatalf("outcome %s/%s finish %q, want success, stop", r.Outcome, r.ErrorType, r.FinishReason)
			}
			if r.OutputTokens != 7 || r.TokenSource != "usage" || r.InputTokens != 5 {
				t.Fatalf("tokens %d in, %d out from %q, want 5 and 7 from usage", r.InputTokens, r.OutputTokens, r.TokenSource)
			}
			if r.OversizedEvents != 1 || r.TokenEvents() != 2 || r.TapFailed != c.tapFailed {
				t.Fatalf("oversized %d, token events %d, tap_failed %q: want 1, 2 (a and b), %q",
					r.OversizedEvents, r.TokenEvents(), r.TapFailed, c.tapFailed)
			}
			if !strings.Contains(string(mustJSON(t, r)), `"oversized_events":1,`) {
				t.Errorf("the record line does not say oversized_events 1")
			}
			if n := counterValue(t, m, "tokentap_tap_failures_total", "reason", "event_too_large"); n != 1 {
				t.Errorf("tokentap_tap_failures_total{reason=event_too_large} = %v, want 1", n)
			}
		})
	}
}

// Without usage, a stream with an oversized event has no exact token
// count: the event's tokens are unknown.
func TestOversizedEventWithoutUsageLeavesTheCountUnknown(t *testing.T) {
	huge := strings.Repeat("x", 1<<20+1)
	fs, sink, _ := judged(t, sse(
		`data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n",
		`data: {"choices":[{"delta":{"content":"`+huge+`"}}]}`+"\n\n",
		`data: {"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}`+"\n\n",
		"data: [DONE]\n\n"), Options{})
	do(t, fs, "/v1/chat/completions", streamBody)
	r := only(t, sink)
	if r.Outcome != record.Success || r.OutputTokens != -1 || r.TokenSource != "none" || r.OversizedEvents != 1 {
		t.Fatalf("outcome %s, %d output tokens from %q, oversized %d: want success, unknown, 1",
			r.Outcome, r.OutputTokens, r.TokenSource, r.OversizedEvents)
	}
}
