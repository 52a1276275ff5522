// Package gguf writes a tiny random-weight llama model in the GGUF format,
// for tests that need a real inference engine (Ollama, llama.cpp) without
// downloading a model. Nothing is learned: the weights come from a seeded
// PCG generator, so the same Config always gives the same bytes.
//
// The file is what llama.cpp's loader expects of a "llama" model
// (src/llama-model.cpp, LLM_ARCH_LLAMA: token_embd, output_norm, output,
// and per block attn_norm, attn_q/k/v/output, ffn_norm, ffn_gate/down/up),
// in GGUF version 3 (ggml's docs/gguf.md): little-endian, every tensor F32
// and 32-byte aligned.
//
// The vocabulary is a sentencepiece ("llama") one made of byte-fallback
// tokens only: <unk>, <s>, </s>, then <0x00> … <0xFF>. Any text tokenizes
// (one token per byte), and every generated token decodes to one byte.
//
// Generation is steered, without training, so that a greedy (temperature
// 0) decode is useful to tests: it never ends early and it writes plain
// text. Dimension 0 of every token embedding is a positive constant, and no
// layer writes to it (row 0 of attn_output and ffn_down is zero), so after
// the final norm that dimension is positive at every position. The output
// row of every token outside Config.Emit has a large negative weight on
// that dimension: the control tokens (end of sequence included) and every
// byte not in Emit can never win an argmax. A greedy answer is therefore as
// long as the engine's token limit allows, one byte per token, each byte
// from Emit.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
)

// Token ids of the vocabulary.
const (
	UNK = 0 // <unk>
	BOS = 1 // <s>
	EOS = 2 // </s>
	// ByteBase is the id of <0x00>; byte b is token ByteBase+b.
	ByteBase = 3
	// VocabSize is the number of tokens: three control tokens and 256 bytes.
	VocabSize = ByteBase + 256
)

// Alignment is the GGUF alignment of the tensor data (general.alignment's
// default).
const Alignment = 32

// Config describes the model. Zero fields take the defaults noted.
type Config struct {
	Seed          uint64 // the PCG seed of every weight
	Name          string // general.name; default "tokentap-tiny"
	Embedding     int    // llama.embedding_length; default 64
	Layers        int    // llama.block_count; default 2
	Heads         int    // llama.attention.head_count; default 4
	KVHeads       int    // llama.attention.head_count_kv; default 2
	FeedForward   int    // llama.feed_forward_length; default 128
	ContextLength int    // llama.context_length; default 4096
	// Emit is the set of bytes a greedy decode can produce; default the
	// lowercase letters and the space.
	Emit string
}

// DefaultEmit is the default Config.Emit.
const DefaultEmit = "abcdefghijklmnopqrstuvwxyz "

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Embedding, 64)
	def(&c.Layers, 2)
	def(&c.Heads, 4)
	def(&c.KVHeads, 2)
	def(&c.FeedForward, 128)
	def(&c.ContextLength, 4096)
	if c.Name == "" {
		c.Name = "tokentap-tiny"
	}
	if c.Emit == "" {
		c.Emit = DefaultEmit
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"Embedding", c.Embedding}, {"Layers", c.Layers}, {"Heads", c.Heads}, {"KVHeads", c.KVHeads}, {"FeedForward", c.FeedForward}, {"ContextLength", c.ContextLength}} {
		if f.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", f.name, f.v))
		}
	}
	if c.Heads >= 1 && c.Embedding%c.Heads != 0 {
		errs = append(errs, fmt.Errorf("embedding (%d) must be a multiple of heads (%d)", c.Embedding, c.Heads))
	}
	if c.Heads >= 1 && c.KVHeads >= 1 && c.Heads%c.KVHeads != 0 {
		errs = append(errs, fmt.Errorf("heads (%d) must be a multiple of kv_heads (%d)", c.Heads, c.KVHeads))
	}
	if c.Heads >= 1 && c.Embedding%c.Heads == 0 && (c.Embedding/c.Heads)%2 != 0 {
		errs = append(errs, fmt.Errorf("the head size (%d) must be even for RoPE", c.Embedding/c.Heads))
	}
	return errors.Join(errs...)
}

