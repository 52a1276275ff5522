package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// loops returns one error per URL of the configuration that names one of
// the sidecar's own listeners (listen, admin_listen, egress.listen): the
// upstream, which would forward every request, the health poll's
// included, to itself; and each probe's url. A probe through the
// sidecar is target: sidecar. Two addresses are the same endpoint when
// their ports are equal and their hosts are: the same IP; localhost (or
// a name under .localhost) and a loopback IP, or two of those; a
// listener on an unspecified address (0.0.0.0, ::, or none) and any
// address of this host (loopback, an interface's, or unspecified, which
// a dial takes for this host). Names are not resolved: an alias this
// misses (the host's name, a DNS name of this pod) is caught at run time
// by the Via header (docs/config.md, "Loops").
func (c *Config) loops() []error {
	type own struct{ name, addr string }
	owns := []own{{"listen", c.Listen}, {"admin_listen", c.AdminListen}}
	if c.Egress.Listen != "" {
		owns = append(owns, own{"egress.listen", c.Egress.Listen})
	}
	ownOf := func(raw string) (own, bool) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return own{}, false // reported by Validate
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		for _, o := range owns {
			if sameEndpoint(u.Hostname(), port, o.addr, localAddrs) {
				return o, true
			}
		}
		return own{}, false
	}
	var errs []error
	if o, ok := ownOf(c.Upstream); ok && c.Upstream != "" {
		errs = append(errs, fmt.Errorf("upstream: %q is this sidecar's own %s address %q: every request would be forwarded to itself", Redacted(c.Upstream), o.name, o.addr))
	}
	for i, d := range c.Probes.Probes {
		name := d.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		if o, ok := ownOf(d.URL); ok && d.URL != "" {
			errs = append(errs, fmt.Errorf("probe %s: url %q is this sidecar's own %s address %q (a probe through the sidecar is target: sidecar)", name, d.URL, o.name, o.addr))
		}
	}
	return errs
}

// sameEndpoint says whether dialling host:port reaches the listener
// configured as listen (host:port). local lists this host's interface
// addresses (nil, nil when unknown).
func sameEndpoint(host, port, listen string, local func() []netip.Addr) bool {
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil || lport == "0" || port == "" || lport != port {
		return false // a port chosen at bind time cannot be named in advance
	}
	dial, dialOK := hostAddr(host)
	lis, lisOK := hostAddr(lhost)
	loopbackName := func(h string) bool {
		h = strings.TrimSuffix(strings.ToLower(h), ".")
		return h == "localhost" || strings.HasSuffix(h, ".localhost")
	}
	dialLoop := loopbackName(host) || (dialOK && dial.IsLoopback())
	switch {
	case lhost == "" || (lisOK && lis.IsUnspecified()):
		// Every address of this host.
		if dialLoop || (dialOK && dial.IsUnspecified()) {
			return true
		}
		if dialOK {
			for _, a := range local() {
				if a == dial {
					return true
				}
			}
		}
		return false
	case dialOK && dial.IsUnspecified():
		// Dialling 0.0.0.0 or :: reaches this host: any listener of it.
		return true
	case loopbackName(lhost) || (lisOK && lis.IsLoopback()):
		// localhost is 127.0.0.1 and ::1: alias of each loopback IP.
		if loopbackName(lhost) || loopbackName(host) {
			return dialLoop
		}
		return dialOK && dial == lis
	case dialOK && lisOK:
		return dial == lis
	}
	return strings.EqualFold(host, lhost)
}

// hostAddr parses a host that is an IP address (a bracketed IPv6 one, an
// IPv4-mapped one or one with a zone included).
func hostAddr(h string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// localAddrs lists this host's interface addresses, or none when they
// cannot be read.
func localAddrs() []netip.Addr {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ia := range ifas {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			out = append(out, p.Addr().Unmap().WithZone(""))
		}
	}
	return out
}
