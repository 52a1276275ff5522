//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// loopFront is front with the event loop on, returning the proxy too.
func loopFront(t *testing.T, h http.Handler, opts Options) (*httptest.Server, *collect, *Proxy) {
	t.Helper()
	us := httptest.NewServer(h)
	t.Cleanup(us.Close)
	opts.Upstream, _ = url.Parse(us.URL)
	var sink collect
	opts.Pipeline = pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})
	opts.EventLoop = true
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	fs := serve(p, true)
	t.Cleanup(fs.Close)
	return fs, &sink, p
}

// loopTo is a proxy with the event loop on in front of the upstream at
// rawURL, with the records it collects.
func loopTo(t *testing.T, rawURL string) (*httptest.Server, *collect, *Proxy) {
	t.Helper()
	var sink collect
	u, _ := url.Parse(rawURL)
	p, err := New(Options{Upstream: u, EventLoop: true, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	fs := serve(p, true)
	t.Cleanup(fs.Close)
	return fs, &sink, p
}

// paced serves n content events, gap apart, then a finish and [DONE].
func paced(n int, gap time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for i := range n {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(gap):
			}
		}
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}
}

// The loop relays a stream byte for byte, the tap times every event, and
// both connections serve the next request after it (keep-alive: net/http
// ends the client's chunked body and keeps its connection; the
// upstream's goes back to the idle ones).
func TestEventLoopRelaysAStream(t *testing.T) {
	fs, sink, p := loopFront(t, paced(20, time.Millisecond), Options{})
	var reused []bool
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	want := contentEvents(20) + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	for range 2 {
		req, _ := http.NewRequest("POST", fs.URL+"/v1/chat/completions", strings.NewReader(streamBody))
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}))
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != want || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("read %q, err %v, content type %q; want the upstream's stream", b, err, resp.Header.Get("Content-Type"))
		}
	}
	if len(reused) != 2 || !reused[1] {
		t.Errorf("connections reused %v, want the second request on the first's connection", reused)
	}
	if n := p.loops.carried.Load(); n != 2 {
		t.Fatalf("the loop carried %d streams, want 2", n)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		sink.mu.Lock()
		n := len(sink.recs)
		sink.mu.Unlock()
		if n == 2 {
			break
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for i, r := range sink.recs {
		if r.Outcome != record.Success || r.TokenEvents() != 20 || r.FinishReason != "stop" || r.Upstream.Reused != (i == 1) {
			t.Errorf("record %d: %s/%s, %d token events, finish %q, upstream reused %v; want success, 20, stop, the first's connection reused by the second",
				i, r.Outcome, r.ErrorType, r.TokenEvents(), r.FinishReason, r.Upstream.Reused)
		}
		for i := 1; i < len(r.TokenAt); i++ {
			if r.TokenAt[i] < r.TokenAt[i-1] {
				t.Fatalf("token instants out of order: %v", r.TokenAt)
			}
		}
	}
}

// An idle upstream connection is used again only while it is open: one
// the engine closed (its keep-alive timeout) is dropped when taken and
// the request goes over a new one; an answer that says Connection: close
// leaves its connection closed, not kept.
func TestEventLoopIdleConnections(t *testing.T) {
	var closeNext atomic.Bool
	var conns, closed atomic.Int32
	stream := paced(3, 0)
	us := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if closeNext.Load() {
			w.Header().Set("Connection", "close")
		}
		stream(w, r)
	}))
	us.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	us.Start()
	defer us.Close()
	var sink collect
	u, _ := url.Parse(us.URL)
	p, err := New(Options{Upstream: u, EventLoop: true, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	fs := serve(p, true)
	defer fs.Close()
	want := contentEvents(3) + "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	step := func(name string, wantConns int32, wantReused bool) {
		t.Helper()
		resp, got := do(t, fs, "/v1/chat/completions", streamBody)
		if resp.StatusCode != 200 || got != want {
			t.Fatalf("%s: %d %q", name, resp.StatusCode, got)
		}
		r := waitOne(t, &sink)
		sink.mu.Lock()
		sink.recs = nil
		sink.mu.Unlock()
		if r.Outcome != record.Success || r.Upstream.Reused != wantReused || conns.Load() != wantConns {
			t.Errorf("%s: %s, reused %v, %d upstream connections; want success, reused %v, %d", name, r.Outcome, r.Upstream.Reused, conns.Load(), wantReused, wantConns)
		}
	}
	step("first", 1, false)
	step("kept", 1, true)
	us.CloseClientConnections() // the engine closes its idle connections
	for closed.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	step("after the engine closed it", 2, false)
	closeNext.Store(true)
	step("answered with Connection: close", 2, true)
	closeNext.Store(false)
	step("after Connection: close", 3, false)
	if n := p.loops.carried.Load(); n != 5 {
		t.Errorf("the loop carried %d streams, want 5", n)
	}
}

