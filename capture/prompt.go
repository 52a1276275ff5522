package capture

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"unsafe"

	"github.com/tokentap/tokentap/stream"
)

// A request's canonical prompt is the byte string the capture hashes
// (docs/capture.md, "hash_ids"): for each of its API's prompt members
// (stream.Request.Prompt: tools, system prompt, conversation, in the
// engine's order) that the body has, the member's name, a NUL, its JSON
// value with the whitespace outside strings removed, and a NUL. Two
// requests whose prompts start alike, however their clients spaced
// their JSON, have canonical prompts that start alike.

// maxPromptMembers bounds stream.Request.Prompt.
const maxPromptMembers = 8

// canonical feeds the canonical prompt of body, a request of the API
// whose prompt members are names, to w, in pieces; body may be a prefix
// of the request (the peek's), whose members complete within it are fed.
// It returns how many members it fed. It allocates nothing.
func canonical(body []byte, names []string, w func(p []byte)) int {
	var spans [maxPromptMembers][2]int
	found := 0
	stream.TopMembers(body, func(k []byte, s, e int) {
		for i, n := range names {
			if i < maxPromptMembers && string(k) == n {
				if spans[i][1] == 0 {
					found++
				}
				spans[i] = [2]int{s, e} // the last of duplicates, as decoders keep
			}
		}
	})
	sep := unsafeBytes("\x00")
	for i, n := range names {
		if i >= maxPromptMembers || spans[i][1] == 0 {
			continue
		}
		w(unsafeBytes(n))
		w(sep)
		compact(body[spans[i][0]:spans[i][1]], w)
		w(sep)
	}
	return found
}

// Canonical feeds the canonical prompt of body, a request of the API
// named api, to w, in pieces, and returns how many of its prompt members
// it fed (0 for an API without a prompt the capture reads): the bytes
// the capture cuts into blocks. The simulator's prefix cache cuts the
// same bytes (simengine), so that its blocks are the capture's. It
// allocates nothing.
func Canonical(body []byte, api stream.Name, w func(p []byte)) int {
	a := stream.LookupAPI(string(api))
	if a == nil {
		return 0
	}
	return canonical(body, a.Request.Prompt, w)
}

// unsafeBytes is s as bytes without a copy; callers only read them.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// compact feeds v to w without the JSON whitespace outside strings.
func compact(v []byte, w func(p []byte)) {
	in, esc, start := false, false, 0
	for i, c := range v {
		switch {
		case in:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				in = false
			}
		case c == '"':
			in = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if i > start {
				w(v[start:i])
			}
			start = i + 1
		}
	}
	if start < len(v) {
		w(v[start:])
	}
}

// digestBytes is the size of a block digest as the capture keeps it
// (SHA-256 truncated to 128 bits: collisions among 2^40 blocks have odds
// under 2^-48).
const digestBytes = 16

type digest = [digestBytes]byte

// chain cuts a byte string into blocks of a fixed size and gives each a
// keyed digest that depends on it and on every block before it:
// d(i) = HMAC-SHA256(secret, d(i-1) || block i), d(-1) the capture's
// seed. A chain is reused (pool); its methods allocate nothing once its
// digest slice has grown.
type chain struct {
	mac     hash.Hash
	block   int // bytes per block
	fill    int // bytes of the current block written
	prev    [sha256.Size]byte
	sum     [sha256.Size]byte
	tag     [5]byte // derive's
	last    digest  // ids': the previous block's id
	digests []digest
}

func newChain(secret []byte, block int) *chain {
	return &chain{mac: hmac.New(sha256.New, secret), block: block}
}

// reset starts a new string after seed.
func (c *chain) reset(seed [sha256.Size]byte) {
	c.prev, c.fill, c.digests = seed, 0, c.digests[:0]
	c.mac.Reset()
	c.mac.Write(c.prev[:])
}

// write hashes p, closing each block as it fills.
func (c *chain) write(p []byte) {
	for len(p) > 0 {
		n := min(len(p), c.block-c.fill)
		c.mac.Write(p[:n])
		c.fill += n
		p = p[n:]
		if c.fill == c.block {
			c.close()
		}
	}
}

// close ends the current block.
func (c *chain) close() {
	c.mac.Sum(c.sum[:0])
	c.prev = c.sum
	c.digests = append(c.digests, digest(c.sum[:digestBytes]))
	c.mac.Reset()
	c.mac.Write(c.prev[:])
	c.fill = 0
}

// finish closes a last, partial block.
func (c *chain) finish() {
	if c.fill > 0 {
		c.close()
	}
}

// derive returns HMAC(secret, prev || tag || n || nonce): the digest of a
// block past the string's end (tag 'p'), or of a last block whose token
// count is n (tag 'l').
func (c *chain) derive(prev []byte, tag byte, n uint32, nonce []byte) digest {
	c.mac.Reset()
	c.mac.Write(prev)
	c.tag[0] = tag
	binary.BigEndian.PutUint32(c.tag[1:], n)
	c.mac.Write(c.tag[:])
	c.mac.Write(nonce)
	c.mac.Sum(c.sum[:0])
	return digest(c.sum[:digestBytes])
}

// ids appends to dst the n block ids of a prompt of inputLength tokens in
// blocks of blockTokens, from the chain's digests: block i's id is the
// digest of byte block i, the blocks past the hashed bytes are derived
// from the one before (with nonce: the request's own when the prompt was
// not hashed whole, so that they match no other request's), and a last
// block of fewer than blockTokens tokens is marked with its count (a
// partial block is another block than the full one it starts).
func (c *chain) ids(dst []byte, inputLength int64, blockTokens int64, nonce []byte) []byte {
	n := (inputLength + blockTokens - 1) / blockTokens
	c.last = digest(c.prev[:digestBytes])
	for i := range n {
		if i < int64(len(c.digests)) {
			c.last = c.digests[i]
		} else {
			c.last = c.derive(c.last[:], 'p', uint32(i), nonce)
		}
		if i == n-1 && inputLength%blockTokens != 0 {
			d := c.derive(c.last[:], 'l', uint32(inputLength%blockTokens), nil)
			dst = append(dst, d[:]...)
			continue
		}
		dst = append(dst, c.last[:]...)
	}
	return dst
}
