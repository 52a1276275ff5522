package secret

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCreateThenLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "k")
	k1, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	b, _ := os.ReadFile(p)
	if st.Mode().Perm() != 0o600 || len(k1) != 64 || string(b) != string(k1)+"\n" {
		t.Errorf("generated: mode %v, key %q, file %q", st.Mode().Perm(), k1, b)
	}
	k2, err := Load(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Errorf("reloaded %q, %v", k2, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".k.new-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

// The rules: text trimmed, 32 to 4096 bytes; a regular file (a link to
// one is followed) that only its owner may use.
func TestRules(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("s", MinBytes)
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	link := filepath.Join(dir, "link")
	os.Symlink(write("target", good, 0o600), link)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path, want, err string
	}{
		{write("text", "  "+good+" \n", 0o600), good, ""},
		{write("passphrase", "correct horse battery staple, twice over\n", 0o400), "correct horse battery staple, twice over", ""},
		{link, good, ""},
		{write("short", strings.Repeat("s", MinBytes-1), 0o600), "", "holds 31 bytes of text; at least 32"},
		{write("long", strings.Repeat("s", MaxBytes+1), 0o600), "", "more than 4096 bytes"},
		{write("group", good, 0o640), "", "is mode 0640"},
		{write("others", good, 0o604), "", "chmod 600"},
		{dir, "", "not a regular file"},
		{fifo, "", "not a regular file"},
	}
	for _, c := range cases {
		k, err := Load(c.path)
		switch {
		case c.err == "" && (err != nil || string(k) != c.want):
			t.Errorf("%s: %q, %v; want %q", filepath.Base(c.path), k, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %q, %v; want an error containing %q", filepath.Base(c.path), k, err, c.err)
		}
	}
}

// Creation never goes through or over what is at the path: a dangling
// link there is refused (its target is not created), and no temporary
// file is left behind; a directory that cannot hold the file says so.
func TestCreateNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	dangling := filepath.Join(dir, "dangling")
	target := filepath.Join(dir, "nowhere")
	os.Symlink(target, dangling)
	if k, err := Load(dangling); err == nil {
		t.Errorf("a dangling link: %q", k)
	}
	if _, err := os.Lstat(target); err == nil {
		t.Error("the link's target was created")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
	if _, err := Load(filepath.Join(dir, "missing", "k")); err == nil || !strings.Contains(err.Error(), "creating") {
		t.Errorf("a missing directory: %v", err)
	}
}

// Install copies a secret whatever its source's mode (a Kubernetes
// Secret volume's file) into a 0600 file that Load accepts, replacing an
// older copy; a short or missing source is refused and writes nothing.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "mounted"), filepath.Join(dir, "run", "capture.key")
	os.Mkdir(filepath.Dir(dst), 0o700)
	os.WriteFile(src, []byte("  "+strings.Repeat("k", 40)+"\n"), 0o444)
	os.WriteFile(dst, []byte("an older key, replaced whole"), 0o600)
	if err := Install(src, dst); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(dst)
	k, err := Load(dst)
	if err != nil || string(k) != strings.Repeat("k", 40) || st.Mode().Perm() != 0o600 {
		t.Errorf("installed: %q %v, mode %v", k, err, st.Mode().Perm())
	}
	os.WriteFile(src, []byte("short"), 0o444)
	if err := Install(src, dst); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("a short secret: %v", err)
	}
	if err := Install(filepath.Join(dir, "missing"), filepath.Join(dir, "other")); err == nil {
		t.Error("a missing source installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); err == nil {
		t.Error("a failed install wrote its target")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "run", ".capture.key.new-*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
	if k, _ := Load(dst); string(k) != strings.Repeat("k", 40) {
		t.Errorf("a refused install changed the copy: %q", k)
	}
}
