package chunked

import (
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// frame frames body as a chunked HTTP/1.1 body, in chunks of size n at
// most, with its last chunk and, when trailer, a trailer.
func frame(body []byte, n int, trailer bool) []byte {
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

// decodeIn decodes a copy of p in reads of the sizes cuts gives in turn
// and returns the data, the offset just after the read that ended the
// body (-1: none), and whether a read failed.
func decodeIn(p []byte, cuts []byte) (data []byte, end int, failed bool) {
	p = bytes.Clone(p)
	var d Decoder
	off := 0
	for k := 0; off < len(p); k++ {
		n := len(p) - off
		if len(cuts) > 0 {
			n = min(n, int(cuts[k%len(cuts)])%7+1)
		}
		got, done, err := d.Decode(p[off : off+n])
		data = append(data, got...)
		off += n
		if err != nil {
			return data, -1, true
		}
		if done {
			return data, off, false
		}
	}
	return data, -1, false
}

// TestDecodeEnds: the decoder gives the body's data and ends it exactly
// at its last byte, however the reads cut it, with or without a trailer
// or an extension; a byte after the end, or framing that is not chunked,
// fails.
func TestDecodeEnds(t *testing.T) {
	body := bytes.Repeat([]byte("data: {\"x\":1}\n\n"), 40)
	for _, trailer := range []bool{false, true} {
		p := frame(body, 37, trailer)
		for _, cuts := range [][]byte{nil, {0}, {1, 5, 2}, {6}} {
			data, end, failed := decodeIn(p, cuts)
			if end != len(p) || failed || !bytes.Equal(data, body) {
				t.Fatalf("trailer %v cuts %v: end %d failed %v, data equal %v, want end %d", trailer, cuts, end, failed, bytes.Equal(data, body), len(p))
			}
		}
	}
	if data, end, _ := decodeIn([]byte("5;ext=1\r\nhello\r\n0\r\n\r\n"), nil); end != 21 || string(data) != "hello" {
		t.Errorf("with an extension: end %d data %q", end, data)
	}
	for _, bad := range []string{"5\r\nhello\r\n0\r\n\r\nX", "5\r\nhelloXY", "z\r\n", "5\nhello", "1000000000000\r\n", "\r\n"} {
		if _, _, failed := decodeIn([]byte(bad), nil); !failed {
			t.Errorf("%q: not failed", bad)
		}
	}
}

// TestAppendChunk: what AppendChunk frames, Go's chunked reader reads
// back; empty data frames nothing.
func TestAppendChunk(t *testing.T) {
	var b []byte
	for _, s := range []string{"a", "", "data: {}\n\n", string(bytes.Repeat([]byte{'x'}, 4097))} {
		b = AppendChunk(b, []byte(s))
	}
	b = append(b, "0\r\n\r\n"...)
	got, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(b)))
	if want := "a" + "data: {}\n\n" + string(bytes.Repeat([]byte{'x'}, 4097)); err != nil || string(got) != want {
		t.Fatalf("read back %d bytes, err %v; want %d", len(got), err, len(want))
	}
	if n := testing.AllocsPerRun(100, func() { b = AppendChunk(b[:0], []byte("data: {}\n\n")) }); n != 0 {
		t.Errorf("AppendChunk allocates %.1f", n)
	}
}

// FuzzDecode: whatever the bytes, the decoder never panics, and gives
// what decoding byte by byte gives, however the reads cut them: the same
// data, and the body ends at the same byte (a read that goes past it
// fails: bytes after the end), or fails at the same byte, or goes on.
// Where Go's own chunked reader reads a body to its last chunk and the
// final CRLF follows, the decoder ends there too, with Go's data.
func FuzzDecode(f *testing.F) {
	f.Add(frame([]byte("data: hi\n\n"), 4, false), []byte{3})
	f.Add(frame([]byte("data: hi\n\n"), 64, true), []byte{1, 2})
	f.Add([]byte("5;a=b\r\nhello\r\n0\r\nT: v\r\n\r\n"), []byte{0})
	f.Add([]byte("fffffffffff\r\n"), []byte{})
	f.Add([]byte("\r\n\r\n0"), []byte("1"))
	f.Add([]byte("5 \r\nhello\r\n0\t;x\r\n\r\n"), []byte{2})
	f.Fuzz(func(t *testing.T, p []byte, cuts []byte) {
		one := bytes.Repeat([]byte{7}, len(p)) // reads of one byte each: cuts[k]%7+1 == 1
		refData, ref, refFailed := decodeIn(p, one)
		for _, c := range [][]byte{nil, cuts} {
			data, end, failed := decodeIn(p, c)
			switch {
			case refFailed && !failed:
				t.Fatalf("%q cut by %v: ended at %d where one byte at a time fails", p, c, end)
			case ref >= 0 && end != ref && !failed:
				t.Fatalf("%q cut by %v: ended at %d, failed %v; one byte at a time ends at %d", p, c, end, failed, ref)
			case ref < 0 && !refFailed && (end >= 0 || failed):
				t.Fatalf("%q cut by %v: ended at %d, failed %v; one byte at a time goes on", p, c, end, failed)
			case !failed && !bytes.Equal(data, refData):
				t.Fatalf("%q cut by %v: data %q, one byte at a time %q", p, c, data, refData)
			}
		}
		r := bytes.NewReader(p)
		goData, err := io.ReadAll(httputil.NewChunkedReader(r))
		if err != nil {
			return
		}
		if rest := p[len(p)-r.Len():]; !bytes.Equal(rest, []byte("\r\n")) { // after "0\r\n"
			return
		}
		if ref != len(p) || refFailed || !bytes.Equal(refData, goData) {
			t.Fatalf("%q: Go reads a whole body (%q); the decoder ends at %d (failed %v) with %q, want %d", p, goData, ref, refFailed, refData, len(p))
		}
	})
}
