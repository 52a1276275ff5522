package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/record"
)

// halfClosed sends reqs on one TCP connection to addr, shuts its write
// side (SHUT_WR), and reads every response until the sidecar closes
// the connection.
func halfClosed(t *testing.T, addr string, reqs ...string) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, strings.Join(reqs, "")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
}

func rawPost(body string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A client that sends its request and shuts its write side (SHUT_WR),
// alone or with a second request pipelined behind it, or that shuts it
// mid-body, is one net/http cannot tell from a client that went away: it
// cancels the request. The sidecar answers as a bare ReverseProxy does,
// 502, never net/http's empty 200 OK, and records each request cancelled
// with that status (issue 40, item 5). The upstream answers only once its
// request is cancelled, so no answer can win the race.
func TestHalfClosedClientIsNeverASuccess(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waitGone(r)
		sse(`data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")(w, r)
	})
	whole := rawPost(streamBody)
	cases := []struct {
		name string
		reqs []string
		msg  string // the answer's error message
	}{
		{"alone", []string{whole}, "tokentap: upstream Bad Gateway: context canceled"},
		{"pipelined", []string{whole, whole}, "tokentap: upstream Bad Gateway: context canceled"},
		{"mid-body", []string{whole[:len(whole)-10]}, "tokentap: reading request body: unexpected EOF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, sink, m := judged(t, up, Options{})
			resps := halfClosed(t, fs.Listener.Addr().String(), c.reqs...)
			if len(resps) != len(c.reqs) {
				t.Fatalf("%d responses to %d requests", len(resps), len(c.reqs))
			}
			for i, r := range resps {
				b, _ := io.ReadAll(r.Body)
				if r.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), c.msg) {
					t.Errorf("response %d: %s %q, want 502 with %q", i, r.Status, b, c.msg)
				}
			}
			fs.Close() // every handler has returned: every record is written
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if len(sink.recs) != len(c.reqs) {
				t.Fatalf("%d records, want %d", len(sink.recs), len(c.reqs))
			}
			for _, rec := range sink.recs {
				if rec.Outcome != record.Cancelled || rec.ErrorType != record.ErrCancelled || rec.HTTPStatus != http.StatusBadGateway {
					t.Errorf("record %s %s %d, want cancelled cancelled 502", rec.Outcome, rec.ErrorType, rec.HTTPStatus)
				}
			}
			if n := counterValue(t, m, "tokentap_requests_total", "outcome", string(record.Cancelled)); n != float64(len(c.reqs)) {
				t.Errorf("cancelled requests %v, want %d", n, len(c.reqs))
			}
			if n := counterValue(t, m, "tokentap_requests_total", "outcome", string(record.Success)); n != 0 {
				t.Errorf("successful requests %v, want 0", n)
			}
		})
	}
}
