package simengine

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"testing"

	"github.com/tokentap/tokentap/capture"
	"github.com/tokentap/tokentap/stream"
)

// FuzzPrefixKeys: any body (whole, cut short, not JSON at all) gets its
// prompt's tokens and block keys without panicking, and they are those
// of the canonical prompt taken whole: ceil(bytes/4) tokens (at least
// 1), tokens/blockTokens keys (none without a prompt), key i the hash of key i−1 and bytes
// [i·B, (i+1)·B) (the last clipped), however Canonical cut its pieces.
// Seed corpus: testdata/fuzz/FuzzPrefixKeys.
func FuzzPrefixKeys(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there, how are you"}],"tools":[{"type":"function"}]}`), uint8(2), false)
	f.Add([]byte(`{"prompt":"`+"x y z "+`"}`), uint8(0), true)
	seed := maphash.MakeSeed()
	f.Fuzz(func(t *testing.T, body []byte, bt uint8, completions bool) {
		api := stream.Name(stream.NameChat)
		if completions {
			api = stream.NameCompletions
		}
		blockTokens := 1 + int(bt)%32
		tokens, keys := prefixKeys(seed, body, api, blockTokens, 1<<20)
		var c []byte
		capture.Canonical(body, api, func(p []byte) { c = append(c, p...) })
		if tokens != max(1, (len(c)+3)/4) {
			t.Fatalf("%d canonical bytes: %d tokens", len(c), tokens)
		}
		var want []uint64
		var prev [8]byte
		blocks := tokens / blockTokens
		if len(c) == 0 {
			blocks = 0 // no prompt read: no block
		}
		for i := range blocks {
			var h maphash.Hash
			h.SetSeed(seed)
			if i > 0 {
				h.Write(prev[:])
			}
			h.Write(c[i*blockTokens*4 : min((i+1)*blockTokens*4, len(c))])
			want = append(want, h.Sum64())
			binary.LittleEndian.PutUint64(prev[:], want[i])
		}
		if !slices.Equal(keys, want) {
			t.Fatalf("%q, %d tokens a block: keys %x, want %x", c, blockTokens, keys, want)
		}
	})
}
