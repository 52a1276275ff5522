package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// tol is the slack of the one bound here that the test cannot measure:
// a cancelled request's end, which the sidecar notes around the instant
// it cancels the upstream's request (the upstream sees that later). Every
// other instant is bounded by what this run measured: the upstream's
// write before, the client's read after.
const tol = 30 * time.Millisecond

// step is one scripted write: wait until `at` after the request reached
// the upstream, then write payload (SSE data) and flush.
type step struct {
	at      time.Duration
	payload string
}

type script struct {
	status  int
	steps   []step
	usage   string // usage chunk payload, sent when include_usage is asked
	reset   bool   // abort the connection after the steps
	endless bool   // keep sending every 50 ms until the client goes away
}

const chunkHead = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,`

func content(s string, ids string, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return chunkHead + `"delta":{"content":"` + s + `"},"token_ids":[` + ids + `],"finish_reason":` + fr + `}]}`
}

var scripts = map[string]script{
	// A role chunk, then a reasoning event of 1 token, then two content
	// events carrying 2 and 3 tokens (multi-token events).
	"multi": {status: 200, steps: []step{
		{40 * time.Millisecond, chunkHead + `"delta":{"role":"assistant","content":""},"finish_reason":null}]}`},
		{100 * time.Millisecond, chunkHead + `"delta":{"reasoning_content":"hmm"},"token_ids":[1],"finish_reason":null}]}`},
		{170 * time.Millisecond, content("Hel", "2,3", "")},
		{240 * time.Millisecond, content("lo!", "4,5,6", "stop")},
		{240 * time.Millisecond, "[DONE]"},
	}, usage: `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":11,"total_tokens":17,"completion_tokens":6}}`},
	"one": {status: 200, steps: []step{
		{80 * time.Millisecond, content("Yes", "7", "stop")},
		{80 * time.Millisecond, "[DONE]"},
	}, usage: `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}`},
	"error": {status: 200, steps: []step{
		{60 * time.Millisecond, content("a", "1", "")},
		{120 * time.Millisecond, `{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}`},
		{120 * time.Millisecond, "[DONE]"},
	}},
	"reset": {status: 200, steps: []step{
		{60 * time.Millisecond, content("a", "1", "")},
		{130 * time.Millisecond, content("b", "2", "")},
	}, reset: true},
	"disconnect": {status: 200, endless: true},
	"reject":     {status: 429},
}

// scriptedUpstream serves the scripts and notes when each event left it.
type scriptedUpstream struct {
	mu        sync.Mutex
	written   map[string][]time.Duration // per model: offset of each write after arrival
	cancelled map[string]time.Duration   // per model: when its request context ended
}

