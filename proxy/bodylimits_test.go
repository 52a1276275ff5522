package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// slowHeader is a chat request that claims a 1 MiB body and sends its
// first byte.
const slowHeader = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{"

// waitHeld waits until the budget holds want bytes, at most 60 s.
func waitHeld(t *testing.T, b *PeekBudget, want int64) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); b.Held() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the peek budget holds %d bytes, want %d", b.Held(), want)
		}
	}
}

// 300 clients on real loopback connections that claim a 1 MiB body and
// send one byte each cost the heap of their connections and of the
// bytes they sent, not of the size they claim: the peek grows with the
// bytes that arrived (issue 40: 1 MiB of heap each, before).
func TestPeekHeapPerSlowClient(t *testing.T) {
	const clients = 300
	budget := NewPeekBudget(64 << 20)
	u, _ := url.Parse("http://127.0.0.1:1") // never reached: no body ends
	p, err := New(Options{Upstream: u, PeekBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	conns := make([]net.Conn, 0, clients)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range clients {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, slowHeader); err != nil {
			t.Fatal(err)
		}
	}
	// Every peek has its first buffer, and none grew: the peeks read.
	waitHeld(t, budget, clients*peekFirst)
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / clients
	stack := (int64(after.StackInuse) - int64(before.StackInuse)) / clients
	t.Logf("%d clients claiming 1 MiB, one byte sent: %.1f KiB of heap per connection (stacks %.1f KiB more)", clients, float64(heap)/1024, float64(stack)/1024)
	if heap > 64<<10 {
		t.Fatalf("%d bytes of heap per slow client, want at most 64 KiB", heap)
	}
}

// A peek takes its buffer from the budget as it grows; when the budget
// is full, the request is forwarded as it came, unread, counted, and its
// record says request_read "budget". What a request held is given back
// when it ends: the next request is peeked whole again.
func TestPeekBudgetFullForwardsUnread(t *testing.T) {
	var (
		mu  sync.Mutex
		got [][]byte
	)
	up := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
		sse(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")(w, r)
	}
	body := `{"model":"slow","stream":true,"max_tokens":4}`
	held := int64(len(body) + 1)                        // the first buffer of a body that says its length
	budget := NewPeekBudget(int64(len(streamBody) + 1)) // room for one of the requests below, with nothing else

	fs, sink := front(t, http.HandlerFunc(up), Options{PeekBudget: budget})

	// A slow client holds the whole budget.
	slow, err := net.Dial("tcp", fs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:1])
	waitHeld(t, budget, held)

	resp, out := do(t, fs, "/v1/chat/completions", streamBody)
	if resp.StatusCode != 200 || !strings.Contains(out, "[DONE]") {
		t.Fatalf("with the budget full: %s %q", resp.Status, out)
	}
	rec := only(t, sink)
	if rec.RequestRead != ReadBudget || rec.Outcome != record.Success || !rec.Stream {
		t.Fatalf("record with the budget full: request_read %q outcome %q stream %v; want budget, success, true (the answer decides)",
			rec.RequestRead, rec.Outcome, rec.Stream)
	}
	if budget.Full() != 1 {
		t.Fatalf("Full() = %d, want 1", budget.Full())
	}
	mu.Lock()
	if len(got) != 1 || string(got[0]) != streamBody {
		t.Fatalf("the engine got %q, want the body as sent", got)
	}
	mu.Unlock()

	// The slow client finishes: its peek is given back.
	io.WriteString(slow, body[1:])
	br := bufio.NewReader(slow)
	sresp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, sresp.Body)
	waitHeld(t, budget, 0)
	sink.mu.Lock()
	sink.recs = nil
	sink.mu.Unlock()
	do(t, fs, "/v1/chat/completions", streamBody)
	if rec := only(t, sink); rec.RequestRead != "" || budget.Full() != 1 {
		t.Fatalf("after the budget was given back: request_read %q, Full() %d; want \"\", 1", rec.RequestRead, budget.Full())
	}
}

// readAtMost grows its buffer with the bytes that arrived, never to the
// size the body claims before they do, and reads a body of the size it
// claims with one buffer of that size at the end.
func TestReadAtMostGrowsWithBytes(t *testing.T) {
	budget := NewPeekBudget(1 << 30)
	// One byte of a claimed MiB: the first buffer only.
	buf, held, full, err := readAtMost(io.LimitReader(bytes.NewReader([]byte("{")), 1), 1<<20+1, 1<<20, budget)
	if err != nil || full || string(buf) != "{" || held != peekFirst || cap(buf) != peekFirst {
		t.Fatalf("one byte of a claimed MiB: %q held %d cap %d full %v err %v; want {, %d", buf, held, cap(buf), full, err, peekFirst)
	}
	// The whole MiB: grown 4x at a time to the size claimed plus one.
	body := bytes.Repeat([]byte("a"), 1<<20)
	buf, held, full, err = readAtMost(bytes.NewReader(body), 1<<20+2, 1<<20, budget)
	if err != nil || full || len(buf) != 1<<20 || held != 1<<20+1 || cap(buf) != held {
		t.Fatalf("a whole MiB: len %d held %d cap %d full %v err %v; want %d, %d", len(buf), held, cap(buf), full, err, 1<<20, 1<<20+1)
	}
	// A body of unknown length up to the bound: the last growth goes to
	// the bound, never to a buffer a few bytes short of it and then one
	// more: 4, 16, 64 and 256 KiB, then the bound.
	r := bytes.NewReader(body)
	if n := testing.AllocsPerRun(3, func() {
		r.Reset(body)
		if buf, held, _, _ := readAtMost(r, 1<<20+1, -1, nil); len(buf) != 1<<20 || held != 1<<20+1 {
			t.Fatalf("a MiB of unknown length, bound a MiB and a byte: len %d held %d", len(buf), held)
		}
	}); n != 5 {
		t.Errorf("%v buffers to read a MiB of unknown length, want 5", n)
	}
	// A budget that holds 20 KiB stops the peek at its 16 KiB buffer.
	small := NewPeekBudget(20 << 10)
	buf, held, full, err = readAtMost(bytes.NewReader(body), 1<<20+2, -1, small)
	if err != nil || !full || len(buf) != 16<<10 || held != 16<<10 || small.Held() != 16<<10 {
		t.Fatalf("a 20 KiB budget: len %d held %d full %v err %v (budget holds %d); want 16 KiB, full", len(buf), held, full, err, small.Held())
	}
}

