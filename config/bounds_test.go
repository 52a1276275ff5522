package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// writeFile writes content to a file in a test directory and returns
// its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadErr loads path and returns the error's text, failing if there was
// none.
func loadErr(t *testing.T, path string) string {
	t.Helper()
	_, err := Load([]string{"--config", path}, noEnv, io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	return err.Error()
}

// A file over MaxFileBytes is refused, naming the limit; one at the
// limit is read.
func TestConfigFileSizeLimit(t *testing.T) {
	body := "max_models: 7\n"
	pad := func(n int) string { // one comment line up to n bytes in all
		return body + "#" + strings.Repeat("x", n-len(body)-2) + "\n"
	}
	at := pad(MaxFileBytes)
	if len(at) != MaxFileBytes {
		t.Fatalf("built %d bytes", len(at))
	}
	c, err := Load([]string{"--config", writeFile(t, at)}, noEnv, io.Discard)
	if err != nil || c.MaxModels != 7 {
		t.Fatalf("a file of exactly %d bytes: %v, max_models %d", MaxFileBytes, err, c.MaxModels)
	}
	msg := loadErr(t, writeFile(t, pad(MaxFileBytes+1)))
	if !strings.Contains(msg, "larger than the limit of 1048576 bytes (1 MiB)") {
		t.Fatalf("error %q does not name the limit", msg)
	}
}

// aliasBomb returns a YAML document of about size bytes whose aliases
// name a 2 KiB string, about size/6 times: some hundreds of megabytes
// expanded.
func aliasBomb(size int) string {
	var b strings.Builder
	b.WriteString("models:\n  - &s \"" + strings.Repeat("lol", 700) + "\"\n")
	for b.Len() < size-8 {
		b.WriteString("  - *s\n")
	}
	return b.String()
}

// laughs is the classic "billion laughs": ten levels of ten aliases
// each, 10^9 copies of one string in a few hundred bytes.
func laughs() string {
	var b strings.Builder
	b.WriteString("slo:\n  objectives:\n    - name: lol\n      target: 0.9\n      thresholds: {ttft: 1s}\n      scope:\n        models: [&l0 lol]\n")
	b.WriteString("probes:\n  probes:\n    - name: laughs\n      headers:\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "        h%d: &l%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "*l%d", i-1)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

// Alias expansion is bounded: a document whose aliases expand it past
// MaxExpandedBytes is refused before it is decoded, naming the limit and
// the line, within a few megabytes of allocation.
func TestAliasExpansionBounded(t *testing.T) {
	for name, doc := range map[string]string{"1MB-fan-out": aliasBomb(MaxFileBytes), "billion-laughs": laughs()} {
		t.Run(name, func(t *testing.T) {
			p := writeFile(t, doc)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			msg := loadErr(t, p)
			runtime.ReadMemStats(&after)
			if !strings.Contains(msg, "with its aliases expanded, this node is larger than the limit of 4194304 bytes (4 MiB)") {
				t.Fatalf("error %q does not name the expansion limit", msg)
			}
			if !strings.Contains(msg, "line ") {
				t.Errorf("error %q does not name the line", msg)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d bytes of YAML refused after %.1f MB allocated: %s", len(doc), float64(alloc)/1e6, msg)
			if alloc > 100<<20 {
				t.Errorf("refusing it allocated %d MB", alloc>>20)
			}
		})
	}
}

// Aliases that stay small are decoded as before: shared thresholds.
func TestAliasesWithinBoundsDecode(t *testing.T) {
	doc := `slo:
  objectives:
    - name: a
      target: 0.9
      thresholds: &t {ttft: 1s, tpot: 50ms}
    - name: b
      target: 0.99
      thresholds: *t
`
	c, err := Load([]string{"--config", writeFile(t, doc)}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o := c.SLO.Objectives; len(o) != 2 || o[1].Thresholds != o[0].Thresholds || o[1].Thresholds.TPOT.Milliseconds() != 50 {
		t.Fatalf("objectives %+v", o)
	}
}

// An alias inside the node it names is refused, with its line.
func TestAliasCycleRefused(t *testing.T) {
	msg := loadErr(t, writeFile(t, "models: &m [a, *m]\n"))
	if !strings.Contains(msg, "line 1: alias *m is inside the node it names") {
		t.Fatalf("error %q", msg)
	}
}

// slos returns a config declaring n valid SLOs.
func slos(n int) string {
	var b strings.Builder
	b.WriteString("slo:\n  objectives:\n")
	for i := range n {
		fmt.Fprintf(&b, "    - {name: s%d, target: 0.9, thresholds: {ttft: 1s}}\n", i)
	}
	return b.String()
}

// More than MaxSLOs objectives are refused with one error naming the
// cap; MaxSLOs are accepted.
func TestSLOCap(t *testing.T) {
	if _, err := Load([]string{"--config", writeFile(t, slos(MaxSLOs))}, noEnv, io.Discard); err != nil {
		t.Fatalf("%d SLOs: %v", MaxSLOs, err)
	}
	msg := loadErr(t, writeFile(t, slos(10001)))
	if msg != "slo.objectives: at most 64 SLOs, got 10001 (each one costs on every request: records, /metrics, /slo)" {
		t.Fatalf("error %q", msg)
	}
}

// The models list and each SLO scope list are capped.
func TestListCaps(t *testing.T) {
	many := func(n int) string {
		l := make([]string, n)
		for i := range l {
			l[i] = fmt.Sprintf("m%d", i)
		}
		return "[" + strings.Join(l, ", ") + "]"
	}
	if _, err := Load([]string{"--config", writeFile(t, "models: "+many(MaxDeclaredModels)+"\n")}, noEnv, io.Discard); err != nil {
		t.Fatalf("%d models: %v", MaxDeclaredModels, err)
	}
	if msg := loadErr(t, writeFile(t, "models: "+many(MaxDeclaredModels+1)+"\n")); !strings.Contains(msg, "models: at most 100, got 101") {
		t.Errorf("error %q", msg)
	}
	doc := "slo:\n  objectives:\n    - {name: a, target: 0.9, thresholds: {ttft: 1s}, scope: {models: " + many(MaxScopeValues+1) + "}}\n"
	if msg := loadErr(t, writeFile(t, doc)); msg != "slo a: scope.models: at most 100 values, got 101" {
		t.Errorf("error %q", msg)
	}
}
