package probe

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// handlerTransport runs an http.Handler in memory (synctest cannot use
// real sockets): the response body is a pipe, and a request whose
// context ends before the handler answered fails like a real transport.
type handlerTransport struct{ h http.Handler }

type pipeWriter struct {
	h       http.Header
	status  int
	started chan struct{}
	once    sync.Once
	pw      *io.PipeWriter
}

func (w *pipeWriter) Header() http.Header { return w.h }
func (w *pipeWriter) WriteHeader(s int) {
	w.once.Do(func() { w.status = s; close(w.started) })
}
func (w *pipeWriter) Write(b []byte) (int, error) { w.WriteHeader(200); return w.pw.Write(b) }
func (w *pipeWriter) Flush()                      { w.WriteHeader(200) }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{h: http.Header{}, started: make(chan struct{}), pw: pw}
	go func() {
		t.h.ServeHTTP(w, req)
		w.WriteHeader(200)
		pw.Close()
	}()
	select {
	case <-w.started:
		return &http.Response{StatusCode: w.status, Header: w.h, Body: pr, Request: req}, nil
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
}

type sink struct {
	mu   sync.Mutex
	recs []*record.Record
}

func (s *sink) Write(r *record.Record) { s.mu.Lock(); s.recs = append(s.recs, r); s.mu.Unlock() }

// Open loop: with an upstream that never answers, probes keep being
// scheduled on time; the cap turns the excess into not_sent records;
// schedule lag is exported; every scheduled probe ends in exactly one
// result.
func TestOpenLoopScheduleWithStallingUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stall := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			<-r.Context().Done() // never answers
		})
		reg := prometheus.NewRegistry()
		var recs sink
		u, _ := url.Parse("http://engine.invalid")
		cfg := Config{Probes: []Def{{Name: "p", Interval: time.Second, MaxConcurrent: 2, Timeout: 9500 * time.Millisecond}}}.WithDefaults("m")
		p := New(Options{Config: cfg, Upstream: u, Transport: handlerTransport{stall}, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}}), Registry: reg})
		start := time.Now()
		// Scheduled at 0, 1, …, 10 s. 0 and 1 are sent and stall until their
		// 9.5 s timeouts (9.5 s and 10.5 s); 2…9 find the cap of 2 reached:
		// not_sent. At 10 s one slot is free again: 10 is sent.
		// Stopped at 10.7 s: 10 is cancelled; the instant due at 11 s is
		// not_sent (shutdown).
		runFor(p, 10700*time.Millisecond)

		get := func(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
		if got := get(p.scheduled.WithLabelValues("p")); got != 12 {
			t.Fatalf("scheduled %v, want 12 (0…10 s and the shutdown instant)", got)
		}
		succ, failed, notSent := get(p.results.WithLabelValues("p", "success")), get(p.results.WithLabelValues("p", "failed")), get(p.results.WithLabelValues("p", "not_sent"))
		if succ != 0 || failed != 3 || notSent != 9 || succ+failed+notSent != 12 {
			t.Fatalf("results success=%v failed=%v not_sent=%v; want 0/3/9 adding up to 12", succ, failed, notSent)
		}
		if got := get(p.notSent.WithLabelValues("p", "concurrency_cap")); got != 8 {
			t.Fatalf("not_sent for the cap %v, want 8", got)
		}
		// Schedule lag: 3 probes sent, each exactly on time on the fake clock.
		var m dtoMetric
		if err := m.read(reg, "tokentap_probe_schedule_lag_seconds"); err != nil || m.count != 3 || m.sum != 0 {
			t.Fatalf("lag histogram count %d sum %v (%v), want 3 and 0", m.count, m.sum, err)
		}
		// Every scheduled instant left a record, on a 1 s grid from the start.
		recs.mu.Lock()
		defer recs.mu.Unlock()
		if len(recs.recs) != 12 {
			t.Fatalf("%d records, want 12", len(recs.recs))
		}
		outcomes := map[record.Outcome]int{}
		for _, r := range recs.recs {
			outcomes[r.Outcome]++
			off := r.Probe.Scheduled.Sub(start)
			if off%time.Second != 0 || off < 0 || off > 11*time.Second {
				t.Fatalf("record scheduled at %v: not on the 1 s grid", off)
			}
			if r.Traffic != "canary" || r.Probe.Name != "p" {
				t.Fatalf("record %+v", r)
			}
		}
		if outcomes[record.NotSent] != 9 || outcomes[record.Timeout] != 2 || outcomes[record.Cancelled] != 1 {
			t.Fatalf("outcomes %v, want 9 not_sent, 2 timeout, 1 cancelled", outcomes)
		}
	})
}

type dtoMetric struct {
	count uint64
	sum   float64
}

