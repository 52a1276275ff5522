// Package chunked decodes an HTTP/1.1 chunked body (RFC 9112 §7.1) in
// place, read by read, for the proxy's event loop (proxy/evloop_linux.go),
// which reads an upstream's body with read(2) rather than through
// net/http, and for the peers benchmark's event-loop relay.
//
// It is strict where Go's own chunked reader (net/http/internal) is: a
// size line must have a hex digit and end in CRLF, a chunk's data must be
// followed by CRLF, and a size is at most 2^40. Extensions and trailers
// are read and dropped.
package chunked

import "errors"

// ErrMalformed is returned for framing that is not chunked, or bytes
// after the body's end.
var ErrMalformed = errors.New("malformed chunked body")

// maxSize bounds a chunk's size, as Go's reader does (1 TiB).
const maxSize = 1 << 40

// Decoder follows a chunked body across reads. Its zero value expects
// the body's first byte.
type Decoder struct {
	state  uint8
	digits bool // the size line has a digit
	size   int64
}

const (
	stSize      = iota // the chunk's size, in hex
	stExt              // a chunk extension, to the line's end
	stSizeLF           // the size line's LF
	stData             // size bytes of data
	stDataCR           // the CRLF after the data
	stDataLF           //
	stTrailer          // the start of a trailer line, or the final CRLF
	stTrailerLn        // a trailer line, to its LF
	stFinalLF          // the final LF
	stDone
)

// Done reports whether the body has ended.
func (d *Decoder) Done() bool { return d.state == stDone }

// Decode reads p, the body's next bytes, moves the data they carry to
// the front of p (the framing is dropped) and returns it, and reports
// whether the body ended with p's last byte. Bytes after the end, or
// framing that is not chunked, give ErrMalformed with the data decoded
// before them. It allocates nothing.
func (d *Decoder) Decode(p []byte) (data []byte, done bool, err error) {
	w := 0
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch d.state {
		case stSize:
			switch {
			case b >= '0' && b <= '9':
				d.size, d.digits = d.size<<4|int64(b-'0'), true
			case b >= 'a' && b <= 'f', b >= 'A' && b <= 'F':
				d.size, d.digits = d.size<<4|int64(b|0x20-'a'+10), true
			case (b == ';' || b == ' ' || b == '\t') && d.digits: // an extension, or whitespace before the CRLF (as Go reads it)
				d.state = stExt
			case b == '\r' && d.digits:
				d.state = stSizeLF
			default:
				return p[:w], false, ErrMalformed
			}
			if d.size > maxSize {
				return p[:w], false, ErrMalformed
			}
		case stExt:
			if b == '\r' {
				d.state = stSizeLF
			}
		case stSizeLF:
			if b != '\n' {
				return p[:w], false, ErrMalformed
			}
			d.state = stData
			if d.size == 0 {
				d.state = stTrailer
			}
		case stData:
			n := int(min(d.size, int64(len(p)-i)))
			w += copy(p[w:], p[i:i+n])
			i += n - 1
			if d.size -= int64(n); d.size == 0 {
				d.state = stDataCR
			}
		case stDataCR:
			if b != '\r' {
				return p[:w], false, ErrMalformed
			}
			d.state = stDataLF
		case stDataLF:
			if b != '\n' {
				return p[:w], false, ErrMalformed
			}
			d.state, d.digits = stSize, false
		case stTrailer:
			d.state = stTrailerLn
			if b == '\r' {
				d.state = stFinalLF
			}
		case stTrailerLn:
			if b == '\n' {
				d.state = stTrailer
			}
		case stFinalLF:
			if b != '\n' {
				return p[:w], false, ErrMalformed
			}
			d.state = stDone
		case stDone:
			return p[:w], true, ErrMalformed
		}
	}
	return p[:w], d.state == stDone, nil
}

// AppendChunk appends data framed as one chunk (nothing for empty data:
// an empty chunk would end the body).
func AppendChunk(dst, data []byte) []byte {
	if len(data) == 0 {
		return dst
	}
	const hex = "0123456789abcdef"
	var size [16]byte
	i := len(size)
	for n := len(data); n > 0; n >>= 4 {
		i--
		size[i] = hex[n&15]
	}
	dst = append(dst, size[i:]...)
	dst = append(dst, '\r', '\n')
	dst = append(dst, data...)
	return append(dst, '\r', '\n')
}
