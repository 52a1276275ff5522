package proxy

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Which statuses are answers (docs/measurement.md §3): on a generation
// route only 200, 201 and 203; every 3xx on any route; any 2xx on a route
// the tap does not parse; error statuses are left to the error rules.
func TestNoAnswerStatusTable(t *testing.T) {
	for _, c := range []struct {
		status int
		api    stream.Name
		want   string
	}{
		{200, stream.NameChat, ""}, {201, stream.NameMessages, ""}, {203, stream.NameChat, ""},
		{202, stream.NameChat, record.ErrNoAnswerStatus}, {204, stream.NameMessages, record.ErrNoAnswerStatus},
		{205, stream.NameChat, record.ErrNoAnswerStatus}, {206, stream.NameChat, record.ErrNoAnswerStatus},
		{207, stream.NameResponses, record.ErrNoAnswerStatus}, {299, stream.NameChat, record.ErrNoAnswerStatus},
		{300, stream.NameChat, record.ErrHTTP3xx}, {301, stream.NameChat, record.ErrHTTP3xx}, {304, stream.NameMessages, record.ErrHTTP3xx},
		{307, stream.NameOther, record.ErrHTTP3xx}, {308, stream.NameOther, record.ErrHTTP3xx}, {399, stream.NameChat, record.ErrHTTP3xx},
		{204, stream.NameOther, ""}, {202, stream.NameOther, ""},
		{400, stream.NameChat, ""}, {429, stream.NameChat, ""}, {503, stream.NameOther, ""},
	} {
		if got := noAnswer(c.status, c.api); got != c.want {
			t.Errorf("noAnswer(%d, %s) = %q, want %q", c.status, c.api, got, c.want)
		}
	}
}

// On a route the tap does not parse, a redirect is still no answer, and
// a 204 (to a DELETE, say) is one; the client gets both as sent.
func TestNoAnswerOnOtherRoutes(t *testing.T) {
	for _, c := range []struct {
		method, path string
		status       int
		outcome      record.Outcome
		errorType    string
	}{
		{http.MethodGet, "/v1/models", http.StatusFound, record.NoAnswer, record.ErrHTTP3xx},
		{http.MethodGet, "/v1/models", http.StatusNotModified, record.NoAnswer, record.ErrHTTP3xx},
		{http.MethodDelete, "/v1/files/f", http.StatusNoContent, record.Success, ""},
		{http.MethodGet, "/v1/models", http.StatusOK, record.Success, ""}, // an empty 200 on another route answers it
	} {
		fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.status/100 == 3 {
				w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
			}
			w.WriteHeader(c.status)
		}), Options{})
		req, _ := http.NewRequest(c.method, fs.URL+c.path, strings.NewReader(""))
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r := only(t, sink)
		if resp.StatusCode != c.status || r.HTTPStatus != c.status || r.Outcome != c.outcome || r.ErrorType != c.errorType || r.API != stream.NameOther {
			t.Errorf("%s %s answered %d: client %d, record %d %s/%s api %s; want %s/%s", c.method, c.path, c.status,
				resp.StatusCode, r.HTTPStatus, r.Outcome, r.ErrorType, r.API, c.outcome, c.errorType)
		}
	}
}

// A 1xx never ends a request (docs/measurement.md §3): an interim 103
// before a redirect is passed on to the client, and the request is the
// final status's, no_answer; a 100 before a stream is a success; a 101
// the client did not ask for is refused, a 502, error/upstream_reset.
func TestInterimStatuses(t *testing.T) {
	for _, c := range []struct {
		name      string
		h         http.HandlerFunc
		status    int // the final status the client and the record see
		outcome   record.Outcome
		errorType string
	}{
		{"103 then 307", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
			w.WriteHeader(http.StatusTemporaryRedirect)
		}, http.StatusTemporaryRedirect, record.NoAnswer, record.ErrHTTP3xx},
		{"100 then a stream", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusContinue)
			sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n", "data: [DONE]\n\n")(w, r)
		}, http.StatusOK, record.Success, ""},
		{"101 not asked for", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
			buf.Flush()
		}, http.StatusBadGateway, record.Error, record.ErrUpstreamReset},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs, sink := front(t, c.h, Options{})
			var interim []int
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			req, _ := http.NewRequest(http.MethodPost, fs.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { interim = append(interim, code); return nil }}))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			r := only(t, sink)
			if resp.StatusCode != c.status || r.HTTPStatus != c.status || r.Outcome != c.outcome || r.ErrorType != c.errorType {
				t.Errorf("client %d, record %d %s/%s; want %d %s/%s", resp.StatusCode, r.HTTPStatus, r.Outcome, r.ErrorType, c.status, c.outcome, c.errorType)
			}
			if c.name == "103 then 307" && (len(interim) != 1 || interim[0] != http.StatusEarlyHints) {
				t.Errorf("the client saw interim statuses %v, want [103]", interim)
			}
		})
	}
}

