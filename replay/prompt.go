package replay

import (
	"math/rand/v2"
	"strings"

	"github.com/tokentap/tokentap/workload"
)

// BytesPerToken is the replay's exchange rate between a trace's token
// counts and the text it synthesises: each token is one of the words
// of vocabulary, three letters and a space, which the BPE tokenizers of
// the common open models count as one token each (docs/capture.md,
// "The requests"), and which the built-in simulator counts at 4 bytes a
// token.
const BytesPerToken = 4

// ChatOverheadTokens is what a chat request adds to its text: the chat
// template's tokens around one message (the simulator counts 4, as
// OpenAI's counting guide does). A chat prompt of n tokens carries
// n − ChatOverheadTokens tokens of text.
const ChatOverheadTokens = 4

// DefaultBlockSize is the tokens one hash id stands for, as AIPerf's
// --isl-block-size and Mooncake's traces.
const DefaultBlockSize = 512

// vocabulary: 64 three-letter English words, each one token with its
// leading space in the tokenizers of Llama 3, Qwen 2, Mistral and GPT-4
// (cl100k, o200k); 6 bits a word, so two blocks' first ten words differ
// unless their ids are equal (a chance of 2⁻⁶⁰ otherwise).
var vocabulary = strings.Fields(`the and for are but not you all any can her was one our out day get has him his how
man new now old see two way who boy did its let put say she too use big car cat dog red run sun top box bed cup eat
far fun hat hot job key law leg map net oil pen pot raw`)

// prompts synthesises prompt text: block k of a prompt is the text of
// its k-th hash id, the same for every request that has that id in that
// place, so that an engine's prefix cache sees the trace's sharing; the
// tokens past the hash ids are the request's own. salt makes one run's
// text differ from another's, so that a step of --rates finds no prefix
// the step before it left in the cache that the trace does not share.
// The text is a function of (salt, id) alone, the same in every process:
// replays given the same --seed send the same text for the same hash id
// (docs/capture.md, "Several load generators").
type prompts struct {
	blockSize int
	salt      uint64
}

func newPrompts(blockSize int, salt uint64) *prompts {
	return &prompts{blockSize: blockSize, salt: salt}
}

// mix is SplitMix64's finaliser: a bijection of 64 bits in which every
// input bit changes every output bit with probability about one half.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// stepSalt is the salt of step i of a replay seeded with seed: each step
// its own, every process given the seed the same.
func stepSalt(seed uint64, i int) uint64 { return mix(seed ^ mix(uint64(i)+1)) }

// words appends n words drawn from the stream keyed by (kind, id, sub)
// and the salt.
func (p *prompts) words(b *strings.Builder, kind byte, id, sub int64, n int) {
	r := rand.New(rand.NewPCG(mix(mix(uint64(id))^uint64(kind)), mix(p.salt^mix(uint64(sub)))))
	for n > 0 {
		x := r.Uint64()
		for j := 0; j < 10 && n > 0; j++ { // ten 6-bit draws per number
			b.WriteByte(' ')
			b.WriteString(vocabulary[x&63])
			x >>= 6
			n--
		}
	}
}

// text returns the prompt of req: tokens tokens of words, its blocks
// (of blockSize tokens; 0: the replay's --block-size) shared by hash id,
// the rest its own, keyed by its line and its timestamp (so that two
// requests of a trace split over several files, which may have the same
// line number there, still differ).
func (p *prompts) text(req *workload.Request, tokens, blockSize int64) string {
	if tokens <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(int(tokens) * BytesPerToken)
	left := tokens
	for _, id := range req.HashIDs {
		if left <= 0 {
			break
		}
		if blockSize <= 0 {
			blockSize = int64(p.blockSize)
		}
		n := min(left, blockSize)
		p.words(&b, 'h', id, 0, int(n))
		left -= n
	}
	if left > 0 {
		p.words(&b, 'l', req.Line, req.Timestamp, int(left))
	}
	return b.String()[1:] // without the first word's space
}
