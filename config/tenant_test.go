package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Off by default, and every problem of a bad tenant section is named.
func TestTenantSection(t *testing.T) {
	if Defaults().Tenant.On() {
		t.Fatal("tenants are on by default")
	}
	good := Tenant{From: "api_key", HashKey: "0123456789abcdef", MaxTenants: 3,
		Tenants: []DeclaredTenant{{Name: "acme", Match: []string{"t-0123456789ab"}}, {Name: "beta", Match: []string{"ABCDEF0123456789ffff"}}}}
	if errs := good.Validate(); len(errs) != 0 {
		t.Fatalf("valid section: %v", errs)
	}
	if errs := (Tenant{From: "header", Header: "X-Tenant", Tenants: []DeclaredTenant{{Name: "acme"}, {Name: "b", Match: []string{"beta", "b"}}}}).Validate(); len(errs) != 0 {
		t.Fatalf("valid header section: %v", errs)
	}
	bad := Tenant{From: "api_key", Header: "X-T", MaxTenants: 1, HashKey: "short",
		Tenants: []DeclaredTenant{{Name: "_other", Match: []string{"zz"}}, {Name: "t-0123456789ab"}, {Name: "ok", Match: []string{"0123456789abcdef"}}, {Name: "ok2", Match: []string{"0123456789abFFFF"}}}}
	want := []string{
		"tenant.header: only with from: header",
		"tenant.hash_key: at least 16 characters, got 5",
		"tenant.tenants: 4 declared, more than max_tenants 1",
		`tenant.tenants[0].name: "_other" must be`,
		`tenant.tenants[0].match: "zz" is not a key hash`,
		`tenant.tenants[1].name: "t-0123456789ab" has the form of an undeclared tenant's label`,
		"tenant.tenants[1].match: a key hash is required",
		`tenant.tenants[3].match: "0123456789abFFFF" also identifies "ok"`,
	}
	errs := bad.Validate()
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if len(errs) != len(want) {
		t.Fatalf("%d problems, want %d:\n%s", len(errs), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("problem %d: %q, want %q…", i, got[i], w)
		}
	}
	for _, c := range []struct {
		t    Tenant
		want string
	}{
		{Tenant{Header: "X-T"}, "tenant: settings given but tenant.from is empty"},
		{Tenant{From: "cookie"}, `tenant.from: must be header, api_key or empty, got "cookie"`},
		{Tenant{From: "header"}, "tenant.header: required with from: header"},
		{Tenant{From: "header", Header: "X T"}, `tenant.header: "X T" is not a header name`},
		{Tenant{From: "api_key", Tenants: []DeclaredTenant{{Name: "a", Match: []string{"0123456789ab"}}}}, "tenant: declared tenants match key hashes, which need a stable secret"},
		{Tenant{From: "header", Header: "X", MaxTenants: 201}, "tenant.max_tenants: must be in [1,200]"},
		{Tenant{From: "header", Header: "X", HashKeyFile: "/k", HashKey: "0123456789abcdef"}, "tenant: hash_key_file and hash_key both set"},
	} {
		errs := c.t.Validate()
		if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.t, errs, c.want)
		}
	}
}

// The section loads from a file, its secret from the environment.
func TestTenantFromFileAndEnv(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("tenant:\n  from: api_key\n  max_tenants: 5\n  tenants:\n    - name: acme\n      match: [0123456789ab]\n"), 0o644)
	c, err := Load([]string{"--config", f}, envOf(map[string]string{"TOKENTAP_TENANT_HASH_KEY": "a-secret-of-16-chars"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenant.From != "api_key" || c.Tenant.Max() != 5 || c.Tenant.HashKey != "a-secret-of-16-chars" || c.Tenant.Tenants[0].Name != "acme" {
		t.Fatalf("tenant section %+v", c.Tenant)
	}
}
