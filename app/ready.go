package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
)

// HealthAuto is the upstream_health_path value that finds the engine's
// health endpoint (the default).
const HealthAuto = "auto"

// autoHealthPaths are tried in order when the health path is "auto":
// the first route the engine has (any answer but 404, 405 or 501) is its
// health check from then on. /health is vLLM's, SGLang's, TGI's and
// llama.cpp's; /v1/models answers on every OpenAI-compatible engine,
// Ollama included (its /health is a 404); /api/version is Ollama's
// native one, / its banner ("Ollama is running").
var autoHealthPaths = []string{"/health", "/v1/models", "/api/version", "/"}

// readiness answers /readyz by asking the upstream's health path, at most
// once a second (load balancers probe often; the engine should not feel
// it). 200 when the upstream answered 2xx within 2 s, else 503 with the
// reason.
type readiness struct {
	base    url.URL
	auto    bool
	client  *http.Client
	metrics *exporter.Metrics
	log     *slog.Logger
	probes  interface{ Ready() (bool, string) }
	mu      sync.Mutex
	path    string // the health path in use; "" while auto has found none
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

func newReadiness(up *url.URL, path string, m *exporter.Metrics, log *slog.Logger) *readiness {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &readiness{base: *up, client: &http.Client{Timeout: 2 * time.Second}, metrics: m, log: log}
	if path == "" || path == HealthAuto {
		r.auto = true
	} else {
		r.path = path
	}
	return r
}

func joinPath(a, b string) string {
	if len(a) > 0 && a[len(a)-1] == '/' {
		a = a[:len(a)-1]
	}
	return a + b
}

func (r *readiness) url(path string) string {
	u := r.base
	u.Path = joinPath(u.Path, path)
	return u.String()
}

// announce says at startup which health check /readyz uses.
func (r *readiness) announce() {
	if r.auto {
		r.log.Info("readiness: finding the engine's health endpoint", "tries", strings.Join(autoHealthPaths, ", "))
		return
	}
	r.log.Info("readiness: upstream health check", "url", config.Redacted(r.url(r.path)), "how", "upstream_health_path")
}

// probe is one GET of a health path.
type probeResult struct {
	err    error
	status int
	line   string // "404 Not Found"
	body   string // the start of the body, on one line
}

func (r *readiness) get(ctx context.Context, path string) probeResult {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url(path), nil)
	resp, err := r.client.Do(req)
	if err != nil {
		return probeResult{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return probeResult{status: resp.StatusCode, line: resp.Status, body: oneLine(string(b))}
}

// noRoute reports whether a status says the engine has no such route.
func noRoute(status int) bool {
	return status == http.StatusNotFound || status == http.StatusMethodNotAllowed || status == http.StatusNotImplemented
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
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
	r.ok, r.why = r.checkLocked(ctx)
	r.at = time.Now()
	r.metrics.SetUpstreamUp(r.ok)
	return r.ok, r.why
}

func (r *readiness) checkLocked(ctx context.Context) (bool, string) {
	if r.path == "" {
		return r.discover(ctx)
	}
	res := r.get(ctx, r.path)
	switch {
	case res.err != nil:
		return false, fmt.Sprintf("upstream unreachable: GET %s: %v", config.Redacted(r.url(r.path)), res.err)
	case r.auto && noRoute(res.status):
		// The engine changed under us (a restart into another one):
		// look again.
		r.log.Warn("readiness: the health endpoint is gone; looking for another", "path", r.path, "status", res.line)
		r.path = ""
		return r.discover(ctx)
	case res.status/100 != 2:
		why := fmt.Sprintf("upstream not ready: GET %s answered %s", config.Redacted(r.url(r.path)), res.line)
		if res.body != "" {
			why += ": " + res.body
		}
		return false, why
	}
	return true, "upstream ready (GET " + r.path + " answered " + res.line + ")"
}

// discover tries the candidate health paths in order and keeps the
// first route the engine has.
func (r *readiness) discover(ctx context.Context) (bool, string) {
	var missing []string
	for _, p := range autoHealthPaths {
		res := r.get(ctx, p)
		if res.err != nil {
			return false, fmt.Sprintf("upstream unreachable: GET %s: %v", config.Redacted(r.url(p)), res.err)
		}
		if noRoute(res.status) {
			missing = append(missing, p+" "+res.line)
			continue
		}
		r.path = p
		r.log.Info("readiness: upstream health check found", "url", config.Redacted(r.url(p)), "status", res.line, "how", "auto")
		if res.status/100 != 2 {
			why := fmt.Sprintf("upstream not ready: GET %s answered %s", config.Redacted(r.url(p)), res.line)
			if res.body != "" {
				why += ": " + res.body
			}
			return false, why
		}
		return true, "upstream ready (GET " + p + " answered " + res.line + ")"
	}
	return false, "no health endpoint found on the upstream (" + strings.Join(missing, ", ") +
		"); set upstream_health_path to the engine's"
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
		why = "not ready: " + why
	}
	io.WriteString(w, why+"\n")
}
