package gguf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// parsed is a GGUF file read back by an independent reader of the format
// (ggml's docs/gguf.md), written here from the spec, not from the writer.
type parsed struct {
	version uint32
	kv      map[string]any
	keys    []string
	tensors []parsedTensor
	dataOff int
	size    int
}

type parsedTensor struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
	data   []float32
}

func parse(t *testing.T, b []byte) *parsed {
	t.Helper()
	pos := 0
	need := func(n int) []byte {
		if pos+n > len(b) {
			t.Fatalf("truncated at %d (need %d more of %d)", pos, n, len(b))
		}
		s := b[pos : pos+n]
		pos += n
		return s
	}
	u32 := func() uint32 { return binary.LittleEndian.Uint32(need(4)) }
	u64 := func() uint64 { return binary.LittleEndian.Uint64(need(8)) }
	str := func() string { return string(need(int(u64()))) }
	var value func(typ uint32) any
	value = func(typ uint32) any {
		switch typ {
		case 4:
			return u32()
		case 5:
			return int32(u32())
		case 6:
			return math.Float32frombits(u32())
		case 7:
			v := need(1)[0]
			if v > 1 {
				t.Fatalf("bool byte %d", v)
			}
			return v == 1
		case 8:
			return str()
		case 9:
			et, n := u32(), u64()
			a := make([]any, n)
			for i := range a {
				a[i] = value(et)
			}
			return a
		}
		t.Fatalf("unexpected value type %d at %d", typ, pos)
		return nil
	}
	if string(need(4)) != "GGUF" {
		t.Fatal("no GGUF magic")
	}
	p := &parsed{kv: map[string]any{}}
	p.version = u32()
	nt, nkv := u64(), u64()
	for range nkv {
		k := str()
		if _, dup := p.kv[k]; dup {
			t.Fatalf("duplicate key %s", k)
		}
		p.kv[k] = value(u32())
		p.keys = append(p.keys, k)
	}
	for range nt {
		var pt parsedTensor
		pt.name = str()
		nd := u32()
		for range nd {
			pt.dims = append(pt.dims, u64())
		}
		pt.typ = u32()
		pt.offset = u64()
		p.tensors = append(p.tensors, pt)
	}
	p.dataOff = (pos + Alignment - 1) / Alignment * Alignment
	for i := pos; i < p.dataOff; i++ {
		if b[i] != 0 {
			t.Fatalf("padding byte %d is %d", i, b[i])
		}
	}
	for i := range p.tensors {
		pt := &p.tensors[i]
		if pt.offset%Alignment != 0 {
			t.Errorf("%s: offset %d not aligned", pt.name, pt.offset)
		}
		n := uint64(1)
		for _, d := range pt.dims {
			n *= d
		}
		start := p.dataOff + int(pt.offset)
		if start+int(4*n) > len(b) {
			t.Fatalf("%s: data [%d,%d) past the end %d", pt.name, start, start+int(4*n), len(b))
		}
		pt.data = make([]float32, n)
		for j := range pt.data {
			pt.data[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[start+4*j:]))
		}
		if i > 0 {
			prev := p.tensors[i-1]
			if pt.offset < prev.offset+4*uint64(len(prev.data)) {
				t.Errorf("%s overlaps %s", pt.name, prev.name)
			}
		}
	}
	p.size = len(b)
	return p
}

func write(t *testing.T, c Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, c); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func (p *parsed) tensor(t *testing.T, name string) parsedTensor {
	t.Helper()
	for _, x := range p.tensors {
		if x.name == name {
			return x
		}
	}
	t.Fatalf("no tensor %s", name)
	return parsedTensor{}
}

