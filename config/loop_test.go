package config

import (
	"io"
	"net/netip"
	"strings"
	"testing"
)

// The upstream naming the sidecar's own listener or admin port, through
// any alias of the same address, is a configuration error naming it;
// another port, or another address of a loopback listener, is not.
func TestUpstreamLoopRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" = no loop error
	}{
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://127.0.0.1:18080"},
			`upstream: "http://127.0.0.1:18080" is this sidecar's own listen address "127.0.0.1:18080": every request would be forwarded to itself`},
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://localhost:18080/v1"},
			`upstream: "http://localhost:18080/v1" is this sidecar's own listen address "127.0.0.1:18080": every request would be forwarded to itself`},
		{[]string{"--listen", "0.0.0.0:18080", "--upstream", "http://[::1]:18080"},
			`upstream: "http://[::1]:18080" is this sidecar's own listen address "0.0.0.0:18080": every request would be forwarded to itself`},
		{[]string{"--listen", ":18080", "--upstream", "http://127.0.0.1:18080"},
			`upstream: "http://127.0.0.1:18080" is this sidecar's own listen address ":18080": every request would be forwarded to itself`},
		{[]string{"--listen", "localhost:18080", "--upstream", "http://[::1]:18080"},
			`upstream: "http://[::1]:18080" is this sidecar's own listen address "localhost:18080": every request would be forwarded to itself`},
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://0.0.0.0:18080"},
			`upstream: "http://0.0.0.0:18080" is this sidecar's own listen address "127.0.0.1:18080": every request would be forwarded to itself`},
		{[]string{"--admin-listen", "127.0.0.1:19464", "--upstream", "http://user:secret@localhost:19464"},
			`upstream: "http://user:xxxxx@localhost:19464" is this sidecar's own admin_listen address "127.0.0.1:19464": every request would be forwarded to itself`},
		{[]string{"--listen", "127.0.0.1:80", "--upstream", "http://localhost"},
			`upstream: "http://localhost" is this sidecar's own listen address "127.0.0.1:80": every request would be forwarded to itself`},
		{[]string{"--egress-listen", "127.0.0.1:13128", "--upstream", "http://127.0.0.1:13128"},
			`upstream: "http://127.0.0.1:13128" is this sidecar's own egress.listen address "127.0.0.1:13128": every request would be forwarded to itself`},
		// Not loops.
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://127.0.0.1:18000"}, ""},
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://[::1]:18080"}, ""},
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "http://127.0.0.2:18080"}, ""},
		{[]string{"--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:0"}, ""},
		{[]string{"--listen", "127.0.0.1:18080", "--upstream", "https://127.0.0.1:443"}, ""},
	} {
		_, err := Load(c.args, noEnv, io.Discard)
		got := ""
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if strings.Contains(line, "forwarded to itself") {
					got = line
				}
			}
		}
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
}

// A probe's url naming the sidecar's own ports is refused, naming the
// probe and the way to probe through the sidecar.
func TestProbeURLLoopRefused(t *testing.T) {
	c := Defaults()
	c.Upstream = "http://127.0.0.1:8000"
	c.Probes.Probes = []ProbeDef{{Name: "self", URL: "http://localhost:8080"}, {Name: "admin", URL: "http://127.0.0.1:9464/v1"}, {Name: "ok", URL: "http://127.0.0.1:8000"}}
	var got []string
	for _, e := range c.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		`probe self: url "http://localhost:8080" is this sidecar's own listen address "127.0.0.1:8080" (a probe through the sidecar is target: sidecar)`,
		`probe admin: url "http://127.0.0.1:9464/v1" is this sidecar's own admin_listen address "127.0.0.1:9464" (a probe through the sidecar is target: sidecar)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A listener on an unspecified address takes every address of this host:
// an interface's address on its port is the same endpoint, another
// host's is not.
func TestSameEndpointInterfaces(t *testing.T) {
	local := func() []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::7")}
	}
	for _, c := range []struct {
		host, port, listen string
		want               bool
	}{
		{"10.1.2.3", "8080", "0.0.0.0:8080", true},
		{"fd00::7", "8080", "[::]:8080", true},
		{"[fd00::7]", "8080", ":8080", true},
		{"10.1.2.4", "8080", "0.0.0.0:8080", false},
		{"10.1.2.3", "8081", "0.0.0.0:8080", false},
		{"10.1.2.3", "8080", "10.1.2.3:8080", true},
		{"sidecar.example", "8080", "sidecar.example:8080", true},
		{"other.example", "8080", "sidecar.example:8080", false},
		{"::ffff:127.0.0.1", "8080", "127.0.0.1:8080", true},
	} {
		if got := sameEndpoint(c.host, c.port, c.listen, local); got != c.want {
			t.Errorf("%s port %s vs listener %s: %v, want %v", c.host, c.port, c.listen, got, c.want)
		}
	}
}
