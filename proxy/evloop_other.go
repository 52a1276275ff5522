//go:build !linux

package proxy

import "net/http"

// evloops is the event loops' stand-in where there is no epoll: the loop
// carries nothing, and every stream takes net/http's path.
type evloops struct{}

func (*evloops) supported() bool { return false }

// loopRelay is never reached (directable is false): net/http's path takes
// the answer.
func (p *Proxy) loopRelay(*reqState, *http.Response, *directBody) error { return nil }