func (m *dtoMetric) read(reg *prometheus.Registry, name string) error {
	fams, err := reg.Gather()
	for _, f := range fams {
		if f.GetName() == name {
			for _, x := range f.Metric {
				m.count += x.GetHistogram().GetSampleCount()
				m.sum += x.GetHistogram().GetSampleSum()
			}
		}
	}
	return err
}

func compiled(e Expect) *checker {
	c := Config{Probes: []Def{{Name: "x", Expect: e}}}.WithDefaults("m")
	return newChecker(c.Probes[0].Expect)
}

func TestQualityChecks(t *testing.T) {
	schema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	cases := []struct {
		e      Expect
		text   string
		finish string
		n      int64
		fail   string
	}{
		{Expect{Contains: "Paris"}, "It is Paris.", "stop", 3, ""},
		{Expect{Contains: "Paris"}, "It is Lyon.", "stop", 3, CheckContains},
		{Expect{Regex: `^\d+$`}, "42", "stop", 1, ""},
		{Expect{Regex: `^\d+$`}, "forty-two", "stop", 1, CheckRegex},
		{Expect{Exact: "yes"}, "yes", "stop", 1, ""},
		{Expect{Exact: "yes"}, "yes.", "stop", 1, CheckExact},
		{Expect{JSONSchema: schema}, `{"city":"Paris"}`, "stop", 5, ""},
		{Expect{JSONSchema: schema}, `{"town":"Paris"}`, "stop", 5, CheckJSONSchema},
		{Expect{JSONSchema: schema}, `not json`, "stop", 2, CheckJSONSchema},
		{Expect{FinishReason: "length"}, "a b", "length", 2, ""},
		{Expect{FinishReason: "length"}, "a b", "stop", 2, CheckFinishReason},
		{Expect{OutputTokensMin: 2, OutputTokensMax: 4}, "", "stop", 3, ""},
		{Expect{OutputTokensMin: 2, OutputTokensMax: 4}, "", "stop", 5, CheckOutputTokens},
		{Expect{OutputTokensMin: 2, OutputTokensMax: 4}, "", "stop", 1, CheckOutputTokens},
	}
	for _, c := range cases {
		e := compiled(c.e)
		if got, why := e.check(c.text, c.finish, c.n); got != c.fail {
			t.Errorf("%+v on %q/%s/%d: failed %q (%s), want %q", c.e, c.text, c.finish, c.n, got, why, c.fail)
		}
	}
}

func TestAnswerText(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Par\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"is \\\"x\\\"\"}}]}\n\ndata: [DONE]\n\n"
	if got := stream.AnswerTextOf(stream.FormatOpenAI, []byte(sse), true); got != `Paris "x"` {
		t.Fatalf("streamed text %q", got)
	}
	if got := stream.AnswerTextOf(stream.FormatOpenAI, []byte(`{"choices":[{"message":{"content":"hi"}}]}`), false); got != "hi" {
		t.Fatalf("whole text %q", got)
	}
	if got := stream.AnswerTextOf(stream.FormatOpenAI, []byte(`{"choices":[{"text":" ok"}]}`), false); got != " ok" {
		t.Fatalf("completions text %q", got)
	}
}

// A fast wrong answer is a failed probe, in metrics and in records.
func TestFastWrongAnswerFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wrong := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Lyon\"},\"finish_reason\":\"stop\"}]}\n\n"+
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
		})
		reg := prometheus.NewRegistry()
		var recs sink
		u, _ := url.Parse("http://engine.invalid")
		cfg := Config{Probes: []Def{{Name: "capital", Interval: time.Second, Expect: Expect{Contains: "Paris"}}}}.WithDefaults("m")
		p := New(Options{Config: cfg, Upstream: u, Transport: handlerTransport{wrong}, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}}), Registry: reg})
		runFor(p, 2500*time.Millisecond) // probes at 0, 1, 2 s
		if got := testutil.ToFloat64(p.quality.WithLabelValues("capital", CheckContains)); got != 3 {
			t.Fatalf("quality failures %v, want 3", got)
		}
		if got := testutil.ToFloat64(p.success.WithLabelValues("capital")); got != 0 {
			t.Fatalf("probe_success %v, want 0", got)
		}
		recs.mu.Lock()
		defer recs.mu.Unlock()
		r := recs.recs[0]
		if r.Outcome != record.Success || r.Probe.Result != ResultFailed || r.Probe.Check != CheckContains || !strings.Contains(r.Probe.Failure, "Paris") {
			t.Fatalf("record outcome %s probe %+v; want a successful request whose probe failed the contains check", r.Outcome, r.Probe)
		}
		if p.Status().Probes[0].LastFailure == nil {
			t.Fatal("/probes keeps no failure")
		}
	})
}

