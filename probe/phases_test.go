package probe

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// dialingTransport is handlerTransport behind a connection that is
// opened once, as net/http's transport reports it through httptrace: on
// the first request a lookup (1 ms), a connect (3 ms) and a TLS
// handshake (20 ms) of the bubble's time, on the next ones the same
// connection again; the response's first byte when the handler answers.
type dialingTransport struct {
	handlerTransport
	dialled atomic.Bool
}

func (t *dialingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := httptrace.ContextClientTrace(req.Context())
	tr.GetConn("api.example.test:443")
	fresh := !t.dialled.Swap(true)
	if fresh {
		tr.DNSStart(httptrace.DNSStartInfo{Host: "api.example.test"})
		time.Sleep(time.Millisecond)
		tr.DNSDone(httptrace.DNSDoneInfo{})
		tr.ConnectStart("tcp", "192.0.2.1:443")
		time.Sleep(3 * time.Millisecond)
		tr.ConnectDone("tcp", "192.0.2.1:443", nil)
		tr.TLSHandshakeStart()
		time.Sleep(20 * time.Millisecond)
		tr.TLSHandshakeDone(tls.ConnectionState{}, nil)
	}
	tr.GotConn(httptrace.GotConnInfo{Reused: !fresh})
	tr.WroteRequest(httptrace.WroteRequestInfo{})
	resp, err := t.handlerTransport.RoundTrip(req)
	if err == nil {
		tr.GotFirstResponseByte()
	}
	return resp, err
}

// Canary records carry the connection phases, as live ones do, and so
// does /probes: the first probe's new connection (lookup, connect, TLS
// and the wait they made), the next one's reused connection; the
// engine's 240 ms to its answer is the server phase of both.
func TestProbePhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			time.Sleep(240 * time.Millisecond)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		})
		var recs sink
		u, _ := url.Parse("http://engine.invalid")
		cfg := Config{Probes: []Def{{Name: "hosted", URL: "https://api.example.test", Interval: time.Second}}}.WithDefaults("m")
		p := New(Options{Config: cfg, Upstream: u, Transport: &dialingTransport{handlerTransport: handlerTransport{h}},
			Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}})})
		runFor(p, 1500*time.Millisecond)

		const ms = time.Millisecond
		wants := []map[string]any{
			{"reused": false, "conn_wait_ms": 24.0, "dns_ms": 1.0, "connect_ms": 3.0, "tls_ms": 20.0, "server_ms": 240.0},
			{"reused": true, "conn_wait_ms": 0.0, "dns_ms": nil, "connect_ms": nil, "tls_ms": nil, "server_ms": 240.0},
		}
		recs.mu.Lock()
		var sent []*record.Record
		for _, r := range recs.recs {
			switch {
			case r.Outcome != record.NotSent:
				sent = append(sent, r)
			case r.Upstream.Asked:
				t.Errorf("a probe not sent has connection phases: %+v", r.Upstream)
			}
		}
		recs.mu.Unlock()
		if len(sent) != 2 {
			t.Fatalf("%d probes sent, want 2", len(sent))
		}
		for i, r := range sent {
			if ttft, ok := r.TTFT(); !ok || ttft-r.Upstream.ConnWait != 240*ms || r.Upstream.Reused != (i == 1) {
				t.Errorf("probe %d: TTFT %v, upstream %+v", i, ttft, r.Upstream)
			}
		}

		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest("GET", "/probes?format=json", nil))
		var page struct {
			Probes []struct {
				Recent []struct {
					Result   string
					Upstream map[string]any
				}
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || len(page.Probes) != 1 {
			t.Fatalf("%v: %s", err, w.Body)
		}
		var results []map[string]any
		for _, res := range page.Probes[0].Recent { // newest first
			switch {
			case res.Result != ResultNotSent:
				results = append(results, res.Upstream)
			case res.Upstream != nil:
				t.Errorf("/probes: a probe not sent has an upstream object: %v", res.Upstream)
			}
		}
		if len(results) != 2 {
			t.Fatalf("%d probes sent on /probes, want 2: %s", len(results), w.Body)
		}
		for i, up := range results {
			want := wants[1-i]
			if len(up) != len(want) {
				t.Errorf("/probes result %d: upstream %v, want %v", i, up, want)
			}
			for k, v := range want {
				if got, ok := up[k]; !ok || got != v {
					t.Errorf("/probes result %d: upstream.%s = %v, want %v", i, k, got, v)
				}
			}
		}
		w = httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest("GET", "/probes", nil))
		for _, row := range []string{"<td>200</td><td>240</td><td>240</td>", "<td>reused</td><td>0</td><td>–</td><td>–</td><td>–</td><td>240</td>",
			"<td>200</td><td>264</td><td>264</td>", "<td>new</td><td>24</td><td>1</td><td>3</td><td>20</td><td>240</td>"} {
			if !strings.Contains(w.Body.String(), row) {
				t.Errorf("the HTML page lacks %s:\n%s", row, w.Body)
			}
		}
	})
}
