//go:build unix

package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A configuration path that is not a regular file is refused, named,
// without being read: a FIFO with no writer (which would block open(2)
// forever), a character device, a directory. A symbolic link to a
// regular file (a Kubernetes ConfigMap's mount) is read.
func TestConfigFileMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "config.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "real.yaml")
	if err := os.WriteFile(real, []byte("max_models: 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "config file " + fifo + ": is a FIFO (named pipe), not a regular file"},
		{"/dev/null", "config file /dev/null: is a character device, not a regular file"},
		{dir, "config file " + dir + ": is a directory, not a regular file"},
	} {
		_, err := Load([]string{"--config", c.path}, noEnv, io.Discard)
		if err == nil || err.Error() != c.want {
			t.Errorf("--config %s: %v, want %q", c.path, err, c.want)
		}
	}
	cfg, err := Load([]string{"--config", link}, noEnv, io.Discard)
	if err != nil || cfg.MaxModels != 7 {
		t.Fatalf("--config through a symbolic link: %v, max_models %d", err, cfg.MaxModels)
	}
	// The same FIFO given through TOKENTAP_CONFIG.
	_, err = Load(nil, envOf(map[string]string{"TOKENTAP_CONFIG": fifo}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("TOKENTAP_CONFIG a FIFO: %v", err)
	}
}
