package record

import (
	"strconv"
	"time"
)

// Upstream is how a request reached its upstream and how long the
// upstream took to begin its answer: the connection phases of
// docs/measurement.md §1 ("Connection phases"), from net/http/httptrace's
// hooks on the upstream request (package proxy). The zero value is a
// request that never reached the transport (Asked false): its record has
// no upstream object.
type Upstream struct {
	// Asked says the transport was asked for a connection (httptrace's
	// GetConn): the request reached it.
	Asked bool
	// Reused says the connection had carried a request before (a
	// kept-alive one); it means something only when ConnWait is known.
	Reused bool
	// Known has the bit (UpConnWait, ...) of each duration below that was
	// measured; a duration without its bit did not happen.
	Known uint8
	// ConnWait is the wait for a connection: from asking the transport
	// for one to having it (GetConn to GotConn). For a new connection it
	// includes DNS, Connect and TLS.
	ConnWait time.Duration
	// DNS, Connect and TLS are the new connection's set-up: the name
	// lookup, the TCP connect and the TLS handshake (each from its start
	// to its end, failed or not). None is known on a reused connection.
	DNS, Connect, TLS time.Duration
	// Server is from the request written whole (WroteRequest) to the
	// first byte of the response (GotFirstResponseByte): the upstream's
	// processing and the network's round trip.
	Server time.Duration
}

// Bits of Upstream.Known, in the order the phases are written.
const (
	UpConnWait uint8 = 1 << iota
	UpDNS
	UpConnect
	UpTLS
	UpServer
)

// UpstreamPhases names each phase: the record's "<name>_ms" member, the
// metrics' phase label and the span attribute's last part.
var UpstreamPhases = [...]struct {
	Bit  uint8
	Name string
}{
	{UpConnWait, "conn_wait"},
	{UpDNS, "dns"},
	{UpConnect, "connect"},
	{UpTLS, "tls"},
	{UpServer, "server"},
}

// Set records phase bit's duration.
func (u *Upstream) Set(bit uint8, d time.Duration) {
	*u.field(bit) = d
	u.Known |= bit
}

// Phase returns phase bit's duration; ok is false when it did not happen.
func (u *Upstream) Phase(bit uint8) (d time.Duration, ok bool) {
	return *u.field(bit), u.Known&bit != 0
}

func (u *Upstream) field(bit uint8) *time.Duration {
	switch bit {
	case UpConnWait:
		return &u.ConnWait
	case UpDNS:
		return &u.DNS
	case UpConnect:
		return &u.Connect
	case UpTLS:
		return &u.TLS
	}
	return &u.Server
}

// AppendJSON writes the upstream object of docs/records.md: reused (null
// when no connection was had) and every phase in milliseconds, null when
// it did not happen.
func (u *Upstream) AppendJSON(b []byte) []byte {
	b = append(b, `{"reused":`...)
	switch {
	case u.Known&UpConnWait == 0:
		b = append(b, "null"...)
	default:
		b = strconv.AppendBool(b, u.Reused)
	}
	for _, p := range UpstreamPhases {
		b = append(b, `,"`...)
		b = append(b, p.Name...)
		b = append(b, `_ms":`...)
		if d, ok := u.Phase(p.Bit); ok {
			b = strconv.AppendFloat(b, ms(d), 'f', -1, 64)
		} else {
			b = append(b, "null"...)
		}
	}
	return append(b, '}')
}

// MarshalJSON is AppendJSON's object (the canary's /probes page).
func (u Upstream) MarshalJSON() ([]byte, error) { return u.AppendJSON(nil), nil }
