package proxy

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// A minimal RFC 6455 WebSocket, standard library only: the handshake and
// unfragmented frames, enough for an echo server and its client.

const (
	wsBinary = 0x2
	wsClose  = 0x8
)

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")) // RFC 6455 §1.3
	return base64.StdEncoding.EncodeToString(h[:])
}

// wsWrite writes one final frame; a client masks it (mask != nil, §5.3).
func wsWrite(w io.Writer, op byte, payload, mask []byte) error {
	b := []byte{0x80 | op}
	var m byte
	if mask != nil {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, m|byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, m|126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, m|127), uint64(n))
	}
	if mask == nil {
		b = append(b, payload...)
	} else {
		b = append(b, mask...)
		for i, c := range payload {
			b = append(b, c^mask[i%4])
		}
	}
	_, err := w.Write(b)
	return err
}

// wsRead reads one frame and returns its opcode and unmasked payload.
func wsRead(r io.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	var ext [8]byte
	switch n {
	case 126:
		if _, err := io.ReadFull(r, ext[:2]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:2]))
	case 127:
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("a %d-byte frame", n)
	}
	var mask []byte
	if h[1]&0x80 != 0 {
		mask = make([]byte, 4)
		if _, err := io.ReadFull(r, mask); err != nil {
			return 0, nil, err
		}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	for i := range p {
		if mask != nil {
			p[i] ^= mask[i%4]
		}
	}
	return h[0] & 0x0f, p, nil
}

// wsEcho is a WebSocket echo server: it keeps every message it received
// and sends it back. A close frame is answered with one, and then the
// server closes the connection first (RFC 6455 §7.1.1); the message
// "reset" makes it abort the connection (a reset, as a crashing engine).
type wsEcho struct {
	mu       sync.Mutex
	received [][]byte
}

func (e *wsEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || upgradeType(r.Header) == "" {
		http.Error(w, "a websocket upgrade, please", http.StatusBadRequest)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		wsAccept(r.Header.Get("Sec-WebSocket-Key")))
	if brw.Flush() != nil {
		return
	}
	for {
		op, msg, err := wsRead(brw)
		switch {
		case err != nil:
			return
		case op == wsClose:
			wsWrite(conn, wsClose, msg, nil)
			return
		case string(msg) == "reset":
			conn.(*net.TCPConn).SetLinger(0) // Close sends a reset
			return
		}
		e.mu.Lock()
		e.received = append(e.received, msg)
		e.mu.Unlock()
		if wsWrite(conn, op, msg, nil) != nil {
			return
		}
	}
}

// wsDial opens a WebSocket to the server at addr and checks the 101.
func wsDial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var k [16]byte
	rand.Read(k[:])
	key := base64.StdEncoding.EncodeToString(k[:])
	fmt.Fprintf(conn, "GET /v1/realtime?model=m HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", addr, key)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		t.Fatalf("handshake: %s %q, accept %q", resp.Status, b, resp.Header.Get("Sec-WebSocket-Accept"))
	}
	return conn, br
}

