package egress

import (
	"net"
	"net/netip"
	"sort"
	"strings"
	"unicode/utf8"
)

// matcher is the intercept allow-list: exact host names, and "*.domain"
// entries that match every host under domain (at any depth, not domain
// itself). A match names its entry, the bounded target label.
type matcher struct {
	exact    map[string]string
	suffixes []suffix // longest first: the most specific entry wins
}

type suffix struct{ dot, rule string } // dot is ".domain"

func newMatcher(entries []string) *matcher {
	m := &matcher{exact: map[string]string{}}
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSuffix(e, "."))
		if d, ok := strings.CutPrefix(e, "*."); ok {
			m.suffixes = append(m.suffixes, suffix{dot: "." + d, rule: e})
		} else {
			m.exact[e] = e
		}
	}
	sort.SliceStable(m.suffixes, func(i, j int) bool { return len(m.suffixes[i].dot) > len(m.suffixes[j].dot) })
	return m
}

// rule returns the entry that host (a name without port) matches.
func (m *matcher) rule(host string) (string, bool) {
	host = normalHost(host)
	if host == "" || net.ParseIP(host) != nil {
		return "", false
	}
	if r, ok := m.exact[host]; ok {
		return r, true
	}
	for _, s := range m.suffixes {
		if strings.HasSuffix(host, s.dot) {
			return s.rule, true
		}
	}
	return "", false
}

// normalHost lowercases a host name and drops a trailing dot.
func normalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// splitHostPort splits an authority ("host:port", "host", "[v6]:port")
// into its host name (normalised) and port ("" when none).
func splitHostPort(authority string) (host, port string) {
	h, p, err := net.SplitHostPort(authority)
	if err != nil {
		return normalHost(strings.Trim(authority, "[]")), ""
	}
	return normalHost(h), p
}

// targetAuthority is host[:port] with the scheme's default port left
// out, as a client's Host header says it.
func targetAuthority(scheme, host, port string) string {
	if port == "" || (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		return host
	}
	return net.JoinHostPort(host, port)
}

// pattern is one entry of egress.tunnel_allow or egress.internal_allow
// without its port: an exact host name, "*.domain" (every host under
// domain), or an IP address (matched only by that address written as an
// address, never by a name that resolves to it).
type pattern struct {
	exact  string     // a normalised host name, or ""
	suffix string     // ".domain", or ""
	ip     netip.Addr // the zero Addr unless the entry is an address
}

// newPattern parses an entry that config.ValidInternalEntry accepted.
func newPattern(e string) pattern {
	if a, err := netip.ParseAddr(e); err == nil {
		return pattern{ip: a.Unmap()}
	}
	e = normalHost(e)
	if d, ok := strings.CutPrefix(e, "*."); ok {
		return pattern{suffix: "." + d}
	}
	return pattern{exact: e}
}

// match says whether host (normalised, as splitHostPort returns it)
// matches the pattern.
func (pt pattern) match(host string) bool {
	if pt.ip.IsValid() {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == pt.ip
	}
	if pt.suffix != "" {
		return strings.HasSuffix(host, pt.suffix)
	}
	return host == pt.exact
}

// hostPort is one egress.tunnel_allow entry: a pattern and a port.
type hostPort struct {
	pattern
	port string
}

// allowed says whether host:port is on list.
func allowed(list []hostPort, host, port string) bool {
	for _, e := range list {
		if e.port == port && e.match(host) {
			return true
		}
	}
	return false
}

// clip cuts s to at most n bytes, on a UTF-8 character boundary, marking
// the cut with "...": a client's authority is echoed into answers and
// logs, and a bounded one only.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
