package app

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/tokentap/tokentap/exporter"
)

// readiness answers /readyz by asking the upstream's health path, at most
// once a second (load balancers probe often; the engine should not feel
// it). 200 when the upstream answered 2xx within 2 s, else 503.
type readiness struct {
	url     string
	client  *http.Client
	metrics *exporter.Metrics
	probes  interface{ Ready() (bool, string) }
	mu      sync.Mutex
	at      time.Time
	ok      bool
	why     string
	closing bool // shutting down: never ready again
}

// shutDown makes /readyz answer 503 from now on, so that load balancers
// stop sending while in-flight streams finish.
func (r *readiness) shutDown() {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
}

func newReadiness(up *url.URL, path string, m *exporter.Metrics) *readiness {
	u := *up
	u.Path = joinPath(u.Path, path)
	return &readiness{url: u.String(), client: &http.Client{Timeout: 2 * time.Second}, metrics: m}
}

func joinPath(a, b string) string {
	if len(a) > 0 && a[len(a)-1] == '/' {
		a = a[:len(a)-1]
	}
	return a + b
}

func (r *readiness) check(ctx context.Context) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return false, "shutting down"
	}
	if time.Since(r.at) < time.Second && !r.at.IsZero() {
		return r.ok, r.why
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	resp, err := r.client.Do(req)
	switch {
	case err != nil:
		r.ok, r.why = false, "upstream unreachable: "+err.Error()
	case resp.StatusCode/100 != 2:
		r.ok, r.why = false, "upstream health answered "+resp.Status
	default:
		r.ok, r.why = true, "upstream ready"
	}
	if resp != nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
	}
	r.at = time.Now()
	r.metrics.SetUpstreamUp(r.ok)
	return r.ok, r.why
}

func (r *readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ok, why := r.check(req.Context())
	if ok && r.probes != nil {
		if pok, pwhy := r.probes.Ready(); !pok {
			ok, why = false, pwhy
		}
	}
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	io.WriteString(w, why+"\n")
}
