package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The simulator's prefix cache: off by default with 512-token blocks,
// set in the file or by flag, and its bounds refused by name.
func TestSimulatorPrefixCache(t *testing.T) {
	c, err := Load(nil, noEnv, io.Discard)
	if err != nil || c.Simulator.PrefixCacheBlocks != 0 || c.Simulator.PrefixCacheBlockTokens != 512 {
		t.Fatalf("defaults: %+v %v", c.Simulator, err)
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("simulator:\n  prefix_cache_blocks: 64\n  prefix_cache_block_tokens: 16\n"), 0o600)
	if c, err = Load([]string{"--config", f}, noEnv, io.Discard); err != nil || c.Simulator.PrefixCacheBlocks != 64 || c.Simulator.PrefixCacheBlockTokens != 16 {
		t.Fatalf("file: %+v %v", c.Simulator, err)
	}
	if c, err = Load([]string{"--sim.prefix-cache-blocks", "8", "--sim.prefix-cache-block-tokens", "32"}, noEnv, io.Discard); err != nil ||
		c.Simulator.PrefixCacheBlocks != 8 || c.Simulator.PrefixCacheBlockTokens != 32 {
		t.Fatalf("flags: %+v %v", c.Simulator, err)
	}
	_, err = Load([]string{"--sim.prefix-cache-blocks", "-1", "--sim.prefix-cache-block-tokens", "2000000"}, noEnv, io.Discard)
	want := []string{"simulator.prefix_cache_blocks must be in [0,16777216] (0: off)", "simulator.prefix_cache_block_tokens must be in [0,1048576] (0: 512)"}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("bounds: %v, want\n%s", err, strings.Join(want, "\n"))
	}
}

// Chunked prefill: off (0) by default, set in the file or by flag, and
// a negative or huge chunk refused by name.
func TestSimulatorPrefillChunk(t *testing.T) {
	c, err := Load(nil, noEnv, io.Discard)
	if err != nil || c.Simulator.PrefillChunkTokens != 0 {
		t.Fatalf("default: %d %v", c.Simulator.PrefillChunkTokens, err)
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("simulator:\n  prefill_chunk_tokens: 2048\n"), 0o600)
	if c, err = Load([]string{"--config", f}, noEnv, io.Discard); err != nil || c.Simulator.PrefillChunkTokens != 2048 {
		t.Fatalf("file: %d %v", c.Simulator.PrefillChunkTokens, err)
	}
	if c, err = Load([]string{"--sim.prefill-chunk-tokens", "512"}, noEnv, io.Discard); err != nil || c.Simulator.PrefillChunkTokens != 512 {
		t.Fatalf("flag: %d %v", c.Simulator.PrefillChunkTokens, err)
	}
	for _, v := range []string{"-1", "16777217"} {
		_, err = Load([]string{"--sim.prefill-chunk-tokens", v}, noEnv, io.Discard)
		if want := "simulator.prefill_chunk_tokens must be in [0,16777216] (0: unchunked)"; err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %s", v, err, want)
		}
	}
}
