package upstream

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Every request of Client carries the sidecar's hop in Via (once, after
// the caller's), and the caller's request is not modified; an upstream
// that is the sidecar itself answers the health check 508, which the
// check reports as not ready, naming it.
func TestViaOnEveryRequest(t *testing.T) {
	var mu sync.Mutex
	var vias [][]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		vias = append(vias, r.Header.Values("Via"))
		mu.Unlock()
		w.WriteHeader(http.StatusLoopDetected)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	up := New(Options{URL: u, HealthPath: "/health", Via: "tokentap-0123"})
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	req.Header.Set("Via", "1.0 scraper")
	resp, err := up.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := req.Header.Values("Via"); len(got) != 1 {
		t.Fatalf("the caller's request was modified: Via %q", got)
	}
	ok, why := up.check(up.round(t.Context()))
	if ok || !strings.Contains(why, "answered 508 Loop Detected") {
		t.Fatalf("health check: %v %q", ok, why)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(vias) != 2 || strings.Join(vias[0], "|") != "1.0 scraper|1.1 tokentap-0123" || strings.Join(vias[1], "|") != "1.1 tokentap-0123" {
		t.Fatalf("Via seen: %q", vias)
	}
}
