//go:build linux

package faults

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawStatus sends head (a request's line, headers and body, as bytes on
// the wire) to the proxy at addr and returns the status it answers. The
// request is written on its own goroutine: a refused one may not be read
// to its end.
func rawStatus(t *testing.T, addr, head string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go io.WriteString(conn, head)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to a %d-byte request: %v", len(head), err)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// A request's line and headers are bounded (64 KiB): a 1 MB header,
// 10,000 headers and a 100 KB URI get a 431 and reach neither the engine
// nor the records; 60 KB of headers still pass.
func TestHeaderBound(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		streamTokens(w, r, 3, 0, "stop", true)
	})
	path := filepath.Join(t.TempDir(), "records.jsonl")
	s := startSidecar(t, "--upstream", up.URL, "--records", path)
	addr := strings.TrimPrefix(s.proxy, "http://")
	body := chatBody("m", true)
	request := func(target, headers string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			target, addr, headers, len(body), body)
	}
	var many strings.Builder
	for i := range 10_000 {
		fmt.Fprintf(&many, "X-H-%d: v\r\n", i)
	}
	refused := []struct{ name, head string }{
		{"a 1 MB header", request("/v1/chat/completions", "X-Big: "+strings.Repeat("a", 1<<20)+"\r\n")},
		{"10,000 headers", request("/v1/chat/completions", many.String())},
		{"a 100 KB URI", request("/v1/chat/completions?q="+strings.Repeat("a", 100_000), "")},
	}
	for _, c := range refused {
		if code := rawStatus(t, addr, c.head); code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: %d, want 431", c.name, code)
		}
	}
	if code := rawStatus(t, addr, request("/v1/chat/completions", "X-Fine: "+strings.Repeat("a", 60_000)+"\r\n")); code != 200 {
		t.Errorf("60 KB of headers: %d, want 200", code)
	}
	waitRecords(t, path, 1, 5*time.Second)
	if code := s.stop(); code != 0 {
		t.Errorf("exit status %d", code)
	}
	if n, rs := served.Load(), readRecords(t, path); n != 1 || len(rs) != 1 {
		t.Fatalf("the engine served %d requests and %d were recorded, want 1 and 1 (the refused ones reach neither)", n, len(rs))
	}
	t.Logf("1 MB header, 10,000 headers, 100 KB URI: 431; 60 KB of headers: 200; engine requests 1, records 1")
}