// wsRoundTrip sends msg and reads its echo.
func wsRoundTrip(t *testing.T, conn net.Conn, br *bufio.Reader, msg []byte) {
	t.Helper()
	if err := wsWrite(conn, wsBinary, msg, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	op, echo, err := wsRead(br)
	if err != nil || op != wsBinary || !bytes.Equal(echo, msg) {
		t.Fatalf("echo of a %d-byte message: op %d, %d bytes, equal %v, %v", len(msg), op, len(echo), bytes.Equal(echo, msg), err)
	}
}

// A WebSocket through the proxy: the 101 passes, 1,000 messages go both
// ways byte for byte (sizes in each of the three length encodings), the
// close handshake ends it, and the connection is one record, api
// "upgrade", a success whose E2E is the connection's life.
func TestWebSocketEcho(t *testing.T) {
	echo := &wsEcho{}
	fs, sink := front(t, echo, Options{InjectUsage: true})
	conn, br := wsDial(t, fs.Listener.Addr().String())
	rng := mrand.New(mrand.NewPCG(20, 2))
	var sent [][]byte
	for i := range 1000 {
		n := rng.IntN(126)
		switch {
		case i%100 == 7:
			n = 70_000 + rng.IntN(1000) // 64-bit length
		case i%10 == 3:
			n = 126 + rng.IntN(4000) // 16-bit length
		}
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(rng.Uint32())
		}
		wsRoundTrip(t, conn, br, msg)
		sent = append(sent, msg)
	}
	if err := wsWrite(conn, wsClose, []byte{0x03, 0xe8}, []byte{9, 8, 7, 6}); err != nil {
		t.Fatal(err)
	}
	if op, _, err := wsRead(br); op != wsClose || err != nil {
		t.Fatalf("close: op %d, %v", op, err)
	}
	if _, err := br.ReadByte(); err != io.EOF { // the upstream closed first, and the proxy passed it on
		t.Fatalf("after the close frame: %v, want EOF", err)
	}
	conn.Close()
	r := only(t, sink)
	echo.mu.Lock()
	defer echo.mu.Unlock()
	if len(echo.received) != len(sent) {
		t.Fatalf("the upstream received %d messages, want %d", len(echo.received), len(sent))
	}
	for i := range sent {
		if !bytes.Equal(echo.received[i], sent[i]) {
			t.Fatalf("message %d differs upstream", i)
		}
	}
	e2e, _ := r.E2E()
	if r.API != stream.NameUpgrade || r.Outcome != record.Success || r.ErrorType != "" || r.HTTPStatus != 101 ||
		r.OutputTokens != -1 || r.TokenEvents() != 0 || r.UsageInjected || e2e <= 0 {
		t.Fatalf("record api=%s %s/%s status=%d out=%d events=%d e2e=%v", r.API, r.Outcome, r.ErrorType, r.HTTPStatus,
			r.OutputTokens, r.TokenEvents(), e2e)
	}
	t.Logf("1,000 messages (%d bytes) each way, identical; record %s/%s e2e %v", total(sent), r.API, r.Outcome, e2e)
}

func total(msgs [][]byte) (n int) {
	for _, m := range msgs {
		n += len(m)
	}
	return n
}

// How a spliced connection ends decides its outcome: the upstream
// breaking it is error/upstream_reset, the client breaking it is
// cancelled, and the shutdown cut is error/shutdown.
func TestWebSocketEnds(t *testing.T) {
	cases := []struct {
		name    string
		end     func(p *Proxy, conn net.Conn, br *bufio.Reader)
		outcome record.Outcome
		etype   string
	}{
		{"upstream resets", func(_ *Proxy, conn net.Conn, _ *bufio.Reader) {
			wsWrite(conn, wsBinary, []byte("reset"), []byte{1, 2, 3, 4})
		}, record.Error, record.ErrUpstreamReset},
		{"client resets", func(_ *Proxy, conn net.Conn, _ *bufio.Reader) {
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}, record.Cancelled, record.ErrCancelled},
		{"shutdown cut", func(p *Proxy, _ net.Conn, _ *bufio.Reader) {
			if n := p.Cut(); n != 1 {
				t.Errorf("cut %d, want 1", n)
			}
		}, record.Error, record.ErrShutdown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			us := httptest.NewServer(&wsEcho{})
			t.Cleanup(us.Close)
			u, _ := url.Parse(us.URL)
			var sink collect
			p, err := New(Options{Upstream: u, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&sink}})})
			if err != nil {
				t.Fatal(err)
			}
			fs := httptest.NewServer(p)
			t.Cleanup(fs.Close)
			conn, br := wsDial(t, fs.Listener.Addr().String())
			wsRoundTrip(t, conn, br, []byte("hello"))
			c.end(p, conn, br)
			io.Copy(io.Discard, br) // until the proxy closes the client's side
			if r := only(t, &sink); r.API != stream.NameUpgrade || r.Outcome != c.outcome || r.ErrorType != c.etype || r.HTTPStatus != 101 {
				t.Fatalf("record api=%s %s/%s status %d, want upgrade %s/%s", r.API, r.Outcome, r.ErrorType, r.HTTPStatus, c.outcome, c.etype)
			}
		})
	}
}

