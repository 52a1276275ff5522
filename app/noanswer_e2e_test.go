package app

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// noAnswerUpstream answers each request with the status its model names
// ("chat.s.307": API, streamed or not, status): a redirect to elsewhere
// (Location), with, where the status allows a body, a whole answer in the
// request's own format that must not be taken for one. The model "ok"
// gets a real streamed answer; a status of 200 gets an empty body.
type noAnswerUpstream struct{ elsewhere string }

func (u noAnswerUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		io.WriteString(w, "ok") // the health and model polls
		return
	}
	var req struct{ Model string }
	json.NewDecoder(r.Body).Decode(&req)
	if req.Model == "ok" {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"+
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		return
	}
	parts := strings.Split(req.Model, ".")
	if len(parts) != 3 {
		http.NotFound(w, r)
		return
	}
	if parts[2] == "json" { // a JSON body that names no answer
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
		return
	}
	if parts[2] == "html" { // a gateway's login page
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, "<!doctype html><html><body><form action=/login>Sign in</form></body></html>")
		return
	}
	status, _ := strconv.Atoi(parts[2])
	if status == http.StatusOK {
		w.Header().Set("Content-Type", map[string]string{"s": "text/event-stream", "n": "application/json"}[parts[1]])
		w.WriteHeader(status) // and no byte of body
		return
	}
	w.Header().Set("Location", u.elsewhere+"/v1/chat/completions")
	body := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	ct := "application/json"
	switch {
	case parts[0] == "chat" && parts[1] == "s":
		ct, body = "text/event-stream", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	case parts[0] == "messages" && parts[1] == "s":
		ct, body = "text/event-stream", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	case parts[0] == "messages":
		body = `{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	io.WriteString(w, body) // refused by net/http for 204 and 304, which carry none
}

// A status that carries no answer is its own outcome, never a success
// and never qualified (issue 40, item 2): every 3xx (301, 302, 303, 304,
// 307, 308), a 2xx that is not an answer (202, 204, 205, 206) and a 200
// with an empty body, to a streamed and a non-streamed request of Chat
// Completions and of Messages, even when the body is a whole answer in
// the request's own format; a 200 with a web page (a gateway's login
// page, html_body); and a 200 whose JSON names no answer (`{}`,
// empty_answer). The client gets the status and Location as
// the engine sent them; the redirect is followed by no one (the target
// counts its requests); the records, the counters and /slo say it.
func TestNoAnswerStatuses(t *testing.T) {
	var elsewhere atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer target.Close()
	us := httptest.NewServer(noAnswerUpstream{elsewhere: target.URL})
	defer us.Close()
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte(`
slo:
  objectives:
    - name: all
      target: 0.9
      window: 1h
      thresholds: {e2e: 1m}
`), 0o644)
	a, records := startSidecar(t, us.URL, "--config", cfg, "--demo", "off")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	type want struct {
		status    int
		errorType string
		tokens    *int // output_tokens; nil is null
	}
	zero := 0
	wants := map[string]want{}
	for _, api := range []string{"chat", "messages"} {
		for _, mode := range []string{"s", "n"} {
			for _, status := range []int{301, 302, 303, 304, 307, 308, 202, 204, 205, 206, 200} {
				w := want{status: status, errorType: "http_3xx"}
				switch {
				case status == 200:
					w.errorType = "empty_body"
					if mode == "s" {
						w.tokens = &zero // an empty stream: no event, none of its tokens
					}
				case status < 300:
					w.errorType = "http_no_answer"
				}
				wants[fmt.Sprintf("%s.%s.%d", api, mode, status)] = w
			}
			wants[api+"."+mode+".html"] = want{status: 200, errorType: "html_body"}
			wants[api+"."+mode+".json"] = want{status: 200, errorType: "empty_answer"}
		}
	}
	send := func(m string) {
		path, body := "/v1/chat/completions", `{"model":"`+m+`","stream":%s,"messages":[{"role":"user","content":"hi"}]}`
		if strings.HasPrefix(m, "messages.") {
			path, body = "/v1/messages", `{"model":"`+m+`","max_tokens":4,"stream":%s,"messages":[{"role":"user","content":"hi"}]}`
		}
		body = fmt.Sprintf(body, strconv.FormatBool(!strings.Contains(m, ".n.")))
		resp, err := client.Post("http://"+a.Proxy+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if w, ok := wants[m]; ok {
			loc := resp.Header.Get("Location")
			if resp.StatusCode != w.status || (w.status >= 300 && loc != target.URL+"/v1/chat/completions") {
				t.Errorf("%s: the client got %d, Location %q; want the engine's %d and its Location", m, resp.StatusCode, loc, w.status)
			}
		}
	}
	send("ok")
	for m := range wants {
		send(m)
	}
	recs := readRecords(t, records, len(wants)+1)
	if r := recs["ok"]; r.Outcome != "success" {
		t.Fatalf("the control request: %+v", r)
	}
	for m, w := range wants {
		r := recs[m]
		tokensOK := (r.OutputTokens == nil) == (w.tokens == nil) && (w.tokens == nil || *r.OutputTokens == *w.tokens)
		if r.Outcome != "no_answer" || r.ErrorType != w.errorType || r.HTTPStatus != w.status || r.TTFT != nil || r.TPOT != nil ||
			len(r.TokenMS) != 0 || !tokensOK || r.E2E == nil {
			t.Errorf("%s: record outcome %q error_type %q status %d ttft %s tpot %s tokens %s events %d e2e %s; want no_answer, %s, %d, no token, output_tokens %s",
				m, r.Outcome, r.ErrorType, r.HTTPStatus, show(r.TTFT), show(r.TPOT), show(r.OutputTokens), len(r.TokenMS), show(r.E2E), w.errorType, w.status, show(w.tokens))
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect target was asked %d times; a redirect is never followed", n)
	}

	// The counters: every request by outcome, the no-answers by error
	// type, and the SLO's offered, qualified and failures.
	resp, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	sum := func(name string, labels ...string) float64 {
		var s float64
		f := fams[name]
		if f == nil {
			return math.NaN()
		}
	metric:
		for _, m := range f.Metric {
			for i := 0; i < len(labels); i += 2 {
				if !labelIs(m, labels[i], labels[i+1]) {
					continue metric
				}
			}
			s += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
		return s
	}
	byType := map[string]float64{}
	for _, w := range wants {
		byType[w.errorType]++
	}
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"tokentap_requests_total{outcome=no_answer}", sum("tokentap_requests_total", "outcome", "no_answer", "traffic", "live"), float64(len(wants))},
		{"tokentap_requests_total{outcome=success}", sum("tokentap_requests_total", "outcome", "success", "traffic", "live"), 1},
		{"duration count{error_type=http_3xx}", sum("gen_ai_server_request_duration_seconds", "error_type", "http_3xx"), byType["http_3xx"]},
		{"duration count{error_type=http_no_answer}", sum("gen_ai_server_request_duration_seconds", "error_type", "http_no_answer"), byType["http_no_answer"]},
		{"duration count{error_type=empty_body}", sum("gen_ai_server_request_duration_seconds", "error_type", "empty_body"), byType["empty_body"]},
		{"duration count{error_type=html_body}", sum("gen_ai_server_request_duration_seconds", "error_type", "html_body"), byType["html_body"]},
		{"duration count{error_type=empty_answer}", sum("gen_ai_server_request_duration_seconds", "error_type", "empty_answer"), byType["empty_answer"]},
		{"TTFT count", sum("gen_ai_server_time_to_first_token_seconds"), 1},
		{"tokentap_slo_requests_total", sum("tokentap_slo_requests_total", "slo", "all"), float64(len(wants) + 1)},
		{"tokentap_slo_qualified_requests_total", sum("tokentap_slo_qualified_requests_total", "slo", "all"), 1},
		{"tokentap_slo_failures_total{threshold=no_answer}", sum("tokentap_slo_failures_total", "slo", "all", "threshold", "no_answer"), float64(len(wants))},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}

	// /slo: one qualified of all offered, and no_answer the top failure.
	page := sloPage(t, a.Admin)
	if len(page.SLOs) != 1 {
		t.Fatalf("/slo: %+v", page)
	}
	s := page.SLOs[0]
	wantAtt := 1 / float64(len(wants)+1)
	if s.Offered != int64(len(wants)+1) || s.Qualified != 1 || s.Attainment == nil || math.Abs(*s.Attainment-wantAtt) > 1e-9 ||
		len(s.TopFailures) == 0 || s.TopFailures[0].Reason != "no_answer" || s.TopFailures[0].Count != int64(len(wants)) {
		t.Errorf("/slo: offered %d qualified %d attainment %v top failures %+v; want %d, 1, %.4f, no_answer %d",
			s.Offered, s.Qualified, s.Attainment, s.TopFailures, len(wants)+1, wantAtt, len(wants))
	}
}

// show is a record's nullable number as its JSON says it.
func show[T any](p *T) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}