// An idle upstream connection with bytes no request asked for (a 408
// some servers send before they close an idle connection) is not used
// again: the next request goes over a new one, and reads its own answer.
func TestEventLoopIdleConnectionWithStrayBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	stray := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					ev := fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c%d\"}}]}\n\n", n)
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
					if n == 1 {
						time.Sleep(20 * time.Millisecond) // after the sidecar kept the connection
						io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
						close(stray)
						time.Sleep(time.Second)
						return
					}
				}
			}()
		}
	}()
	fs, _, p := loopTo(t, "http://"+ln.Addr().String())
	for i, want := range []string{"c1", "c2"} {
		resp, got := do(t, fs, "/v1/chat/completions", streamBody)
		if resp.StatusCode != 200 || !strings.Contains(got, want) {
			t.Fatalf("request %d: %d %q, want the event %s", i+1, resp.StatusCode, got, want)
		}
		if i == 0 {
			<-stray
			waitStray(t, &p.rp.Transport.(*directTransport).idle, ln.Addr().String())
		}
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d upstream connections, want 2: the one with stray bytes dropped", n)
	}
}

// waitStray waits until addr's idle connection has bytes to read.
func waitStray(t *testing.T, idle *idleConns, addr string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		idle.mu.Lock()
		s := idle.byAddr[addr]
		readable := len(s) == 1 && !quiet(s[0].c)
		idle.mu.Unlock()
		if readable {
			return
		}
	}
	t.Fatal("the kept connection never had the stray bytes")
}

// A client that goes away mid-stream: the loop ends the stream, the
// upstream's connection is closed (its handler sees its request end),
// and the record says cancelled.
func TestEventLoopClientGoesAway(t *testing.T) {
	gone := make(chan struct{})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(gone)
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	fs, sink, p := loopFront(t, up, Options{})
	c, err := net.Dial("tcp", fs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
	br := bufio.NewReader(c)
	for n := 0; n < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			n++
		}
	}
	c.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's request never ended")
	}
	r := waitOne(t, sink)
	if r.Outcome != record.Cancelled || r.ErrorType != record.ErrCancelled || r.TokenEvents() < 3 {
		t.Errorf("record %s/%s with %d token events, want cancelled after 3 or more", r.Outcome, r.ErrorType, r.TokenEvents())
	}
	if p.loops.carried.Load() != 1 {
		t.Errorf("the loop carried %d streams, want 1", p.loops.carried.Load())
	}
}

// An upstream that breaks mid-stream (no last chunk): the client's
// stream is cut too (no last chunk: it knows), and the record says
// error, upstream_reset, with the events before the break.
func TestEventLoopUpstreamBreaks(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, contentEvents(5))
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		panic(http.ErrAbortHandler)
	})
	fs, sink, _ := loopFront(t, up, Options{})
	resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || string(b) != contentEvents(5) {
		t.Errorf("client read %q, err %v; want the 5 events, then an error", b, err)
	}
	r := waitOne(t, sink)
	if r.Outcome != record.Error || r.ErrorType != record.ErrUpstreamReset || r.TokenEvents() != 5 {
		t.Errorf("record %s/%s with %d token events, want error/upstream_reset after 5", r.Outcome, r.ErrorType, r.TokenEvents())
	}
}

// A client that stops reading for a while: what its socket cannot take
// waits on the loop, the upstream is not read meanwhile, and every byte
// arrives in order once it reads again; in strip mode the injected usage
// is still cut.
func TestEventLoopSlowClient(t *testing.T) {
	const events = 1000 // 6 MB: more than the sockets between the sidecar and the client hold
	big := strings.Repeat("x", 6000)
	var want strings.Builder
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d%s\"}}]}\n\n", i, big)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", events)
	})
	for i := range events {
		fmt.Fprintf(&want, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d%s\"}}]}\n\n", i, big)
	}
	want.WriteString("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	fs, sink, p := loopFront(t, up, Options{InjectUsage: true})
	// A receive buffer of 64 KiB, set before the connect (a smaller one,
	// or one set after it, stalls loopback's 64 KiB segments on
	// retransmission timers).
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		return serr
	}}
	c, err := d.Dial("tcp", fs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(streamBody), streamBody)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 100)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the upstream sends it all meanwhile
	rest, err := io.ReadAll(resp.Body)
	b := append(first, rest...)
	if err != nil || string(b) != want.String() {
		t.Fatalf("read %d bytes (err %v), want %d, the stream without its usage chunk", len(b), err, want.Len())
	}
	r := waitOne(t, sink)
	if r.Outcome != record.Success || r.TokenEvents() != events || r.OutputTokens != events || !r.UsageInjected {
		t.Errorf("record %s/%s, %d token events, %d output tokens, injected %v", r.Outcome, r.ErrorType, r.TokenEvents(), r.OutputTokens, r.UsageInjected)
	}
	if p.loops.carried.Load() != 1 {
		t.Errorf("the loop carried %d streams, want 1", p.loops.carried.Load())
	}
}