func (u *scriptedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	if r.Method != http.MethodPost { // the sidecar reads /v1/models: this engine has none
		http.NotFound(w, r)
		return
	}
	t0 := time.Now()
	var req struct {
		Model         string `json:"model"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req)
	sc := scripts[req.Model]
	if sc.status != 200 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(sc.status)
		io.WriteString(w, `{"error":{"message":"queue full","type":"overloaded","code":429}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	note := func() {
		u.mu.Lock()
		u.written[req.Model] = append(u.written[req.Model], time.Since(t0))
		u.mu.Unlock()
	}
	// The instant is noted just before the write: the sidecar cannot read
	// the bytes earlier, so it is a sound lower bound of the read instant
	// (noting after the flush is not, on a loaded machine).
	send := func(p string) {
		note()
		io.WriteString(w, "data: "+p+"\n\n")
		w.(http.Flusher).Flush()
	}
	if sc.endless {
		for i := 0; ; i++ {
			select {
			case <-r.Context().Done():
				u.mu.Lock()
				u.cancelled[req.Model] = time.Since(t0)
				u.mu.Unlock()
				return
			case <-time.After(50 * time.Millisecond):
				send(content(fmt.Sprint("w", i), "1", ""))
			}
		}
	}
	for _, s := range sc.steps {
		time.Sleep(time.Until(t0.Add(s.at)))
		if s.payload == "[DONE]" && req.StreamOptions.IncludeUsage && sc.usage != "" {
			io.WriteString(w, "data: "+sc.usage+"\n\n")
		}
		send(s.payload)
	}
	if sc.reset {
		time.Sleep(20 * time.Millisecond)
		panic(http.ErrAbortHandler) // the connection is cut mid-body
	}
}

type rec struct {
	ID           string    `json:"id"`
	Model        string    `json:"model"`
	Outcome      string    `json:"outcome"`
	HTTPStatus   int       `json:"http_status"`
	ErrorType    string    `json:"error_type"`
	ErrorCode    int       `json:"error_code"`
	FinishReason string    `json:"finish_reason"`
	InputTokens  *int      `json:"input_tokens"`
	OutputTokens *int      `json:"output_tokens"`
	TokenSource  string    `json:"token_source"`
	TTFT         *float64  `json:"ttft_ms"`
	TTFOT        *float64  `json:"ttfot_ms"`
	TTFB         *float64  `json:"ttfb_ms"`
	TokenMS      []float64 `json:"token_ms"`
	PerEvent     []int     `json:"tokens_per_event"`
	TerminalMS   *float64  `json:"terminal_ms"`
	TPOT         *float64  `json:"tpot_ms"`
	E2E          *float64  `json:"e2e_ms"`
	MaxITL       *float64  `json:"max_itl_ms"`
	Injected     bool      `json:"usage_injected"`
}

// startSidecar runs app.Run in front of upstream and returns its addresses.
func startSidecar(t *testing.T, upstreamURL string, extra ...string) (Addrs, string) {
	t.Helper()
	return startSidecarEnv(t, upstreamURL, nil, extra...)
}

// startSidecarEnv is startSidecar with a hook to adjust the Env.
func startSidecarEnv(t *testing.T, upstreamURL string, adjust func(*Env), extra ...string) (Addrs, string) {
	t.Helper()
	dir := t.TempDir()
	records := filepath.Join(dir, "records.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Addrs, 1)
	done := make(chan error, 1)
	args := append([]string{"--upstream", upstreamURL, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--records", records, "--shutdown-grace", "2s"}, extra...)
	env := Env{Getenv: func(string) string { return "" }, Stdout: io.Discard, Stderr: testWriter{t}, Ready: func(a Addrs) { ready <- a }}
	if adjust != nil {
		adjust(&env)
	}
	go func() { done <- Run(ctx, args, env) }()
	var a Addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("sidecar did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("sidecar did not start in 10 s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar exited with %v", err)
		}
	})
	return a, records
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func post(t *testing.T, addr, model string, includeUsage bool) (*http.Response, error) {
	so := ""
	if includeUsage {
		so = `,"stream_options":{"include_usage":true}`
	}
	body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]` + so + `}`
	return http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
}

func readRecords(t *testing.T, path string, want int) map[string]rec {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(b) > 0 && len(lines) >= want {
			out := map[string]rec{}
			for _, l := range lines {
				var r rec
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatalf("record %q: %v", l, err)
				}
				out[r.Model] = r
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d records, have %d:\n%s", want, len(lines), b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func within(t *testing.T, what string, got float64, lo, hi time.Duration) {
	t.Helper()
	l, h := float64(lo)/1e6, float64(hi)/1e6
	if got < l || got > h {
		t.Errorf("%s = %.3f ms, want within [%.3f, %.3f] ms", what, got, l, h)
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// clientTimes are the instants, after the client began to send, at which
// it read each SSE data line of an answer and the answer's end.
type clientTimes struct {
	events []time.Duration
	end    time.Duration
}

// readTimed reads an SSE body to its end, noting when each data line came.
func readTimed(body io.Reader, sent time.Time) ([]byte, clientTimes) {
	var all []byte
	var ct clientTimes
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		all = append(all, line...)
		if strings.HasPrefix(line, "data:") {
			ct.events = append(ct.events, time.Since(sent))
		}
		if err != nil {
			ct.end = time.Since(sent)
			return all, ct
		}
	}
}

func TestEndToEndScriptedUpstream(t *testing.T) {
	up := &scriptedUpstream{written: map[string][]time.Duration{}, cancelled: map[string]time.Duration{}}
	us := httptest.NewServer(up)
	defer us.Close()
	a, recordsPath := startSidecar(t, us.URL)

	// Each request in turn; the client reads every stream to its end,
	// noting when it saw each event: the sidecar read it no later.
	seen := map[string]clientTimes{}
	for _, m := range []string{"multi", "one", "error", "reset", "reject"} {
		sent := time.Now()
		resp, err := post(t, a.Proxy, m, false)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		var got []byte
		got, seen[m] = readTimed(resp.Body, sent)
		resp.Body.Close()
		if m == "multi" && strings.Contains(string(got), `"usage"`) {
			t.Errorf("multi: the client did not ask for usage but received it:\n%s", got)
		}
		if m == "reject" && resp.StatusCode != 429 {
			t.Errorf("reject: status %d, want 429 passed through", resp.StatusCode)
		}
	}
	// A client that reads three events and goes away.
	{
		resp, err := post(t, a.Proxy, "disconnect", false)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for n := 0; n < 3; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "data:") {
				n++
			}
		}
		resp.Body.Close()
	}

	recs := readRecords(t, recordsPath, 6)
	up.mu.Lock()
	defer up.mu.Unlock()

	// multi: TTFT is the reasoning event (the role chunk is not a token);
	// TTFOT the first content event; gaps are between token events; the
	// output count comes from the usage the sidecar asked for.
	r := recs["multi"]
	w := up.written["multi"] // role, reasoning, content, content(+done)
	if r.Outcome != "success" || r.FinishReason != "stop" || r.TokenSource != "usage" || !r.Injected {
		t.Errorf("multi: %+v", r)
	}
	if r.OutputTokens == nil || *r.OutputTokens != 6 || r.InputTokens == nil || *r.InputTokens != 11 {
		t.Errorf("multi: tokens in/out = %v/%v, want 11/6 from usage", r.InputTokens, r.OutputTokens)
	}
	if fmt.Sprint(r.PerEvent) != "[1 2 3]" || len(r.TokenMS) != 3 {
		t.Errorf("multi: tokens_per_event %v token_ms %v, want [1 2 3] over 3 events", r.PerEvent, r.TokenMS)
	}
	// Each instant lies between the upstream's write (w, from the
	// upstream's own arrival, later than the sidecar's) and the client's
	// read of the same event (c, from before the client sent): bounds
	// measured in this run, whatever the machine's load.
	c := seen["multi"].events // role, reasoning, content, content, [DONE]
	if len(c) < 4 || len(w) < 4 {
		t.Fatalf("multi: the client saw %d events, the upstream wrote %d; want 4 or more", len(c), len(w))
	}
	within(t, "multi ttft", *r.TTFT, w[1], c[1])
	within(t, "multi ttfot", *r.TTFOT, w[2], c[2])
	for i := 1; i < len(r.TokenMS); i++ {
		within(t, fmt.Sprint("multi gap ", i), r.TokenMS[i]-r.TokenMS[i-1], w[i+1]-c[i], c[i+1]-w[i])
	}
	// TPOT = (last - first) / (n - 1) with n = 6 tokens, not 3 events.
	wantTPOT := (r.TokenMS[2] - r.TokenMS[0]) / 5
	if r.TPOT == nil || math.Abs(*r.TPOT-wantTPOT) > 0.002 {
		t.Errorf("multi: tpot %v, want (last-first)/5 = %.3f", r.TPOT, wantTPOT)
	}
	within(t, "multi tpot", *r.TPOT, (w[3]-c[1])/5, (c[3]-w[1])/5)
	if math.Abs(*r.MaxITL-math.Max(r.TokenMS[1]-r.TokenMS[0], r.TokenMS[2]-r.TokenMS[1])) > 0.002 {
		t.Errorf("multi: max_itl %v does not match token_ms %v", *r.MaxITL, r.TokenMS)
	}
	// E2E ends at [DONE], which arrives with the last token here.
	within(t, "multi e2e", *r.E2E, w[3], seen["multi"].end)

	r = recs["one"]
	if r.Outcome != "success" || r.TPOT != nil || r.OutputTokens == nil || *r.OutputTokens != 1 {
		t.Errorf("one: outcome %s tpot %v output %v; want success, tpot null, 1 token", r.Outcome, r.TPOT, r.OutputTokens)
	}
	if len(seen["one"].events) == 0 {
		t.Fatal("one: the client saw no event")
	}
	within(t, "one ttft", *r.TTFT, up.written["one"][0], seen["one"].events[0])

	r = recs["error"]
	if r.Outcome != "error" || r.ErrorType != "stream_error" || r.ErrorCode != 500 || r.HTTPStatus != 200 {
		t.Errorf("error: %+v; want error/stream_error/500 after HTTP 200", r)
	}
	if len(seen["error"].events) < 2 {
		t.Fatalf("error: the client saw %d events, want 2 or more", len(seen["error"].events))
	}
	within(t, "error e2e (terminal = the error event)", *r.E2E, up.written["error"][1], seen["error"].events[1])

	r = recs["reset"]
	if r.Outcome != "error" || r.ErrorType != "upstream_reset" || len(r.TokenMS) != 2 {
		t.Errorf("reset: %+v; want error/upstream_reset with 2 token events", r)
	}

	r = recs["reject"]
	if r.Outcome != "rejected" || r.HTTPStatus != 429 || r.TTFT != nil {
		t.Errorf("reject: %+v; want rejected/429 and no TTFT", r)
	}

	r = recs["disconnect"]
	if r.Outcome != "cancelled" {
		t.Errorf("disconnect: outcome %q, want cancelled", r.Outcome)
	}
	if _, ok := up.cancelled["disconnect"]; !ok {
		t.Errorf("disconnect: the client's cancel did not reach the upstream")
	}
	if r.E2E == nil || *r.E2E > ms(up.cancelled["disconnect"]+tol+50*time.Millisecond) {
		t.Errorf("disconnect: e2e %v ms, want it to end when the client left (upstream saw it at %v)", r.E2E, up.cancelled["disconnect"])
	}

	checkMetrics(t, a.Admin, recs)
}

// checkMetrics scrapes /metrics and checks each series against the records.
func checkMetrics(t *testing.T, admin string, recs map[string]rec) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	type agg struct {
		count uint64
		sum   float64
	}
	hist := func(name string) agg {
		var a agg
		f := fams[name]
		if f == nil {
			return a
		}
		for _, m := range f.Metric {
			a.count += m.GetHistogram().GetSampleCount()
			a.sum += m.GetHistogram().GetSampleSum()
		}
		return a
	}
	counter := func(name, label, value string) float64 {
		var v float64
		for _, m := range fams[name].GetMetric() {
			if label == "" || labelIs(m, label, value) {
				v += m.GetCounter().GetValue()
			}
		}
		return v
	}
	var want struct {
		ttft, tpot, itl, e2e agg
		out                  float64
	}
	outcomes := map[string]float64{}
	for _, r := range recs {
		outcomes[r.Outcome]++
		if r.TTFT != nil {
			want.ttft.count++
			want.ttft.sum += *r.TTFT / 1e3
		}
		if r.TPOT != nil {
			want.tpot.count++
			want.tpot.sum += *r.TPOT / 1e3
		}
		for i := 1; i < len(r.TokenMS); i++ {
			want.itl.count++
			want.itl.sum += (r.TokenMS[i] - r.TokenMS[i-1]) / 1e3
		}
		want.e2e.count++
		want.e2e.sum += *r.E2E / 1e3
		if r.OutputTokens != nil && *r.OutputTokens > 0 {
			want.out += float64(*r.OutputTokens)
		}
	}
	// Records carry µs-rounded milliseconds; allow 1 µs per observation.
	for _, c := range []struct {
		name string
		got  agg
		want agg
	}{
		{"gen_ai_server_time_to_first_token_seconds", hist("gen_ai_server_time_to_first_token_seconds"), want.ttft},
		{"gen_ai_server_time_per_output_token_seconds", hist("gen_ai_server_time_per_output_token_seconds"), want.tpot},
		{"tokentap_inter_token_latency_seconds", hist("tokentap_inter_token_latency_seconds"), want.itl},
		{"gen_ai_server_request_duration_seconds", hist("gen_ai_server_request_duration_seconds"), want.e2e},
	} {
		if c.got.count != c.want.count || math.Abs(c.got.sum-c.want.sum) > 2e-6*float64(c.want.count+1) {
			t.Errorf("%s: count %d sum %.6f; records say count %d sum %.6f", c.name, c.got.count, c.got.sum, c.want.count, c.want.sum)
		}
	}
	for o, n := range outcomes {
		if got := counter("tokentap_requests_total", "outcome", o); got != n {
			t.Errorf("tokentap_requests_total{outcome=%q} = %v, want %v", o, got, n)
		}
	}
	if got := counter("gen_ai_client_inference_usage_output_tokens_total", "", ""); got != want.out {
		t.Errorf("output tokens counter %v, records sum %v", got, want.out)
	}
	for _, m := range fams["tokentap_requests_in_flight"].GetMetric() {
		if m.GetGauge().GetValue() != 0 {
			t.Errorf("in-flight gauge %v after every request ended", m.GetGauge().GetValue())
		}
	}
	if hist("tokentap_forward_delay_seconds").count == 0 {
		t.Errorf("no forwarding delay observed")
	}
	// Buckets resolve single milliseconds at the low end.
	f := fams["gen_ai_server_time_to_first_token_seconds"]
	if f == nil || len(f.Metric[0].GetHistogram().GetBucket()) < 40 || f.Metric[0].GetHistogram().GetBucket()[1].GetUpperBound() != 0.002 {
		t.Errorf("TTFT buckets are not millisecond-fine")
	}
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}
