package main

import (
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// chunked frames body as a chunked HTTP/1.1 body, in chunks of size n at
// most, with its last chunk and, when trailer, a trailer.
func chunked(body []byte, n int, trailer bool) []byte {
	var b bytes.Buffer
	w := httputil.NewChunkedWriter(&b)
	for len(body) > 0 {
		k := min(n, len(body))
		w.Write(body[:k])
		body = body[k:]
	}
	w.Close() // "0\r\n"
	if trailer {
		b.WriteString("X-Trailer: 1\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// scanIn scans p in reads of the sizes cuts gives in turn and returns
// the offset just after the read that ended the body (-1: none), and
// whether a read failed.
func scanIn(p []byte, cuts []byte) (end int, failed bool) {
	var c chunkScan
	off := 0
	for k := 0; off < len(p); k++ {
		n := len(p) - off
		if len(cuts) > 0 {
			n = min(n, int(cuts[k%len(cuts)])%7+1)
		}
		done, err := c.scan(p[off : off+n])
		off += n
		if err != nil {
			return -1, true
		}
		if done {
			return off, false
		}
	}
	return -1, false
}

// TestChunkScanEnds: the scan ends a chunked body exactly at its last
// byte, however the reads cut it, with or without a trailer or an
// extension; a byte after the end, or framing that is not chunked, fails.
func TestChunkScanEnds(t *testing.T) {
	body := bytes.Repeat([]byte("data: {\"x\":1}\n\n"), 40)
	for _, trailer := range []bool{false, true} {
		p := chunked(body, 37, trailer)
		for _, cuts := range [][]byte{nil, {0}, {1, 5, 2}, {6}} {
			if end, failed := scanIn(p, cuts); end != len(p) || failed {
				t.Fatalf("trailer %v cuts %v: end %d failed %v, want %d", trailer, cuts, end, failed, len(p))
			}
		}
	}
	if ext := []byte("5;ext=1\r\nhello\r\n0\r\n\r\n"); func() bool { end, _ := scanIn(ext, nil); return end != len(ext) }() {
		t.Errorf("with an extension: the end not found")
	}
	for _, bad := range []string{"5\r\nhello\r\n0\r\n\r\nX", "5\r\nhelloXY", "z\r\n", "5\nhello", "1000000000000\r\n"} {
		if _, failed := scanIn([]byte(bad), nil); !failed {
			t.Errorf("%q: not failed", bad)
		}
	}
}

// FuzzChunkScan: whatever the bytes, the scan never panics, and gives
// the answer a scan byte by byte gives, however the reads cut them: the
// body ends at the same byte (a read that goes past it fails: bytes after
// the end), or fails at the same byte, or goes on. Where Go's own chunked
// reader reads a body to its last chunk and the final CRLF follows, the
// scan ends there too.
func FuzzChunkScan(f *testing.F) {
	f.Add(chunked([]byte("data: hi\n\n"), 4, false), []byte{3})
	f.Add(chunked([]byte("data: hi\n\n"), 64, true), []byte{1, 2})
	f.Add([]byte("5;a=b\r\nhello\r\n0\r\nT: v\r\n\r\n"), []byte{0})
	f.Add([]byte("fffffffffff\r\n"), []byte{})
	f.Add([]byte("\r\n\r\n0"), []byte("1"))
	f.Add([]byte("5 \r\nhello\r\n0\t;x\r\n\r\n"), []byte{2})
	f.Fuzz(func(t *testing.T, p []byte, cuts []byte) {
		one := make([]byte, len(p)) // reads of one byte each: cuts[k]%7+1 == 1
		for i := range one {
			one[i] = 7
		}
		ref, refFailed := scanIn(p, one)
		for _, c := range [][]byte{nil, cuts} {
			end, failed := scanIn(p, c)
			switch {
			case refFailed && !failed:
				t.Fatalf("%q cut by %v: ended at %d where one byte at a time fails", p, c, end)
			case ref >= 0 && end != ref && !failed:
				t.Fatalf("%q cut by %v: ended at %d, failed %v; one byte at a time ends at %d", p, c, end, failed, ref)
			case ref < 0 && !refFailed && (end >= 0 || failed):
				t.Fatalf("%q cut by %v: ended at %d, failed %v; one byte at a time goes on", p, c, end, failed)
			}
		}
		r := bytes.NewReader(p)
		if _, err := io.Copy(io.Discard, httputil.NewChunkedReader(r)); err != nil {
			return
		}
		if rest := p[len(p)-r.Len():]; !bytes.Equal(rest, []byte("\r\n")) { // after "0\r\n"
			return
		}
		if ref != len(p) || refFailed {
			t.Fatalf("%q: Go reads a whole body; the scan ends at %d (failed %v), want %d", p, ref, refFailed, len(p))
		}
	})
}