// pipeListener serves the connections sent on conns (net.Pipe's, so
// that a server runs in a synctest bubble).
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// dial returns the client's end of a new connection to the server.
func (l *pipeListener) dial() net.Conn {
	srv, cli := net.Pipe()
	l.conns <- srv
	return cli
}

// memUpstream is an engine in memory: it reads the request body chunk
// bytes at a time, waiting pause before each read, then answers a
// stream.
type memUpstream struct {
	chunk int
	pause time.Duration
	got   int
}

func (u *memUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	buf := make([]byte, u.chunk)
	for {
		time.Sleep(u.pause)
		n, err := r.Body.Read(buf)
		u.got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	r.Body.Close()
	w := httptest.NewRecorder()
	sse(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")(w, r)
	resp := w.Result()
	resp.Request = r
	return resp, nil
}

// bodyLimitProxy serves a proxy with a 30 s idle bound and a minimum
// body rate of 1 KiB/s in front of up, in the bubble.
func bodyLimitProxy(t *testing.T, up http.RoundTripper, peekBytes int) (*pipeListener, *collect, func()) {
	var sink collect
	u, _ := url.Parse("http://engine.invalid")
	p, err := New(Options{Upstream: u, Transport: up, BodyReadTimeout: 30 * time.Second, BodyMinRate: 1024, PeekBytes: peekBytes,
		Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
	if err != nil {
		t.Fatal(err)
	}
	ln := newPipeListener()
	srv := &http.Server{Handler: p}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	return ln, &sink, func() { srv.Close(); <-done }
}

// A body trickled a byte every 10 s re-arms the 30 s idle bound at
// every byte; the minimum rate cuts it when it falls behind: 30 s (the
// idle bound) and 4 ms for its four bytes at 1 KiB/s after it began,
// with a 408 and a record, on the bubble's clock (issue 40: never cut
// while the bytes kept coming).
func TestBodyMinRateCutsATrickle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln, sink, stop := bodyLimitProxy(t, &memUpstream{chunk: 1}, 0)
		defer stop()
		c := ln.dial()
		defer c.Close()
		start := time.Now()
		quit := make(chan struct{})
		defer close(quit)
		go func() {
			if _, err := io.WriteString(c, slowHeader); err != nil {
				return
			}
			for range 30 { // then silence: the idle bound alone would cut at 330 s
				select {
				case <-quit:
					return
				case <-time.After(10 * time.Second):
				}
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("status %s, want 408", resp.Status)
		}
		if want := 30*time.Second + 4*time.Second/1024; took < want || took > want+time.Millisecond {
			t.Fatalf("cut after %v, want %v (30 s, then 4 bytes at 1 KiB/s)", took, want)
		}
		synctest.Wait()
		rec := only(t, sink)
		if rec.Outcome != record.Error || rec.ErrorType != record.ErrHTTP4xx || rec.HTTPStatus != http.StatusRequestTimeout {
			t.Fatalf("record: outcome %q error %q status %d; want error, http_4xx, 408", rec.Outcome, rec.ErrorType, rec.HTTPStatus)
		}
	})
}

// Only the time spent waiting for the client counts against the rate:
// an engine that takes the body a KiB every 10 s (about 100 B/s) while
// the client has sent it all is not the client's slowness; the request
// is served.
func TestBodyMinRateNotChargedForTheEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &memUpstream{chunk: 1024, pause: 10 * time.Second}
		ln, sink, stop := bodyLimitProxy(t, up, 1024) // the peek reads 1 KiB; the engine the rest
		defer stop()
		c := ln.dial()
		defer c.Close()
		body := bigChat(64 << 10)
		go fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(out), "[DONE]") || up.got != len(body) {
			t.Fatalf("after %v: %s %q, the engine got %d of %d bytes", time.Since(start), resp.Status, out, up.got, len(body))
		}
		if took := time.Since(start); took < 10*time.Minute {
			t.Fatalf("the engine took the body in %v; the test wants it slower than the minimum rate", took)
		}
		synctest.Wait()
		if rec := only(t, sink); rec.Outcome != record.Success {
			t.Fatalf("record: outcome %q, want success", rec.Outcome)
		}
	})
}
