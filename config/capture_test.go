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
		Meta: "side", Queue: -1, Settle: time.Hour, IDs: "cluster", Replica: "a\nb"}
	errs := bad.Validate()
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"capture.file", "capture.secret_file", "capture.block_size", "capture.bytes_per_token", "capture.session_header", "capture.meta", "capture.queue", "capture.settle", "capture.ids", "capture.replica"} {
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

// capture.ids: fleet needs the tokentap member, and only fleet lines
// name a replica; the replica defaults to POD_NAME, then the host name.
func TestCaptureFleet(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.jsonl")
	for _, c := range []struct {
		c    Capture
		want string
	}{
		{Capture{File: file, IDs: "fleet", Replica: "pod-a"}, ""},
		{Capture{File: file, IDs: "file"}, ""},
		{Capture{File: file, IDs: "fleet", Meta: "none"}, "capture.ids: fleet needs capture.meta inline"},
		{Capture{File: file, Replica: "pod-a"}, "capture.replica: given but capture.ids is not fleet"},
		{Capture{File: file, IDs: "fleet", Replica: strings.Repeat("x", 254)}, "capture.replica: at most 253 bytes"},
	} {
		errs := c.c.Validate()
		switch {
		case c.want == "" && len(errs) != 0:
			t.Errorf("%+v: %v", c.c, errs)
		case c.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want)):
			t.Errorf("%+v: %v, want %q", c.c, errs, c.want)
		}
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "POD_NAME" {
				return v
			}
			return ""
		}
	}
	host := func() (string, error) { return "node-1", nil }
	if got := (Capture{Replica: "r"}).ReplicaName(env("pod-b"), host); got != "r" {
		t.Errorf("set: %q", got)
	}
	if got := (Capture{}).ReplicaName(env("pod-b"), host); got != "pod-b" {
		t.Errorf("POD_NAME: %q", got)
	}
	if got := (Capture{}).ReplicaName(env(""), host); got != "node-1" {
		t.Errorf("host name: %q", got)
	}
	cfg, err := Load([]string{"--capture", file, "--capture.ids", "fleet", "--capture.secret-file", filepath.Join(filepath.Dir(file), "k")}, func(string) string { return "" }, new(strings.Builder))
	if err != nil || cfg.Capture.IDs != "fleet" || cfg.Capture.SecretFile != filepath.Join(filepath.Dir(file), "k") {
		t.Errorf("flags: %+v %v", cfg.Capture, err)
	}
}