// An HTTP/2 prior-knowledge preface is refused with a 505 that says why,
// the connection is closed, nothing reaches the engine, and nothing is
// recorded: the next request is the only record.
func TestH2CPriorKnowledgeRefused(t *testing.T) {
	var hits atomic.Int64
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n", "data: [DONE]\n\n")(w, r)
	}), Options{})
	conn, err := net.Dial("tcp", fs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The preface and an empty SETTINGS frame (RFC 9113 §3.4).
	io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(string(body), "h2c") {
		t.Fatalf("preface answered %s %q, want 505 naming h2c", resp.Status, body)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}
	do(t, fs, "/v1/chat/completions", streamBody)
	if r := only(t, sink); r.API != stream.NameChat || r.Outcome != record.Success || hits.Load() != 1 {
		t.Fatalf("record api=%s outcome=%s, engine hits %d: the preface was forwarded or recorded", r.API, r.Outcome, hits.Load())
	}
}

// An h2c upgrade offer (curl --http2 on an http URL) is declined: an
// engine that would switch never sees it, and the request is served and
// measured as HTTP/1.1.
func TestH2CUpgradeDeclined(t *testing.T) {
	events := []string{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n", "data: [DONE]\n\n"}
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "h2c") { // an engine that speaks h2c takes the offer
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err == nil {
				brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
				brw.Flush()
				conn.Close()
			}
			return
		}
		sse(events...)(w, r)
	}), Options{})
	req, _ := http.NewRequest(http.MethodPost, fs.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Connection", "Upgrade, HTTP2-Settings")
	req.Header.Set("Upgrade", "h2c")
	req.Header.Set("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != strings.Join(events, "") {
		t.Fatalf("%s %q, want the stream", resp.Status, b)
	}
	if r := only(t, sink); r.API != stream.NameChat || r.Outcome != record.Success || r.OutputTokens != 1 {
		t.Fatalf("record api=%s outcome=%s tokens %d", r.API, r.Outcome, r.OutputTokens)
	}
}

// A 101 to a protocol the client did not ask for is not spliced: 502,
// and the upstream connection is closed.
func TestUpgradeMismatchRefused(t *testing.T) {
	fs, sink := front(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
		brw.Flush()
		io.Copy(io.Discard, brw) // until the proxy closes it
	}), Options{})
	conn, err := net.Dial("tcp", fs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%s, want 502", resp.Status)
	}
	if r := only(t, sink); r.Outcome != record.Error || r.HTTPStatus != 502 || r.API == stream.NameUpgrade {
		t.Fatalf("record api=%s %s/%s %d", r.API, r.Outcome, r.ErrorType, r.HTTPStatus)
	}
}

// Options.Timeout bounds a request that asks to switch protocols only
// until its 101: a session that outlives the timeout twice over
// (measured) still echoes, and ends a success; an upstream that has not
// switched when the timeout passes gets the client a 504, recorded as a
// timeout.
func TestWebSocketTimeoutOnlyUntilTheSwitch(t *testing.T) {
	const timeout = 500 * time.Millisecond // the switch itself fits in it on a busy machine
	t.Run("the session outlives it", func(t *testing.T) {
		fs, sink := front(t, &wsEcho{}, Options{Timeout: timeout})
		conn, br := wsDial(t, fs.Listener.Addr().String())
		switched := time.Now()
		wsRoundTrip(t, conn, br, []byte("first"))
		for time.Since(switched) < 2*timeout {
			time.Sleep(timeout / 4)
		}
		wsRoundTrip(t, conn, br, []byte("past the timeout"))
		wsWrite(conn, wsClose, []byte{0x03, 0xe8}, []byte{9, 8, 7, 6})
		io.Copy(io.Discard, br) // the close frame, then the upstream's end
		conn.Close()
		if r := only(t, sink); r.API != stream.NameUpgrade || r.Outcome != record.Success || r.HTTPStatus != 101 {
			t.Fatalf("record api=%s %s/%s status %d, want upgrade success 101", r.API, r.Outcome, r.ErrorType, r.HTTPStatus)
		}
	})
	t.Run("no switch before it", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		fs, sink := front(t, slow, Options{Timeout: timeout})
		conn, err := net.Dial("tcp", fs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: a2V5a2V5a2V5a2V5a2V5aw==\r\nSec-WebSocket-Version: 13\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("status %s, want 504", resp.Status)
		}
		if r := only(t, sink); r.Outcome != record.Timeout || r.ErrorType != record.ErrTimeout || r.HTTPStatus != 504 {
			t.Fatalf("record %s/%s status %d, want timeout/timeout 504", r.Outcome, r.ErrorType, r.HTTPStatus)
		}
	})
}
