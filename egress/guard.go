package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
)

// Refusal reasons: the values of tokentap_egress_refused_total's reason
// label (docs/egress.md#threat-model).
const (
	// reasonNotAllowed: the destination is on neither egress.intercept
	// nor egress.tunnel_allow (or tunnelling is off).
	reasonNotAllowed = "not_allowed"
	// reasonInternal: the destination resolves to an internal address
	// and its name is not on egress.internal_allow.
	reasonInternal = "internal"
	// reasonSelf: the destination is one of the sidecar's own listeners.
	reasonSelf = "self"
	// reasonAuth: proxy authentication is on and the request's
	// Proxy-Authorization is missing or wrong.
	reasonAuth = "auth"
	// reasonBadRequest: an authority over maxAuthority bytes, a CONNECT
	// without a port, or an absolute URL that is not http or https.
	reasonBadRequest = "bad_request"
)

var reasons = []string{reasonNotAllowed, reasonInternal, reasonSelf, reasonAuth, reasonBadRequest}

// refusal is the error of a destination the proxy will not connect to.
type refusal struct {
	reason string // one of reasons
	msg    string // for the client: never an address the name resolved to
}

func (r *refusal) Error() string { return r.msg }

// internalPrefixes are the address ranges refused beside those netip
// names (loopback, link-local, private, unspecified, multicast).
var internalPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),     // "this network" (RFC 1122): connecting to it reaches this host
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT (RFC 6598): often a cloud's or a VPN's internal network
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved, and the broadcast address 255.255.255.255
	netip.MustParsePrefix("fec0::/10"),     // IPv6 site-local (deprecated by RFC 3879, still routed inside some sites)
}

// nat64 is the well-known NAT64 prefix (RFC 6052): its last 32 bits are
// an IPv4 address, checked as that address.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// internal says whether a is an address the proxy refuses unless the
// destination's name is on egress.internal_allow.
func internal(a netip.Addr) bool {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() {
		return true
	}
	for _, p := range internalPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// guard resolves destinations and checks every address they resolve to,
// once, before anything is dialled: the address checked is the address
// dialled, so a name that resolves to another address on the next
// lookup (DNS rebinding) gains nothing.
type guard struct {
	internalAllow []pattern
	lookup        func(ctx context.Context, host string) ([]netip.Addr, error)
	// localAddrs lists this host's interface addresses, for a listener
	// on an unspecified address.
	localAddrs func() ([]netip.Addr, error)

	mu  sync.RWMutex
	own []netip.AddrPort // the sidecar's listeners
}

// addOwn adds listener addresses refused as destinations.
func (g *guard) addOwn(addrs ...net.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range addrs {
		if a == nil {
			continue
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			g.own = append(g.own, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
		}
	}
}

// isOwn says whether connecting to ap reaches one of the sidecar's
// listeners.
func (g *guard) isOwn(ap netip.AddrPort) bool {
	a := ap.Addr().Unmap().WithZone("")
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, o := range g.own {
		if o.Port() != ap.Port() {
			continue
		}
		// An unspecified destination reaches this host; a listener on an
		// unspecified address takes every address of this host.
		if o.Addr() == a || a.IsUnspecified() {
			return true
		}
		if o.Addr().IsUnspecified() && (a.IsLoopback() || g.isLocal(a)) {
			return true
		}
	}
	return false
}

func (g *guard) isLocal(a netip.Addr) bool {
	addrs, err := g.localAddrs()
	if err != nil {
		return true // unknown: refuse rather than risk the loop
	}
	for _, l := range addrs {
		if l.Unmap().WithZone("") == a {
			return true
		}
	}
	return false
}

// resolve returns the addresses of host:port when every one may be
// dialled: none is the sidecar's own listener, and none is internal
// unless host is on egress.internal_allow. It returns a *refusal when
// one may not, and the resolver's error when host does not resolve.
func (g *guard) resolve(ctx context.Context, host, port string) ([]netip.AddrPort, error) {
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil, &refusal{reasonBadRequest, fmt.Sprintf("%q is not a port", clip(port, 16))}
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = g.lookup(ctx, host); err != nil {
		return nil, err
	} else if len(addrs) == 0 {
		return nil, errors.New("no address")
	}
	internalOK := false
	for _, pt := range g.internalAllow {
		if pt.match(host) {
			internalOK = true
			break
		}
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), uint16(p))
		if g.isOwn(ap) {
			return nil, &refusal{reasonSelf, fmt.Sprintf("%q is this sidecar's own listener", clip(host, maxHost))}
		}
		if !internalOK && internal(a) {
			return nil, &refusal{reasonInternal, fmt.Sprintf("%q resolves to an internal address (loopback, link-local, private or reserved) and is not on egress.internal_allow", clip(host, maxHost))}
		}
		out = append(out, ap)
	}
	return out, nil
}

// localInterfaceAddrs lists the addresses of this host's interfaces.
func localInterfaceAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ia := range ifas {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}
