package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// countTenants counts its calls and names every request "acme".
type countTenants struct{ n atomic.Int64 }

func (c *countTenants) Identify(r *http.Request, api string) string {
	c.n.Add(1)
	return "acme"
}

// The tenant is identified once per request, at arrival, whatever the
// number of token events; the record carries the identity.
func TestTenantIdentifiedOncePerRequest(t *testing.T) {
	events := []string{}
	for range 50 {
		events = append(events, `data: {"choices":[{"delta":{"content":"a"}}]}`+"\n\n")
	}
	events = append(events, `data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
	c := &countTenants{}
	fs, sink := front(t, sse(events...), Options{Tenants: c})
	do(t, fs, "/v1/chat/completions", strings.Replace(streamBody, `"max_tokens":4`, `"max_tokens":60`, 1))
	r := only(t, sink)
	if r.TokenEvents() != 50 || r.Tenant != "acme" || c.n.Load() != 1 {
		t.Fatalf("%d token events, tenant %q, %d identifications; want 50, acme, 1", r.TokenEvents(), r.Tenant, c.n.Load())
	}
}
