package probe

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// keyedEndpoints are scripted endpoints of the APIs whose key header is
// their own: each refuses (401) a request that lacks its key in that
// header, or carries it as a bearer token too, as the real APIs do
// (Anthropic's also requires anthropic-version).
var keyedEndpoints = []struct {
	api, header, value string
	also               [2]string // another header the API requires
	ctype, body        string
}{
	{stream.NameMessages, "x-api-key", "sk-ant-test", [2]string{"anthropic-version", "2023-06-01"}, "text/event-stream",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	{stream.NameGemini, "x-goog-api-key", "AIza-test", [2]string{}, "text/event-stream",
		`data: {"candidates":[{"content":{"parts":[{"text":"Paris"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4}}` + "\n\n"},
	{stream.NameChat, "Authorization", "Bearer sk-test", [2]string{}, "text/event-stream",
		`data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"},
}

// keyedServer is an httptest server of one keyed endpoint; got receives
// the value of its key header on every request.
func keyedServer(t *testing.T, e int, got chan<- string) *httptest.Server {
	ep := keyedEndpoints[e]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get(ep.header)
		got <- v
		if v != ep.value || (ep.header != "Authorization" && r.Header.Get("Authorization") != "") ||
			(ep.also[0] != "" && r.Header.Get(ep.also[0]) != ep.also[1]) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"type":"authentication_error","message":"invalid key"}}`)
			return
		}
		w.Header().Set("Content-Type", ep.ctype)
		io.WriteString(w, ep.body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The canary sends its key in each API's own key header (stream.API's
// SendKey): an Anthropic-style and a Gemini-style endpoint that require
// x-api-key and x-goog-api-key accept it, as a bearer one does its
// bearer token; without the key each refuses it, and the probe fails.
func TestProbeSendsEachAPIsKeyHeader(t *testing.T) {
	for e, ep := range keyedEndpoints {
		for _, withKey := range []bool{true, false} {
			got := make(chan string, 4)
			srv := keyedServer(t, e, got)
			u, _ := url.Parse(srv.URL)
			def := Def{Name: "keyed", API: ep.api, Interval: time.Second, Expect: Expect{Contains: "Paris"}}
			if withKey {
				def.APIKeyEnv = "KEY"
			}
			key := ep.value
			if ep.header == "Authorization" {
				key = key[len("Bearer "):]
			}
			var recs sink
			p := New(Options{Config: Config{Probes: []Def{def}}.WithDefaults("m"), Upstream: u,
				Getenv:   func(name string) string { return map[string]string{"KEY": key}[name] },
				Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}})})
			p.run(context.Background(), p.defs[0], time.Now())
			sent := <-got
			recs.mu.Lock()
			if len(recs.recs) != 1 {
				t.Fatalf("%s: %d records", ep.api, len(recs.recs))
			}
			r := recs.recs[0]
			recs.mu.Unlock()
			ok := r.Outcome == record.Success && r.Probe.Result == ResultSuccess && r.OutputTokens == 1
			if withKey && (sent != ep.value || !ok) {
				t.Errorf("%s: sent %s %q; outcome %s/%s status %d probe %+v", ep.api, ep.header, sent, r.Outcome, r.ErrorType, r.HTTPStatus, r.Probe)
			}
			if !withKey && (sent != "" || ok || r.HTTPStatus != http.StatusUnauthorized) {
				t.Errorf("%s without a key: sent %q, status %d, probe %+v", ep.api, sent, r.HTTPStatus, r.Probe)
			}
		}
	}
}

// ignore_eos is each API's own member (stream.Request.IgnoreEOS), and a
// probe asking it of an API that has none is refused by name.
func TestProbeIgnoreEOSByAPI(t *testing.T) {
	for api, member := range map[string]string{stream.NameChat: "ignore_eos", stream.NameCompletions: "ignore_eos", stream.NameLlamaCppCompletion: "ignore_eos"} {
		cfg := Config{Probes: []Def{{Name: "x", API: api, IgnoreEOS: true}}}.WithDefaults("m")
		if errs := cfg.Validate(); len(errs) != 0 {
			t.Fatalf("%s: %v", api, errs)
		}
		if _, body := request(&cfg.Probes[0]); !strings.Contains(string(body), `"`+member+`":true`) {
			t.Errorf("%s: body %s", api, body)
		}
	}
	for _, api := range []string{stream.NameMessages, stream.NameGemini, stream.NameResponses, stream.NameOllamaChat, stream.NameTGIGenerate} {
		cfg := Config{Probes: []Def{{Name: "x", API: api, IgnoreEOS: true}}}.WithDefaults("m")
		if errs := cfg.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "ignore_eos") || !strings.Contains(errs[0].Error(), api) {
			t.Errorf("%s with ignore_eos: %v", api, errs)
		}
		cfg.Probes[0].IgnoreEOS = false
		if _, body := request(&cfg.Probes[0]); strings.Contains(string(body), "ignore_eos") {
			t.Errorf("%s: body %s", api, body)
		}
	}
}