// What the loop does not carry takes net/http's path: a stream with a
// length (not chunked), a request that does not stream, an HTTP/1.0
// client.
func TestEventLoopFallsBack(t *testing.T) {
	body := contentEvents(3) + "data: [DONE]\n\n"
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	})
	fs, sink, p := loopFront(t, up, Options{})
	resp, got := do(t, fs, "/v1/chat/completions", streamBody)
	if resp.StatusCode != 200 || got != body {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
	if r := only(t, sink); r.Outcome != record.Success || r.TokenEvents() != 3 {
		t.Errorf("record %s, %d token events", r.Outcome, r.TokenEvents())
	}
	if p.loops.carried.Load() != 0 {
		t.Errorf("the loop carried a stream with a Content-Length")
	}
}

// A request cut by its deadline mid-stream on the loop: the record says
// timeout, and the client's stream is cut.
func TestEventLoopTimeout(t *testing.T) {
	fs, sink, p := loopFront(t, paced(1000, 5*time.Millisecond), Options{Timeout: 150 * time.Millisecond})
	resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Error("the client's stream ended cleanly; want it cut")
	}
	r := waitOne(t, sink)
	if r.Outcome != record.Timeout || r.ErrorType != record.ErrTimeout || r.TokenEvents() == 0 {
		t.Errorf("record %s/%s with %d token events, want timeout", r.Outcome, r.ErrorType, r.TokenEvents())
	}
	if p.loops.carried.Load() != 1 {
		t.Errorf("the loop carried %d streams, want 1", p.loops.carried.Load())
	}
}

// An upstream whose chunked framing breaks: what came before the break
// is forwarded, the client's stream is cut, and the record says error.
func TestEventLoopMalformedFraming(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ev := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
		time.Sleep(20 * time.Millisecond)
		io.WriteString(c, "zz\r\nnot a chunk\r\n")
		time.Sleep(time.Second)
	}()
	fs, sink, _ := loopTo(t, "http://"+ln.Addr().String())
	resp, err := http.Post(fs.URL+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || string(b) != ev {
		t.Errorf("client read %q, err %v; want the first event, then an error", b, err)
	}
	r := waitOne(t, sink)
	if r.Outcome != record.Error || r.ErrorType != record.ErrUpstreamReset || r.TokenEvents() != 1 {
		t.Errorf("record %s/%s with %d token events", r.Outcome, r.ErrorType, r.TokenEvents())
	}
}

// A relay's step, a read's bytes through the tap and onto the client's
// socket, allocates nothing in steady state, in either tap mode.
func TestEventLoopStepAllocatesNothing(t *testing.T) {
	fds, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFDs(fds)
	go drainFD(fds[1])
	raw := []byte(fmt.Sprintf("%x\r\n%s\r\n", len(tokenEvent), tokenEvent))
	for _, mode := range tapModes {
		st := realState(1024)
		feed := &loopFeed{}
		tp := newTap(feed, st, bodySSE, stream.FormatOpenAI, mode.strip, 1<<20)
		tp.looped = true
		r := &relay{t: tp, feed: feed, cfd: fds[0], pendBuf: make([]byte, 0, rawBufSize+64)}
		in := make([]byte, len(raw))
		step := func() {
			copy(in, raw) // decoded in place
			full, err := r.step(loopBufPool.Get().(*loopBufs), in, nil)
			for full && err == nil { // the reader fell behind: wait for room, as the loop would
				n, werr := rawIO(syscall.SYS_WRITE, r.cfd, r.pending)
				if werr == nil {
					r.pending = r.pending[n:]
				}
				if len(r.pending) == 0 {
					r.pending = nil
					full, err = r.step(loopBufPool.Get().(*loopBufs), nil, nil)
				}
			}
			if err != nil || r.caught != nil {
				t.Fatalf("%s: err %v caught %v", mode.name, err, r.caught)
			}
		}
		for range 2048 {
			step()
		}
		if n := testing.AllocsPerRun(1000, step); n != 0 {
			t.Errorf("%s: %.2f allocations per event", mode.name, n)
		}
		if st.rec.TokenEvents() == 0 {
			t.Fatalf("%s: no token events", mode.name)
		}
	}
}

func TestEventLoopFeedKeepsBytes(t *testing.T) {
	f := &loopFeed{b: []byte("abc")}
	p := make([]byte, 2)
	if n, err := f.Read(p); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	if n, err := f.Read(p); n != 1 || err != nil || !bytes.Equal(p[:1], []byte("c")) {
		t.Fatal(n, err)
	}
	if _, err := f.Read(p); err != errAgain {
		t.Fatalf("empty feed: %v, want errAgain", err)
	}
	f.err = io.EOF
	if _, err := f.Read(p); err != io.EOF {
		t.Fatalf("ended feed: %v", err)
	}
}
