package app

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/internal/usage"
)

// --config.check prints the effective configuration (defaults, then
// environment, then flags), hides the upstream's password, and exits 0
// without starting anything.
func TestConfigCheckPrintsTheEffectiveConfiguration(t *testing.T) {
	var out, errw bytes.Buffer
	env := Env{Getenv: func(k string) string {
		if k == "TOKENTAP_MAX_MODELS" {
			return "7"
		}
		return ""
	}, Stdout: &out, Stderr: &errw}
	err := Run(context.Background(), []string{"--config.check", "--upstream", "http://admin:s3cret@127.0.0.1:8000", "--listen", "127.0.0.1:1"}, env)
	if err != nil {
		t.Fatalf("exit %v: %s", err, errw.String())
	}
	text := out.String()
	if strings.Contains(text, "s3cret") || strings.Contains(errw.String(), "s3cret") {
		t.Fatalf("the password was printed:\n%s", text)
	}
	if !strings.HasSuffix(text, "configuration OK\n") {
		t.Fatalf("no final OK line:\n%s", text)
	}
	var got config.Config
	if err := yaml.Unmarshal([]byte(strings.TrimSuffix(text, "configuration OK\n")), &got); err != nil {
		t.Fatalf("the printed configuration is not YAML: %v\n%s", err, text)
	}
	if got.MaxModels != 7 || got.Listen != "127.0.0.1:1" || got.Upstream != "http://admin:xxxxx@127.0.0.1:8000" ||
		got.Simulator.MaxBatch != config.SimulatorDefaults().MaxBatch {
		t.Fatalf("effective configuration %+v", got)
	}
}

// The tenant hash's secret is never printed; a key file that others may
// read is a usage error naming it (exit 2).
func TestTenantSecretHidden(t *testing.T) {
	var out, errw bytes.Buffer
	env := Env{Getenv: func(k string) string {
		if k == "TOKENTAP_TENANT_HASH_KEY" {
			return "a-very-secret-tenant-key"
		}
		return ""
	}, Stdout: &out, Stderr: &errw}
	if err := Run(context.Background(), []string{"--config.check", "--tenant.from", "api_key"}, env); err != nil {
		t.Fatalf("exit %v: %s", err, errw.String())
	}
	if strings.Contains(out.String()+errw.String(), "a-very-secret-tenant-key") || !strings.Contains(out.String(), "hash_key: xxxxx") {
		t.Fatalf("the secret was printed, or not hidden:\n%s", out.String())
	}
	key := filepath.Join(t.TempDir(), "tenant.key")
	os.WriteFile(key, []byte("0123456789abcdef0123\n"), 0o644)
	errw.Reset()
	err := Run(context.Background(), []string{"--tenant.from", "api_key", "--tenant.hash-key-file", key, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
		Env{Getenv: func(string) string { return "" }, Stdout: io.Discard, Stderr: &errw})
	if usage.ExitCode(err) != 2 || !strings.Contains(errw.String(), "chmod 600") {
		t.Fatalf("a world-readable key file: exit %d, %q", usage.ExitCode(err), errw.String())
	}
}
