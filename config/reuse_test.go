package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/prefix"
)

func TestReuseOn(t *testing.T) {
	for _, c := range []struct {
		enabled string
		file    bool
		want    bool
	}{{"", false, false}, {"", true, true}, {"auto", true, true}, {"on", false, true}, {"off", true, false}} {
		if got := (Reuse{Enabled: c.enabled}).On(c.file); got != c.want {
			t.Errorf("enabled %q, file %v: on %v", c.enabled, c.file, got)
		}
	}
	o := Reuse{}.Options()
	if o.Window != time.Hour || len(o.Sizes) != 2 || o.Sizes[0] != 256 || o.Sizes[1] != 2048 || o.MaxIDs != prefix.DefaultMaxIDs {
		t.Errorf("defaults %+v", o)
	}
}

// Every problem of the reuse section is named, and with the reuse alone
// the capture's settings that shape the ids are read, those of the file
// refused.
func TestReuseValidate(t *testing.T) {
	join := func(errs []error) string {
		var s []string
		for _, e := range errs {
			s = append(s, e.Error())
		}
		return strings.Join(s, "\n")
	}
	load := func(yaml string) (Config, []error) {
		t.Helper()
		cfg := Defaults()
		if err := cfg.readFile(writeFile(t, yaml)); err != nil {
			t.Fatal(err)
		}
		return cfg, cfg.Validate()
	}
	cfg, errs := load("reuse:\n  enabled: on\n  window: 30m\n  cache_blocks: [4, 64]\ncapture:\n  block_size: 256\n  settle: 1s\n")
	if len(errs) != 0 || !cfg.Reuse.On(false) || cfg.Capture.Secret() != "" {
		t.Errorf("reuse alone: %v", join(errs))
	}
	dir := t.TempDir()
	if _, errs := load("reuse:\n  enabled: on\ncapture:\n  secret_file: " + filepath.Join(dir, "k") + "\n"); len(errs) != 0 {
		t.Errorf("reuse alone with a secret file to create: %v", join(errs))
	}
	_, errs = load("reuse:\n  enabled: maybe\n  window: -1s\n  cache_blocks: [0, 8, 8, 9, 10]\n  max_ids: -3\ncapture:\n  meta: none\n")
	all := join(errs)
	for _, want := range []string{"reuse.enabled", "reuse.window", "reuse.cache_blocks: at most 4", "reuse.cache_blocks[0]", "reuse.cache_blocks[2]: 8 is given twice", "reuse.max_ids", "reuse: settings given", "capture: settings given"} {
		if !strings.Contains(all, want) {
			t.Errorf("no error names %q:\n%s", want, all)
		}
	}
	_, errs = load("reuse:\n  enabled: on\n  cache_blocks: [4194304, 1]\n  max_ids: 16777216\ncapture:\n  session_header: X-S\n")
	all = join(errs)
	for _, want := range []string{"reuse.cache_blocks: at most 4194304 blocks together", "reuse.max_ids", "capture: session_header, meta, queue and max_ids given"} {
		if !strings.Contains(all, want) {
			t.Errorf("no error names %q:\n%s", want, all)
		}
	}
	if _, errs := load("reuse:\n  window: 2h\n"); len(errs) != 1 || !strings.Contains(errs[0].Error(), "reuse: settings given") {
		t.Errorf("settings while off: %v", join(errs))
	}
}