// A probe speaks each API in its own shape, on its own route, and checks
// the answer through that format's adapter: every format's canary can
// succeed, and fail on a wrong answer.
func TestProbeOnEveryAPI(t *testing.T) {
	streams := map[string]struct{ path, ctype, body string }{
		"chat":        {"/v1/chat/completions", "text/event-stream", `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"},
		"completions": {"/v1/completions", "text/event-stream", `data: {"choices":[{"text":"Paris","finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"},
		"responses": {"/v1/responses", "text/event-stream",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Paris\"}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n"},
		"messages": {"/v1/messages", "text/event-stream",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		"ollama_chat": {"/api/chat", "application/x-ndjson", `{"model":"m","message":{"role":"assistant","content":"Paris"},"done":false}` + "\n" +
			`{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":1,"prompt_eval_count":3}` + "\n"},
		"ollama_generate": {"/api/generate", "application/x-ndjson", `{"model":"m","response":"Paris","done":false}` + "\n" +
			`{"model":"m","response":"","done":true,"done_reason":"stop","eval_count":1,"prompt_eval_count":3}` + "\n"},
		"tgi_generate":        {"/generate_stream", "text/event-stream", `data:{"index":1,"token":{"id":1,"text":"Paris","logprob":0,"special":false},"generated_text":"Paris","details":{"finish_reason":"eos_token","generated_tokens":1}}` + "\n\n"},
		"llamacpp_completion": {"/completion", "text/event-stream", `data: {"content":"Paris","stop":false}` + "\n\n" + `data: {"content":"","stop":true,"stop_type":"eos","tokens_predicted":1}` + "\n\n"},
	}
	for api, s := range streams {
		for _, answer := range []string{"Paris", "Lyon"} {
			synctest.Test(t, func(t *testing.T) {
				var gotPath string
				var gotBody map[string]any
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					gotPath = r.URL.Path
					json.NewDecoder(r.Body).Decode(&gotBody)
					w.Header().Set("Content-Type", s.ctype)
					io.WriteString(w, strings.ReplaceAll(s.body, "Paris", answer))
				})
				var recs sink
				u, _ := url.Parse("http://engine.invalid")
				cfg := Config{Probes: []Def{{Name: "p", API: api, Interval: time.Second, Expect: Expect{Contains: "Paris"}}}}.WithDefaults("m")
				p := New(Options{Config: cfg, Upstream: u, Transport: handlerTransport{h}, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}})})
				runFor(p, 500*time.Millisecond)
				recs.mu.Lock()
				defer recs.mu.Unlock()
				r := recs.recs[0]
				want := ResultSuccess
				if answer != "Paris" {
					want = ResultFailed
				}
				if gotPath != s.path || r.API != stream.Name(api) || r.Outcome != record.Success || r.Probe.Result != want {
					t.Fatalf("%s answering %s: path %s api %s outcome %s/%s probe %+v", api, answer, gotPath, r.API, r.Outcome, r.ErrorType, r.Probe)
				}
				if gotBody == nil {
					t.Fatalf("%s: the request body is not JSON", api)
				}
			})
		}
	}
}

// A probe with a url goes there, not to the upstream: a hosted API.
func TestProbeToAHostedAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var host, path, auth string
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, path, auth = r.Host, r.URL.Path, r.Header.Get("Authorization")
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		})
		var recs sink
		u, _ := url.Parse("http://engine.invalid")
		cfg := Config{Probes: []Def{{Name: "hosted", URL: "https://api.example.test/base", APIKeyEnv: "KEY", Interval: time.Second}}}.WithDefaults("m")
		p := New(Options{Config: cfg, Upstream: u, Transport: handlerTransport{h}, Getenv: func(string) string { return "sk-test" },
			Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}})})
		runFor(p, 500*time.Millisecond)
		recs.mu.Lock()
		defer recs.mu.Unlock()
		if host != "api.example.test" || path != "/base/v1/chat/completions" || auth != "Bearer sk-test" || recs.recs[0].Probe.Result != ResultSuccess {
			t.Fatalf("host %q path %q auth %q result %+v", host, path, auth, recs.recs[0].Probe)
		}
	})
	bad := Config{Probes: []Def{{Name: "x", URL: "https://user:pw@api.example.test"}}}.Validate()
	if len(bad) != 1 || strings.Contains(bad[0].Error(), "pw") {
		t.Fatalf("a URL with credentials: %v", bad)
	}
}

// runFor runs the prober for d (of the bubble's fake time, under
// synctest), then stops it and waits until Run returns.
func runFor(p *Prober, d time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	time.Sleep(d)
	cancel()
	<-done
}