// WriteFile writes the model to path.
func WriteFile(path string, c Config) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, c); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Write writes the model to w.
func Write(w io.Writer, c Config) error {
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	m := build(c)
	bw := bufio.NewWriter(w)
	if err := m.encode(bw); err != nil {
		return err
	}
	return bw.Flush()
}

// The steering constants (see the package comment).
const (
	steerEmbed = 4.0     // dimension 0 of every token embedding
	steerBlock = -1000.0 // dimension 0 of the output row of a token never emitted
	weightStd  = 0.5     // the half-width of the uniform random weights
)

// Vocabulary returns the token strings, scores and types
// (tokenizer.ggml.tokens, .scores, .token_type).
func Vocabulary() (tokens []string, scores []float32, types []int32) {
	tokens = make([]string, VocabSize)
	scores = make([]float32, VocabSize)
	types = make([]int32, VocabSize)
	tokens[UNK], types[UNK] = "<unk>", 2 // LLAMA_TOKEN_TYPE_UNKNOWN
	tokens[BOS], types[BOS] = "<s>", 3   // CONTROL
	tokens[EOS], types[EOS] = "</s>", 3
	for b := range 256 {
		tokens[ByteBase+b], types[ByteBase+b] = fmt.Sprintf("<0x%02X>", b), 6 // BYTE
	}
	return tokens, scores, types
}

type model struct {
	kv      []kv
	tensors []tensor
}

type kv struct {
	key string
	val any // uint32, float32, bool, string, []string, []float32, []int32
}

type tensor struct {
	name string
	dims []uint64 // ne0 first (the fastest-varying)
	data []float32
}

func build(c Config) *model {
	tokens, scores, types := Vocabulary()
	m := &model{kv: []kv{
		{"general.architecture", "llama"},
		{"general.name", c.Name},
		{"general.file_type", uint32(0)}, // LLAMA_FTYPE_ALL_F32
		{"general.alignment", uint32(Alignment)},
		{"llama.context_length", uint32(c.ContextLength)},
		{"llama.embedding_length", uint32(c.Embedding)},
		{"llama.block_count", uint32(c.Layers)},
		{"llama.feed_forward_length", uint32(c.FeedForward)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.KVHeads)},
		{"llama.rope.dimension_count", uint32(c.Embedding / c.Heads)},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.vocab_size", uint32(VocabSize)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.bos_token_id", uint32(BOS)},
		{"tokenizer.ggml.eos_token_id", uint32(EOS)},
		{"tokenizer.ggml.unknown_token_id", uint32(UNK)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
		{"tokenizer.ggml.add_space_prefix", false},
	}}

	r := newRand(c.Seed)
	n, ff := c.Embedding, c.FeedForward
	kvDim := c.KVHeads * (c.Embedding / c.Heads)
	random := func(size int) []float32 {
		d := make([]float32, size)
		for i := range d {
			d[i] = r.uniform() * weightStd
		}
		return d
	}
	ones := func(size int) []float32 {
		d := make([]float32, size)
		for i := range d {
			d[i] = 1
		}
		return d
	}
	// add appends a tensor with ggml dims (in, out): out rows of in values.
	add := func(name string, data []float32, dims ...uint64) {
		m.tensors = append(m.tensors, tensor{name: name, dims: dims, data: data})
	}
	zeroRow0 := func(d []float32, rowLen int) []float32 {
		clear(d[:rowLen])
		return d
	}

	embd := random(n * VocabSize)
	for v := range VocabSize {
		embd[v*n] = steerEmbed
	}
	add("token_embd.weight", embd, uint64(n), VocabSize)
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		add(p+"attn_norm.weight", ones(n), uint64(n))
		add(p+"attn_q.weight", random(n*n), uint64(n), uint64(n))
		add(p+"attn_k.weight", random(n*kvDim), uint64(n), uint64(kvDim))
		add(p+"attn_v.weight", random(n*kvDim), uint64(n), uint64(kvDim))
		add(p+"attn_output.weight", zeroRow0(random(n*n), n), uint64(n), uint64(n))
		add(p+"ffn_norm.weight", ones(n), uint64(n))
		add(p+"ffn_gate.weight", random(n*ff), uint64(n), uint64(ff))
		add(p+"ffn_down.weight", zeroRow0(random(ff*n), ff), uint64(ff), uint64(n))
		add(p+"ffn_up.weight", random(n*ff), uint64(n), uint64(ff))
	}
	add("output_norm.weight", ones(n), uint64(n))
	out := random(n * VocabSize)
	emit := [256]bool{}
	for _, b := range []byte(c.Emit) {
		emit[b] = true
	}
	for v := range VocabSize {
		out[v*n] = steerBlock
		if v >= ByteBase && emit[v-ByteBase] {
			out[v*n] = 0
		}
	}
	add("output.weight", out, uint64(n), VocabSize)
	return m
}

