package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEgressDefaultsOff(t *testing.T) {
	c, err := Load(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := c.Egress
	if e.Listen != "" || !e.InjectUsage || !e.Tunnel || !e.HTTP2 ||
		!slices.Equal(e.Intercept, []string{"api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com", "*.openai.azure.com"}) {
		t.Fatalf("defaults %+v", e)
	}
	if d := e.WithDefaults(); d.MaxTargets != 64 || d.LeafCache != 1024 || d.LeafValidity != 24*time.Hour {
		t.Fatalf("sizes %+v", d)
	}
}

// Flags, their environment twins and the file: the intercept list given
// anywhere replaces the default one.
func TestEgressFlagsEnvFile(t *testing.T) {
	c, err := Load([]string{"--egress-listen", "127.0.0.1:3128", "--egress-intercept", "api.openai.com, *.example.test",
		"--egress-ca-cert", "/tmp/c.pem", "--egress-ca-key", "/tmp/k.pem", "--egress-inject-usage=false"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := c.Egress
	if e.Listen != "127.0.0.1:3128" || e.CACert != "/tmp/c.pem" || e.CAKey != "/tmp/k.pem" || e.InjectUsage ||
		!slices.Equal(e.Intercept, []string{"api.openai.com", "*.example.test"}) {
		t.Fatalf("flags gave %+v", e)
	}
	c, err = Load(nil, envOf(map[string]string{"TOKENTAP_EGRESS_LISTEN": "127.0.0.1:3129", "TOKENTAP_EGRESS_INTERCEPT": "a.test"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Egress.Listen != "127.0.0.1:3129" || !slices.Equal(c.Egress.Intercept, []string{"a.test"}) {
		t.Fatalf("env gave %+v", c.Egress)
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("egress:\n  listen: 127.0.0.1:3130\n  intercept: [b.test]\n  tunnel: false\n  http2: false\n  max_targets: 3\n  leaf_validity: 2h\n"), 0o644)
	c, err = Load([]string{"--config", f}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Egress; e.Listen != "127.0.0.1:3130" || !slices.Equal(e.Intercept, []string{"b.test"}) || e.Tunnel || e.HTTP2 ||
		!e.InjectUsage || e.MaxTargets != 3 || e.LeafValidity != 2*time.Hour {
		t.Fatalf("file gave %+v", e)
	}
}

func TestEgressValidate(t *testing.T) {
	c := EgressDefaults()
	c.Listen = "3128"
	c.Intercept = []string{"api.openai.com:443", "*", "10.0.0.1", "ok.test", "OK.test", "https://x.test", "*.com", "-bad.test"}
	c.CACert = "/x.pem"
	c.MaxTargets = -1
	c.LeafValidity = time.Second
	var got []string
	for _, e := range c.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		`egress.listen: "3128" is not host:port`,
		`"api.openai.com:443" is not a host name`,
		`"*" is not a host name`,
		`"10.0.0.1" is an IP address`,
		`"OK.test" is listed twice`,
		`"https://x.test" is not a host name`,
		`"*.com": a wildcard needs a domain with at least two labels`,
		`"-bad.test" is not a host name`,
		"give both or neither",
		"egress.max_targets: must not be negative",
		"egress.leaf_validity: must be between 1m and 720h",
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no error says %q; got:\n%s", w, all)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(got), len(want), all)
	}
	ok := EgressDefaults()
	ok.Listen = "127.0.0.1:3128"
	if errs := ok.Validate(); len(errs) != 0 {
		t.Errorf("defaults with a listen address: %v", errs)
	}
	ok.Intercept = nil
	if errs := ok.Validate(); len(errs) != 1 {
		t.Errorf("an empty list with a listen address: %v", errs)
	}
}

// The allow-lists and the auth file: from the file and the flags; every
// bad entry named.
func TestEgressAllowListsAndAuth(t *testing.T) {
	c, err := Load([]string{"--egress-tunnel-allow", "github.com, *.pypi.org:8443", "--egress-internal-allow", "llm.internal,10.0.0.7",
		"--egress-auth-file", "/run/secrets/proxy"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e := c.Egress
	if !slices.Equal(e.TunnelAllow, []string{"github.com", "*.pypi.org:8443"}) || !slices.Equal(e.InternalAllow, []string{"llm.internal", "10.0.0.7"}) ||
		e.AuthFile != "/run/secrets/proxy" {
		t.Fatalf("flags gave %+v", e)
	}
	if d := EgressDefaults(); len(d.TunnelAllow) != 0 || len(d.InternalAllow) != 0 || d.AuthFile != "" {
		t.Fatalf("defaults are not closed: %+v", d)
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("egress:\n  tunnel_allow: [\"[fd00::7]:443\", \"::1\", 10.1.2.3:80]\n  internal_allow: [\"*.svc.cluster.local\"]\n  auth_file: /a\n"), 0o644)
	c, err = Load([]string{"--config", f}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Egress; !slices.Equal(e.TunnelAllow, []string{"[fd00::7]:443", "::1", "10.1.2.3:80"}) ||
		!slices.Equal(e.InternalAllow, []string{"*.svc.cluster.local"}) || e.AuthFile != "/a" {
		t.Fatalf("file gave %+v", e)
	}

	for _, tc := range []struct{ in, host, port string }{
		{"github.com", "github.com", "443"}, {"github.com:22", "github.com", "22"}, {"*.pypi.org:8443", "*.pypi.org", "8443"},
		{"10.0.0.1", "10.0.0.1", "443"}, {"10.0.0.1:80", "10.0.0.1", "80"}, {"::1", "::1", "443"}, {"[fd00::1]:8443", "fd00::1", "8443"},
	} {
		if h, p, err := SplitTunnelEntry(tc.in); err != nil || h != tc.host || p != tc.port {
			t.Errorf("SplitTunnelEntry(%q) = %q, %q, %v; want %q, %q", tc.in, h, p, err, tc.host, tc.port)
		}
	}

	bad := EgressDefaults()
	bad.TunnelAllow = []string{"ok.test", "a.test:0", "a.test:99999", "a.test:http", "https://a.test", "[::1]", "*", "a.test:443:1", "fe80::1%eth0"}
	bad.InternalAllow = []string{"ok.test", "10.0.0.0/8", "a.test:80", "*"}
	var got []string
	for _, e := range bad.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		`egress.tunnel_allow: "a.test:0": the port must be 1 to 65535`,
		`egress.tunnel_allow: "a.test:99999": the port must be 1 to 65535`,
		`egress.tunnel_allow: "a.test:http": the port must be 1 to 65535`,
		`egress.tunnel_allow: "https://a.test"`,
		`egress.tunnel_allow: "[::1]" is not host, host:port or an IP address`,
		`egress.tunnel_allow: "*" is not a host name`,
		`egress.tunnel_allow: "a.test:443:1" is not host, host:port or an IP address`,
		`egress.tunnel_allow: "fe80::1%eth0": an address with a zone is not allowed`,
		`egress.internal_allow: "10.0.0.0/8" is not a host name`,
		`egress.internal_allow: "a.test:80" is not a host name`,
		`egress.internal_allow: "*" is not a host name`,
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("no error says %q; got:\n%s", w, all)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(got), len(want), all)
	}
}

// Each allow-list is bounded: one entry over its bound is refused, naming
// the list, the count and the bound; at the bound it is accepted.
func TestEgressListBounds(t *testing.T) {
	hosts := func(n int, f string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf(f, i)
		}
		return out
	}
	at := EgressDefaults()
	at.Intercept = hosts(MaxInterceptHosts, "h%d.test")
	at.TunnelAllow = hosts(MaxTunnelEntries, "t%d.test:443")
	at.InternalAllow = hosts(MaxInternalEntries, "i%d.test")
	if errs := at.Validate(); len(errs) != 0 {
		t.Fatalf("lists at their bounds: %v", errs)
	}
	over := at
	over.Intercept = hosts(MaxInterceptHosts+1, "h%d.test")
	over.TunnelAllow = hosts(MaxTunnelEntries+1, "t%d.test:443")
	over.InternalAllow = hosts(MaxInternalEntries+1, "i%d.test")
	var got []string
	for _, e := range over.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		fmt.Sprintf("egress.intercept: %d hosts, at most %d", MaxInterceptHosts+1, MaxInterceptHosts),
		fmt.Sprintf("egress.tunnel_allow: %d entries, at most %d", MaxTunnelEntries+1, MaxTunnelEntries),
		fmt.Sprintf("egress.internal_allow: %d entries, at most %d", MaxInternalEntries+1, MaxInternalEntries),
	}
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d: %q", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("error %d = %q, want it to start %q", i, got[i], w)
		}
	}
}
