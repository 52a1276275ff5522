package config

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Egress is the egress section: a forward HTTPS proxy (HTTPS_PROXY) that
// measures hosted LLM APIs from the client's side (docs/egress.md).
// Requests to the hosts on Intercept are decrypted with a certificate
// minted from a local CA and pass through the same tap, record, SLO,
// metrics and spans as the reverse proxy; a CONNECT to a host:port on
// TunnelAllow is a blind tunnel; every other destination is refused.
//
// The zero value is not the default; start from EgressDefaults (Defaults
// does).
type Egress struct {
	// Listen is the forward proxy's address; "" (the default) turns
	// egress mode off.
	Listen string `yaml:"listen"`
	// Intercept is the allow-list of hosts whose traffic is decrypted
	// and measured: exact host names, or "*.example.com" for every host
	// under example.com (at any depth, not example.com itself). Matched
	// without the port. Each entry is also the metrics' target label, so
	// the label is bounded by this list.
	Intercept []string `yaml:"intercept"`
	// CACert and CAKey are the PEM files of the CA that signs the
	// certificates shown to clients. Both empty means
	// <user config dir>/tokentap/egress-ca.pem and egress-ca-key.pem.
	// Used if present; generated (ECDSA P-256, key file 0600) if both
	// are absent.
	CACert string `yaml:"ca_cert"`
	CAKey  string `yaml:"ca_key"`
	// InjectUsage asks OpenAI-style streams for usage when the client did
	// not, and removes it from the client's stream (as the reverse
	// proxy's inject_usage does). Default true.
	InjectUsage bool `yaml:"inject_usage"`
	// Tunnel passes CONNECTs (and plain-HTTP forward requests) to the
	// destinations on TunnelAllow through, blind (default true); false
	// refuses every destination not on Intercept, TunnelAllow or not.
	Tunnel bool `yaml:"tunnel"`
	// TunnelAllow is the allow-list of destinations tunnelled blind (or,
	// for plain-HTTP forward requests, forwarded untouched): "host",
	// "host:port", "*.example.com", "*.example.com:port", an IP address
	// ("10.0.0.7", "10.0.0.7:8443", "[fd00::7]:443"). An entry without a
	// port allows port 443 only. Empty (the default): nothing but the
	// intercepted hosts is reachable through the proxy.
	TunnelAllow []string `yaml:"tunnel_allow"`
	// InternalAllow names the destinations that may resolve to an
	// internal address: loopback, link-local (cloud metadata among
	// them), private (RFC 1918, fc00::/7), carrier-grade NAT
	// (100.64.0.0/10), unspecified, multicast or reserved. Host names,
	// "*.example.com" or IP addresses, no port; matched on the name the
	// client asked for. A destination must still be on Intercept or
	// TunnelAllow; the sidecar's own listeners are refused whatever this
	// says. Empty (the default): every internal address is refused.
	InternalAllow []string `yaml:"internal_allow"`
	// AuthFile turns on proxy authentication: a client must send
	// Proxy-Authorization: Basic with credentials from this file, one
	// per line, "user:password", or a token alone (a line without ':',
	// accepted as the password with any user name); blank lines and
	// lines starting with '#' are skipped. Read at start. Empty (the
	// default): no authentication.
	AuthFile string `yaml:"auth_file"`
	// HTTP2 offers HTTP/2 (ALPN h2) to clients inside intercepted
	// tunnels, beside HTTP/1.1. Default true.
	HTTP2 bool `yaml:"http2"`
	// MaxTargets bounds the distinct hosts measured at once (each has
	// its own upstream proxy); past it, idle ones are dropped first.
	// 0 means 64.
	MaxTargets int `yaml:"max_targets"`
	// LeafCache bounds the minted certificates kept; 0 means 1024.
	LeafCache int `yaml:"leaf_cache"`
	// LeafValidity is how long a minted certificate is valid; it is
	// re-minted when three quarters of that have passed. 0 means 24h.
	LeafValidity time.Duration `yaml:"leaf_validity"`
}

// Bounds on the egress allow-lists: each intercepted host is a target
// label value (and a matcher every CONNECT tries), each tunnel or
// internal entry a matcher; a list longer than these is refused at start
// (exit 2) rather than paid for on every CONNECT.
const (
	MaxInterceptHosts  = 100
	MaxTunnelEntries   = 1000
	MaxInternalEntries = 1000
)

// EgressDefaults returns the egress section before any file, env or flag.
func EgressDefaults() Egress {
	return Egress{
		Intercept:   stream.EgressHosts(),
		InjectUsage: true,
		Tunnel:      true,
		HTTP2:       true,
	}
}

// WithDefaults fills the zero sizes.
func (c Egress) WithDefaults() Egress {
	if c.MaxTargets == 0 {
		c.MaxTargets = 64
	}
	if c.LeafCache == 0 {
		c.LeafCache = 1024
	}
	if c.LeafValidity == 0 {
		c.LeafValidity = 24 * time.Hour
	}
	return c
}

// hostList is a comma-separated flag that replaces the list it is given.
type hostList struct{ l *[]string }

func (h hostList) String() string {
	if h.l == nil {
		return ""
	}
	return strings.Join(*h.l, ",")
}

func (h hostList) Set(v string) error {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	*h.l = out
	return nil
}