func TestLlamaFileIsWhatLlamaCppLoads(t *testing.T) {
	p := parse(t, write(t, Config{Seed: 1}))
	if p.version != 3 {
		t.Errorf("version %d, want 3", p.version)
	}
	wantKV := map[string]any{
		"general.architecture":                   "llama",
		"general.alignment":                      uint32(32),
		"general.file_type":                      uint32(0),
		"llama.context_length":                   uint32(4096),
		"llama.embedding_length":                 uint32(64),
		"llama.block_count":                      uint32(2),
		"llama.feed_forward_length":              uint32(128),
		"llama.attention.head_count":             uint32(4),
		"llama.attention.head_count_kv":          uint32(2),
		"llama.rope.dimension_count":             uint32(16),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.vocab_size":                       uint32(VocabSize),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.bos_token_id":            uint32(BOS),
		"tokenizer.ggml.eos_token_id":            uint32(EOS),
		"tokenizer.ggml.unknown_token_id":        uint32(UNK),
		"tokenizer.ggml.add_space_prefix":        false,
	}
	for k, want := range wantKV {
		if got := p.kv[k]; got != want {
			t.Errorf("%s = %#v, want %#v", k, got, want)
		}
	}
	toks, _ := p.kv["tokenizer.ggml.tokens"].([]any)
	types, _ := p.kv["tokenizer.ggml.token_type"].([]any)
	scores, _ := p.kv["tokenizer.ggml.scores"].([]any)
	if len(toks) != VocabSize || len(types) != VocabSize || len(scores) != VocabSize {
		t.Fatalf("vocabulary arrays: %d tokens, %d types, %d scores; want %d each", len(toks), len(types), len(scores), VocabSize)
	}
	if toks[UNK] != "<unk>" || toks[BOS] != "<s>" || toks[EOS] != "</s>" || types[UNK] != int32(2) || types[BOS] != int32(3) || types[EOS] != int32(3) {
		t.Errorf("control tokens: %v %v %v types %v %v %v", toks[0], toks[1], toks[2], types[0], types[1], types[2])
	}
	for b := range 256 {
		// llama.cpp's byte_to_token looks up exactly "<0x%02X>" (upper case).
		if want := fmt.Sprintf("<0x%02X>", b); toks[ByteBase+b] != want || types[ByteBase+b] != int32(6) {
			t.Fatalf("token %d = %v (type %v), want %s (type 6, BYTE)", ByteBase+b, toks[ByteBase+b], types[ByteBase+b], want)
		}
	}

	// The tensors llama.cpp's LLM_ARCH_LLAMA loader creates, with its shapes
	// (ne0 first): n_embd 64, head size 16, GQA dim 2*16, n_ff 128.
	want := map[string][]uint64{
		"token_embd.weight":  {64, VocabSize},
		"output_norm.weight": {64},
		"output.weight":      {64, VocabSize},
	}
	for i := range 2 {
		b := fmt.Sprintf("blk.%d.", i)
		want[b+"attn_norm.weight"] = []uint64{64}
		want[b+"attn_q.weight"] = []uint64{64, 64}
		want[b+"attn_k.weight"] = []uint64{64, 32}
		want[b+"attn_v.weight"] = []uint64{64, 32}
		want[b+"attn_output.weight"] = []uint64{64, 64}
		want[b+"ffn_norm.weight"] = []uint64{64}
		want[b+"ffn_gate.weight"] = []uint64{64, 128}
		want[b+"ffn_down.weight"] = []uint64{128, 64}
		want[b+"ffn_up.weight"] = []uint64{64, 128}
	}
	if len(p.tensors) != len(want) {
		t.Errorf("%d tensors, want %d", len(p.tensors), len(want))
	}
	for _, x := range p.tensors {
		w, ok := want[x.name]
		if !ok {
			t.Errorf("unexpected tensor %s", x.name)
			continue
		}
		if fmt.Sprint(x.dims) != fmt.Sprint(w) || x.typ != 0 {
			t.Errorf("%s: dims %v type %d, want %v type 0 (F32)", x.name, x.dims, x.typ, w)
		}
		for _, f := range x.data {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				t.Fatalf("%s: non-finite weight", x.name)
			}
		}
	}
	last := p.tensors[len(p.tensors)-1]
	if end := p.dataOff + int(last.offset) + (4*len(last.data)+Alignment-1)/Alignment*Alignment; end != p.size {
		t.Errorf("file is %d bytes, the last tensor ends (aligned) at %d", p.size, end)
	}
}

