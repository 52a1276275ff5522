package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCaptureValidate(t *testing.T) {
	if errs := (Capture{}).Validate(); len(errs) != 0 {
		t.Errorf("off: %v", errs)
	}
	if errs := (Capture{Meta: "inline"}).Validate(); len(errs) != 1 {
		t.Errorf("settings without a file: %v", errs)
	}
	dir := t.TempDir()
	ok := Capture{File: filepath.Join(dir, "c.jsonl"), SessionHeader: "X-Session-Id", Meta: "none", Settle: time.Second}
	if errs := ok.Validate(); len(errs) != 0 {
		t.Errorf("valid: %v", errs)
	}
	if got := ok.Secret(); got != filepath.Join(dir, ".tokentap-capture.key") {
		t.Errorf("default secret file %q", got)
	}
	os.WriteFile(ok.Secret(), []byte("00\n"), 0o644)
	if errs := ok.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "0600") {
		t.Errorf("a secret file others may read: %v", errs)
	}
	bad := Capture{File: filepath.Join(dir, "no", "c.jsonl"), BlockSize: -1, BytesPerToken: 100, SessionHeader: "authorization",
		Meta: "side", Queue: -1, Settle: time.Hour}
	errs := bad.Validate()
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"capture.file", "capture.secret_file", "capture.block_size", "capture.bytes_per_token", "capture.session_header", "capture.meta", "capture.queue", "capture.settle"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no error names %s:\n%s", want, joined)
		}
	}
}

func TestCaptureFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.jsonl")
	cfg, err := Load([]string{"--capture", path, "--capture.session-header", "X-Conversation"}, func(string) string { return "" }, new(strings.Builder))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Capture.File != path || cfg.Capture.SessionHeader != "X-Conversation" {
		t.Errorf("capture %+v", cfg.Capture)
	}
}
