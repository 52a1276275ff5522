package proxy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// A proxy whose upstream is its own listener: the first pass forwards
// the request with its Via; the second finds its own pseudonym, answers
// 508 and records error/loop_detected without forwarding; the first
// records the 508 it got as an error. Two records for the client's one
// request, not thousands.
func TestLoopToItselfIs508(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var sink collect
	u, _ := url.Parse("http://" + ln.Addr().String())
	p, err := New(Options{Upstream: u, Via: "tokentap-test1", Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	var arrivals atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrivals.Add(1)
		p.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)

	resp, body := do(t, srv, "/v1/chat/completions", streamBody)
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(body, `"type":"tokentap_loop_detected"`) {
		t.Fatalf("status %d, body %s: want 508 with type tokentap_loop_detected", resp.StatusCode, body)
	}
	if n := arrivals.Load(); n != 2 {
		t.Fatalf("%d arrivals at the proxy, want 2 (the client's, and its one forward)", n)
	}
	waitRecords(&sink, 2)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	got := map[string]int{}
	for _, r := range sink.recs {
		got[string(r.Outcome)+"/"+r.ErrorType+"/"+http.StatusText(r.HTTPStatus)]++
		if r.ErrorType == record.ErrLoop && (r.API != stream.NameChat || r.Terminal.IsZero()) {
			t.Errorf("loop record: api %q terminal %v", r.API, r.Terminal)
		}
	}
	want := map[string]int{"error/loop_detected/Loop Detected": 1, "error/http_5xx/Loop Detected": 1}
	if len(got) != len(want) || got["error/loop_detected/Loop Detected"] != 1 || got["error/http_5xx/Loop Detected"] != 1 {
		t.Fatalf("records %v, want %v", got, want)
	}
}

// The Via a proxy adds: appended to the hops the request came with,
// in the request's protocol version; a request naming another sidecar
// is forwarded; one naming this one, in any position or spacing, is
// refused before the upstream sees it.
func TestViaHeader(t *testing.T) {
	var seen atomic.Pointer[[]string]
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Values("Via")
		seen.Store(&v)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}), Options{Via: "tokentap-abc"})
	send := func(via ...string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, fs.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		for _, v := range via {
			req.Header.Add("Via", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := send("1.0 gateway, 1.1 tokentap-other (tokentap)"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := *seen.Load(); strings.Join(got, " | ") != "1.0 gateway, 1.1 tokentap-other (tokentap) | 1.1 tokentap-abc" {
		t.Fatalf("upstream saw Via %q", got)
	}
	seen.Store(nil)
	for _, via := range [][]string{{"1.1 tokentap-abc"}, {"1.0 gw", "HTTP/1.1   tokentap-abc  (x)"}, {"2 a,1.1 tokentap-abc"}} {
		if resp := send(via...); resp.StatusCode != http.StatusLoopDetected {
			t.Errorf("Via %q: status %d, want 508", via, resp.StatusCode)
		}
	}
	if seen.Load() != nil {
		t.Fatal("a looping request reached the upstream")
	}
	waitRecords(sink, 4)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	loops := 0
	for _, r := range sink.recs {
		if r.ErrorType == record.ErrLoop && r.HTTPStatus == 508 && r.Outcome == record.Error {
			loops++
		}
	}
	if loops != 3 || len(sink.recs) != 4 {
		t.Fatalf("%d records, %d of them error/loop_detected 508; want 4 and 3", len(sink.recs), loops)
	}
}

func TestViaNames(t *testing.T) {
	for _, c := range []struct {
		via  []string
		want bool
	}{
		{nil, false},
		{[]string{"1.1 tokentap-a"}, true},
		{[]string{"1.1 tokentap-ab"}, false},
		{[]string{"1.1 tokentap-b, 1.1 tokentap-a"}, true},
		{[]string{"tokentap-a"}, false}, // a protocol with no received-by
		{[]string{"1.1 x (tokentap-a)"}, false},
		{[]string{"", " , ,1.1\ttokentap-a"}, true},
	} {
		h := http.Header{"Via": c.via}
		if got := viaNames(h, "tokentap-a"); got != c.want {
			t.Errorf("%q: %v, want %v", c.via, got, c.want)
		}
	}
}

// Reading the Via header allocates nothing.
func TestViaNamesAllocs(t *testing.T) {
	h := http.Header{"Via": {"1.0 gateway, 1.1 tokentap-other", "2 edge"}}
	if n := testing.AllocsPerRun(100, func() { viaNames(h, "tokentap-a") }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// waitRecords waits, at most 5 s, until c has n records: a record is
// written when its handler returns, which may be after the client has
// read the answer.
func waitRecords(c *collect, n int) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.mu.Lock()
		have := len(c.recs)
		c.mu.Unlock()
		if have >= n {
			return
		}
	}
}