// A web page in answer to a generation request is no answer
// (docs/measurement.md §3, html_body): a gateway's login page, a web
// server's page at a wrong address. It was a success. The client gets the
// page as sent; an empty page is empty_body; on a route the tap does not
// parse, a page answers it.
func TestWebPageIsNoAnswer(t *testing.T) {
	const page = "<!doctype html><html><body><form action=/login>Sign in</form></body></html>"
	for _, c := range []struct {
		name, path, ct, body string
		status               int
		outcome              record.Outcome
		errorType            string
	}{
		{"chat", "/v1/chat/completions", "text/html; charset=utf-8", page, 200, record.NoAnswer, record.ErrHTMLBody},
		{"messages, 203", "/v1/messages", "text/html", page, 203, record.NoAnswer, record.ErrHTMLBody},
		{"xhtml", "/v1/completions", "application/xhtml+xml", page, 200, record.NoAnswer, record.ErrHTMLBody},
		{"empty page", "/v1/chat/completions", "text/html", "", 200, record.NoAnswer, record.ErrEmptyBody},
		{"other route", "/v1/models", "text/html", page, 200, record.Success, ""},
		{"an error page stays an error", "/v1/chat/completions", "text/html", page, 502, record.Error, record.ErrHTTP5xx},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, got, r := answeredWith(t, c.path, `{"model":"m","stream":true,"messages":[]}`, c.ct, c.status, c.body)
			if status != c.status || got != c.body || r.Outcome != c.outcome || r.ErrorType != c.errorType {
				t.Errorf("client %d %q; record %s/%s, want %s/%s", status, got, r.Outcome, r.ErrorType, c.outcome, c.errorType)
			}
		})
	}
}

// A whole JSON body that names no answer, no output, no finish reason, no
// usage and no end, is no answer (docs/measurement.md §3, empty_answer):
// `{}`, an empty choices array, a Responses background response still
// queued (answered later, elsewhere). They were successes. A real answer,
// even an empty one, is not this.
func TestEmptyJSONAnswerIsNoAnswer(t *testing.T) {
	for _, c := range []struct {
		name, path, body string
		outcome          record.Outcome
		errorType        string
	}{
		{"chat {}", "/v1/chat/completions", `{}`, record.NoAnswer, record.ErrEmptyAnswer},
		{"chat, no choice", "/v1/chat/completions", `{"id":"c","object":"chat.completion","model":"m","choices":[]}`, record.NoAnswer, record.ErrEmptyAnswer},
		{"messages {}", "/v1/messages", `{}`, record.NoAnswer, record.ErrEmptyAnswer},
		{"responses, queued", "/v1/responses", `{"id":"resp_1","object":"response","status":"queued","background":true,"output":[]}`, record.NoAnswer, record.ErrEmptyAnswer},
		{"chat answer", "/v1/chat/completions", `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`, record.Success, ""},
		{"chat, empty content, a finish reason", "/v1/chat/completions", `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"length"}]}`, record.Success, ""},
		{"tgi, empty text", "/generate", `{"generated_text":""}`, record.Success, ""},
		{"ollama, done", "/api/chat", `{"model":"m","message":{"role":"assistant","content":""},"done":true}`, record.Success, ""},
		{"an error object stays an error", "/v1/chat/completions", `{"error":{"message":"no","type":"server_error"}}`, record.Error, record.ErrStreamError},
		{"not JSON stays malformed", "/v1/chat/completions", `{"choices":`, record.Error, record.ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, got, r := answeredWith(t, c.path, `{"model":"m","stream":false,"messages":[]}`, "application/json", http.StatusOK, c.body)
			if status != http.StatusOK || got != c.body || r.Outcome != c.outcome || r.ErrorType != c.errorType {
				t.Errorf("client %d %q; record %s/%s, want %s/%s", status, got, r.Outcome, r.ErrorType, c.outcome, c.errorType)
			}
		})
	}
}

// answeredWith posts req to path through a proxy whose upstream answers
// status with body as ct, and returns what the client got and the
// request's record.
func answeredWith(t *testing.T, path, req, ct string, status int, body string) (int, string, *record.Record) {
	t.Helper()
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(status)
		io.WriteString(w, body)
	}), Options{})
	resp, err := http.Post(fs.URL+path, "application/json", strings.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(got), only(t, sink)
}