// The steering that makes a greedy decode emit only Config.Emit bytes and
// never end (see the package comment) is in the weights.
func TestSteering(t *testing.T) {
	emit := "xyz "
	p := parse(t, write(t, Config{Seed: 7, Emit: emit}))
	n := 64
	embd := p.tensor(t, "token_embd.weight").data
	for v := range VocabSize {
		if embd[v*n] != steerEmbed {
			t.Fatalf("token %d: embedding[0] = %v, want %v", v, embd[v*n], steerEmbed)
		}
	}
	for i := range 2 {
		for _, name := range []string{"attn_output.weight", "ffn_down.weight"} {
			x := p.tensor(t, fmt.Sprintf("blk.%d.%s", i, name))
			for j := range x.dims[0] {
				if x.data[j] != 0 {
					t.Fatalf("blk.%d.%s writes to dimension 0", i, name)
				}
			}
		}
	}
	out := p.tensor(t, "output.weight").data
	for v := range VocabSize {
		allowed := v >= ByteBase && strings.IndexByte(emit, byte(v-ByteBase)) >= 0
		if got := out[v*n]; (got == 0) != allowed || (!allowed && got != steerBlock) {
			t.Errorf("token %d (allowed %v): output[0] = %v", v, allowed, got)
		}
	}
	norm := p.tensor(t, "output_norm.weight").data
	if norm[0] <= 0 {
		t.Errorf("output_norm[0] = %v, want > 0", norm[0])
	}
}

func TestDeterministic(t *testing.T) {
	a, b := write(t, Config{Seed: 42}), write(t, Config{Seed: 42})
	if !bytes.Equal(a, b) {
		t.Fatal("two writes with one seed differ")
	}
	if c := write(t, Config{Seed: 43}); bytes.Equal(a, c) || len(a) != len(c) {
		t.Fatalf("seeds 42 and 43: equal %v, sizes %d %d", bytes.Equal(a, c), len(a), len(c))
	}
	// The bytes are pinned: a change here changes every test model.
	sum := sha256.Sum256(a)
	const golden = "6f831d655af90e34a9ad8fd48588513d2e3b75c698ba3af3be7f631f7d7a19aa"
	if got := hex.EncodeToString(sum[:]); got != golden {
		t.Errorf("seed 42: sha256 %s, want %s (%d bytes)", got, golden, len(a))
	}

	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteFile(path, Config{Seed: 42}); err != nil {
		t.Fatal(err)
	}
	if f, err := os.ReadFile(path); err != nil || !bytes.Equal(f, a) {
		t.Fatalf("WriteFile: %v, equal to Write: %v", err, bytes.Equal(f, a))
	}
}

// The generator is PCG-DXSM exactly as math/rand/v2's, kept in this
// package so that the weights do not depend on the Go release.
func TestRandIsPCG(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, math.MaxUint64} {
		mine, std := newRand(seed), rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)
		for i := range 1000 {
			if a, b := mine.next(), std.Uint64(); a != b {
				t.Fatalf("seed %d, output %d: %#x, math/rand/v2 %#x", seed, i, a, b)
			}
		}
	}
	r := newRand(3)
	for range 10000 {
		if u := r.uniform(); u < -1 || u >= 1 {
			t.Fatalf("uniform() = %v", u)
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Embedding: 60, Heads: 8}, "multiple of heads"},
		{Config{Heads: 4, KVHeads: 3}, "multiple of kv_heads"},
		{Config{Embedding: 12, Heads: 4}, "must be even"},
		{Config{Layers: -1}, "Layers must be at least 1"},
	} {
		err := Write(&bytes.Buffer{}, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.cfg, err, c.want)
		}
	}
}