// GGUF value types (ggml's gguf.h).
const (
	typeUint32  = 4
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
	typeInt32   = 5
)

const ggmlTypeF32 = 0

type enc struct {
	w   io.Writer
	n   uint64
	err error
}

func (e *enc) bytes(b []byte) {
	if e.err != nil {
		return
	}
	k, err := e.w.Write(b)
	e.n += uint64(k)
	e.err = err
}

func (e *enc) u32(v uint32) { e.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *enc) u64(v uint64) { e.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.bytes([]byte(s)) }
func (e *enc) pad() {
	if r := e.n % Alignment; r != 0 {
		e.bytes(make([]byte, Alignment-r))
	}
}
func (e *enc) f32s(d []float32) {
	b := make([]byte, 0, 4*len(d))
	for _, f := range d {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	e.bytes(b)
}

func (m *model) encode(w io.Writer) error {
	e := &enc{w: w}
	e.bytes([]byte("GGUF"))
	e.u32(3)
	e.u64(uint64(len(m.tensors)))
	e.u64(uint64(len(m.kv)))
	for _, p := range m.kv {
		e.str(p.key)
		switch v := p.val.(type) {
		case uint32:
			e.u32(typeUint32)
			e.u32(v)
		case float32:
			e.u32(typeFloat32)
			e.u32(math.Float32bits(v))
		case bool:
			e.u32(typeBool)
			if v {
				e.bytes([]byte{1})
			} else {
				e.bytes([]byte{0})
			}
		case string:
			e.u32(typeString)
			e.str(v)
		case []string:
			e.u32(typeArray)
			e.u32(typeString)
			e.u64(uint64(len(v)))
			for _, s := range v {
				e.str(s)
			}
		case []float32:
			e.u32(typeArray)
			e.u32(typeFloat32)
			e.u64(uint64(len(v)))
			e.f32s(v)
		case []int32:
			e.u32(typeArray)
			e.u32(typeInt32)
			e.u64(uint64(len(v)))
			for _, x := range v {
				e.u32(uint32(x))
			}
		default:
			return fmt.Errorf("gguf: %s: unsupported value type %T", p.key, v)
		}
	}
	var off uint64
	for _, t := range m.tensors {
		e.str(t.name)
		e.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(d)
		}
		e.u32(ggmlTypeF32)
		e.u64(off)
		off += alignUp(4 * uint64(len(t.data)))
	}
	e.pad()
	for _, t := range m.tensors {
		e.f32s(t.data)
		e.pad()
	}
	return e.err
}

func alignUp(n uint64) uint64 { return (n + Alignment - 1) / Alignment * Alignment }

// rng is PCG-DXSM (as math/rand/v2's PCG, written out here so that the
// weights never change with the Go release: the package promises the
// same bytes for the same seed).
type rng struct{ hi, lo uint64 }

func newRand(seed uint64) *rng { return &rng{hi: seed, lo: seed ^ 0x9e3779b97f4a7c15} }

func (p *rng) next() uint64 {
	const (
		mulHi = 2549297995355413924
		mulLo = 4865540595714422341
		incHi = 6364136223846793005
		incLo = 1442695040888963407
	)
	// state = state * mul + inc (128-bit)
	hi, lo := bits.Mul64(p.lo, mulLo)
	hi += p.hi*mulLo + p.lo*mulHi
	lo, c := bits.Add64(lo, incLo, 0)
	hi, _ = bits.Add64(hi, incHi, c)
	p.lo, p.hi = lo, hi
	// DXSM output
	const cheapMul = 0xda942042e4dd58b5
	hi ^= hi >> 32
	hi *= cheapMul
	hi ^= hi >> (64 - 16)
	hi *= lo | 1
	return hi
}

// uniform returns a float32 in [-1, 1) from the top 24 bits.
func (p *rng) uniform() float32 {
	return float32(int64(p.next()>>40)-(1<<23)) / (1 << 23)
}
