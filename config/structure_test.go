package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The structure section, read from a file: each value as written, and
// every problem named at once.
func TestStructureSection(t *testing.T) {
	dir := t.TempDir()
	write := func(yaml string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := Load([]string{"--config", write("structure:\n  default_draft: draft7\n  max_schema_bytes: 1024\n  max_schema_depth: 8\n  max_schema_keywords: 50\n  max_compile: 20ms\n")}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Structure{DefaultDraft: "draft7", MaxSchemaBytes: 1024, MaxSchemaDepth: 8, MaxSchemaKeywords: 50, MaxCompile: 20 * time.Millisecond}); c.Structure != want {
		t.Fatalf("structure %+v, want %+v", c.Structure, want)
	}
	_, err = Load([]string{"--config", write("structure:\n  default_draft: draft-07\n  max_schema_bytes: -1\n  max_schema_depth: 257\n  max_schema_keywords: 20001\n  max_compile: 11s\n")}, noEnv, io.Discard)
	want := []string{
		`structure.default_draft: must be one of draft4, draft6, draft7, draft2019, draft2020, got "draft-07"`,
		"structure.max_schema_bytes: must be between 0 (the default) and 4194304, got -1",
		"structure.max_schema_depth: must be between 0 (the default) and 256, got 257",
		"structure.max_schema_keywords: must be between 0 (the default) and 20000, got 20001",
		"structure.max_compile: must be between 0 (the default) and 10s, got 11s",
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Fatalf("errors:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}
