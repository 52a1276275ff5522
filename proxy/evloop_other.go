//go:build !linux

package proxy

import (
	"net"
	"net/http"
)

// evloops is the event loop's stand-in on systems other than Linux: the
// loop carries nothing, and every stream takes net/http's path.
type evloops struct{}

func (*evloops) supported() bool { return false }

func (*evloops) streams() int64 { return 0 }

// loopRelay is never reached (directable is false): net/http's path takes
// the answer.
func (p *Proxy) loopRelay(*reqState, *http.Response, *directBody) error { return nil }

// quiet is never reached (no connection is kept idle without the loop).
func quiet(*net.TCPConn) bool { return false }
