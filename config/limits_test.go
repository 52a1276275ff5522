package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The request-body and admin-connection bounds (issue 40): their
// defaults, each from a file, the environment and a flag, and every bad
// value named.
func TestBodyAndAdminBounds(t *testing.T) {
	d := Defaults()
	if d.PeekBudget != 64<<20 || d.BodyMinRate != 1024 || d.AdminMaxConnections != 64 {
		t.Fatalf("defaults: peek_budget %d body_min_rate %d admin_max_connections %d; want 64 MiB, 1024, 64", d.PeekBudget, d.BodyMinRate, d.AdminMaxConnections)
	}
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("peek_budget: 8388608\nbody_min_rate: 512\nadmin_max_connections: 8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", file}, noEnv, io.Discard)
	if err != nil || c.PeekBudget != 8<<20 || c.BodyMinRate != 512 || c.AdminMaxConnections != 8 {
		t.Fatalf("from the file: %v; peek_budget %d body_min_rate %d admin_max_connections %d", err, c.PeekBudget, c.BodyMinRate, c.AdminMaxConnections)
	}
	c, err = Load([]string{"--config", file, "--admin-max-connections", "16", "--body-min-rate", "0"},
		envOf(map[string]string{"TOKENTAP_PEEK_BUDGET": "2097152"}), io.Discard)
	if err != nil || c.PeekBudget != 2<<20 || c.BodyMinRate != 0 || c.AdminMaxConnections != 16 {
		t.Fatalf("env and flags over the file: %v; peek_budget %d body_min_rate %d admin_max_connections %d", err, c.PeekBudget, c.BodyMinRate, c.AdminMaxConnections)
	}
	_, err = Load([]string{"--peek-budget", "1024", "--body-min-rate", "-1", "--admin-max-connections", "0"}, noEnv, io.Discard)
	want := []string{
		"peek_budget: must be at least peek_bytes (1048576), got 1024",
		"body_min_rate: must not be negative",
		"admin_max_connections: must be at least 1, got 0",
	}
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v does not name %q", err, w)
		}
	}
}