func (c *Egress) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "egress-listen", c.Listen, "egress mode: forward HTTPS proxy address (HTTPS_PROXY) that measures hosted APIs; empty = off")
	fs.StringVar(&c.CACert, "egress-ca-cert", c.CACert, "egress: CA certificate (PEM) for intercepted hosts; generated with the key if both are absent (empty: in the user config dir)")
	fs.StringVar(&c.CAKey, "egress-ca-key", c.CAKey, "egress: CA private key (PEM, mode 0600)")
	fs.Var(hostList{&c.Intercept}, "egress-intercept", "egress: comma-separated hosts to decrypt and measure (*.example.com for subdomains); others are refused unless on --egress-tunnel-allow")
	fs.BoolVar(&c.InjectUsage, "egress-inject-usage", c.InjectUsage, "egress: ask OpenAI-style streams for usage and strip it from the client's stream")
	fs.Var(hostList{&c.TunnelAllow}, "egress-tunnel-allow", "egress: comma-separated destinations tunnelled blind: host, host:port, *.example.com[:port], IP[:port] (no port = 443); others are refused")
	fs.Var(hostList{&c.InternalAllow}, "egress-internal-allow", "egress: comma-separated hosts (or IPs) that may resolve to loopback, link-local or private addresses")
	fs.StringVar(&c.AuthFile, "egress-auth-file", c.AuthFile, "egress: file of proxy credentials (user:password or token lines); clients must send Proxy-Authorization (empty: no authentication)")
}

// Validate returns one error per problem, naming the field.
func (c Egress) Validate() []error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(f, a...)) }
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			bad("egress.listen: %q is not host:port: %v", c.Listen, err)
		}
		if len(c.Intercept) == 0 {
			bad("egress.intercept: empty: nothing would be measured (every host would be tunnelled)")
		}
	}
	if n := len(c.Intercept); n > MaxInterceptHosts {
		bad("egress.intercept: %d hosts, at most %d (each is a target label value)", n, MaxInterceptHosts)
	}
	if n := len(c.TunnelAllow); n > MaxTunnelEntries {
		bad("egress.tunnel_allow: %d entries, at most %d", n, MaxTunnelEntries)
	}
	if n := len(c.InternalAllow); n > MaxInternalEntries {
		bad("egress.internal_allow: %d entries, at most %d", n, MaxInternalEntries)
	}
	seen := map[string]bool{}
	for _, h := range c.Intercept {
		if err := ValidInterceptHost(h); err != nil {
			bad("egress.intercept: %v", err)
			continue
		}
		k := strings.ToLower(h)
		if seen[k] {
			bad("egress.intercept: %q is listed twice", h)
		}
		seen[k] = true
	}
	for _, e := range c.TunnelAllow {
		if _, _, err := SplitTunnelEntry(e); err != nil {
			bad("egress.tunnel_allow: %v", err)
		}
	}
	for _, e := range c.InternalAllow {
		if err := ValidInternalEntry(e); err != nil {
			bad("egress.internal_allow: %v", err)
		}
	}
	if (c.CACert == "") != (c.CAKey == "") {
		bad("egress.ca_cert and egress.ca_key: give both or neither (got %q and %q)", c.CACert, c.CAKey)
	}
	if c.MaxTargets < 0 {
		bad("egress.max_targets: must not be negative")
	}
	if c.LeafCache < 0 {
		bad("egress.leaf_cache: must not be negative")
	}
	if c.LeafValidity != 0 && (c.LeafValidity < time.Minute || c.LeafValidity > 30*24*time.Hour) {
		bad("egress.leaf_validity: must be between 1m and 720h, got %v", c.LeafValidity)
	}
	return errs
}

// ValidInterceptHost checks one intercept entry: a DNS host name
// (letters, digits, hyphens, dots; no port, no IP address), optionally
// prefixed by "*." for every host under it.
func ValidInterceptHost(h string) error {
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%q is not a host name", h)
	}
	if net.ParseIP(name) != nil {
		return fmt.Errorf("%q is an IP address: list host names (the certificate is minted for the name the client asked for)", h)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q is not a host name", h)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("%q is not a host name (a port, a path or %q is not allowed)", h, string(r))
			}
		}
	}
	if strings.HasPrefix(h, "*.") && len(labels) < 2 {
		return fmt.Errorf("%q: a wildcard needs a domain with at least two labels", h)
	}
	return nil
}

// SplitTunnelEntry splits one tunnel_allow entry into its host pattern
// (a host name, "*.domain" or an IP address, as ValidInternalEntry
// accepts) and its port ("443" when the entry has none).
func SplitTunnelEntry(e string) (host, port string, err error) {
	host, port = e, "443"
	if _, perr := netip.ParseAddr(e); perr != nil { // a bare IPv6 address has colons and no port
		if h, p, serr := net.SplitHostPort(e); serr == nil {
			host, port = h, p
		} else if strings.Contains(e, ":") {
			return "", "", fmt.Errorf("%q is not host, host:port or an IP address", e)
		}
	}
	if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 || port[0] == '0' || port[0] == '+' {
		return "", "", fmt.Errorf("%q: the port must be 1 to 65535", e)
	}
	if err := ValidInternalEntry(host); err != nil {
		return "", "", err
	}
	return host, port, nil
}

// ValidInternalEntry checks one internal_allow entry: an IP address, or
// a host name as ValidInterceptHost accepts it.
func ValidInternalEntry(e string) error {
	if a, err := netip.ParseAddr(e); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("%q: an address with a zone is not allowed", e)
		}
		return nil
	}
	if err := ValidInterceptHost(e); err != nil {
		return fmt.Errorf("%q is not a host name, \"*.domain\" or an IP address", e)
	}
	return nil
}
