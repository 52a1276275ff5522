package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The upstream object: absent when the request never reached the
// transport (so such records are as they were), present whenever it did,
// with every phase that did not happen null (never 0), and reused null
// when no connection was had.
func TestUpstreamJSON(t *testing.T) {
	decode := func(r *Record) map[string]any {
		t.Helper()
		b, err := r.MarshalJSON()
		if err != nil || !json.Valid(b) {
			t.Fatalf("invalid JSON (%v): %s", err, b)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		return m
	}
	base := time.Unix(1000, 0)
	r := New(0)
	r.Arrive, r.Outcome, r.Terminal = base, Cancelled, at(base, 1)
	if b, _ := r.MarshalJSON(); strings.Contains(string(b), "upstream") {
		t.Fatalf("a request that never reached the transport has an upstream object: %s", b)
	}

	// A new TLS connection: every phase but DNS (an IP address).
	r.Upstream = Upstream{Asked: true}
	r.Upstream.Set(UpConnWait, 24*msec)
	r.Upstream.Set(UpConnect, 3*msec)
	r.Upstream.Set(UpTLS, 20*msec+1500) // rounded to the microsecond
	r.Upstream.Set(UpServer, 240*msec)
	up, ok := decode(r)["upstream"].(map[string]any)
	want := map[string]any{"reused": false, "conn_wait_ms": 24.0, "dns_ms": nil, "connect_ms": 3.0, "tls_ms": 20.002, "server_ms": 240.0}
	if !ok || len(up) != len(want) {
		t.Fatalf("upstream %v, want %v", up, want)
	}
	for k, v := range want {
		if got, present := up[k]; !present || got != v {
			t.Errorf("upstream.%s = %v (present %v), want %v", k, got, present, v)
		}
	}

	// The dial failed: no connection, so reused is unknown; the failed
	// connect's time is kept.
	r.Upstream = Upstream{Asked: true}
	r.Upstream.Set(UpConnect, 5*time.Second)
	up = decode(r)["upstream"].(map[string]any)
	if up["reused"] != nil || up["conn_wait_ms"] != nil || up["connect_ms"] != 5000.0 || up["server_ms"] != nil {
		t.Errorf("failed dial: %v", up)
	}
	if d, ok := r.Upstream.Phase(UpTLS); ok || d != 0 {
		t.Errorf("TLS phase %v %v on a request without one", d, ok)
	}

	// Reset forgets it: a reused record starts without one.
	r.Reset()
	if r.Upstream != (Upstream{}) {
		t.Errorf("Reset kept %+v", r.Upstream)
	}
}
