package egress

import (
	"net"
	"sort"
	"strings"
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
