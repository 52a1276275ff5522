package upstream

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
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

// health is the health check's state: the path in use and the last
// result, which answers for a second (load balancers probe /readyz
// often; the engine should not feel it).
type health struct {
	auto    bool // the path is found (and found again when it goes)
	mu      sync.Mutex
	path    string // the health path in use; "" while auto has found none
	at      time.Time
	ok      bool
	why     string
	closing bool // shutting down: never ready again
}

// ShutDown makes the health check fail from now on ("shutting down"),
// so that load balancers stop sending while in-flight streams finish.
func (u *Upstream) ShutDown() {
	u.health.mu.Lock()
	u.health.closing = true
	u.health.mu.Unlock()
}

// announce says at startup which health check is used.
func (u *Upstream) announce() {
	if u.health.auto {
		u.log.Info("readiness: finding the engine's health endpoint", "tries", strings.Join(autoHealthPaths, ", "))
		return
	}
	u.log.Info("readiness: upstream health check", "url", u.url(u.health.path), "how", "upstream_health_path")
}

// Readiness is the /readyz handler: 200 when the engine answered its
// health check with a 2xx within 2 s and also (the canary probes; nil:
// nothing more) is ready, else 503; the body says why.
func (u *Upstream) Readiness(also interface{ Ready() (bool, string) }) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ok, why := u.check(u.round(req.Context()))
		if ok && also != nil {
			if pok, pwhy := also.Ready(); !pok {
				ok, why = false, pwhy
			}
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			why = "not ready: " + why
		}
		io.WriteString(w, why+"\n")
	})
}

// check is the health check, at most one a second: a check within the
// last second answers for this one.
func (u *Upstream) check(r *round) (bool, string) {
	h := &u.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false, "shutting down"
	}
	if !h.at.IsZero() && time.Since(h.at) < healthCache {
		return h.ok, h.why
	}
	h.ok, h.why = u.checkLocked(r)
	h.at = time.Now()
	if u.setUp != nil {
		u.setUp(h.ok)
	}
	return h.ok, h.why
}

// noRoute reports whether a status says the engine has no such route.
func noRoute(status int) bool {
	return status == http.StatusNotFound || status == http.StatusMethodNotAllowed || status == http.StatusNotImplemented
}

// oneLine is the start of a body, on one line.
func oneLine(b []byte) string {
	s := strings.Join(strings.Fields(string(b[:min(len(b), 200)])), " ")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func (u *Upstream) checkLocked(r *round) (bool, string) {
	h := &u.health
	if h.path == "" {
		return u.discover(r)
	}
	a := r.get(h.path, healthTimeout, healthBody)
	switch {
	case a.err != nil:
		return false, fmt.Sprintf("upstream unreachable: GET %s: %v", u.url(h.path), a.err)
	case h.auto && noRoute(a.status):
		// The engine changed under us (a restart into another one):
		// look again.
		u.log.Warn("readiness: the health endpoint is gone; looking for another", "path", h.path, "status", a.line)
		h.path = ""
		return u.discover(r)
	}
	return u.verdict(h.path, a)
}

// verdict reads a health check's answer.
func (u *Upstream) verdict(path string, a answer) (bool, string) {
	if a.status/100 != 2 {
		why := fmt.Sprintf("upstream not ready: GET %s answered %s", u.url(path), a.line)
		if b := oneLine(a.body); b != "" {
			why += ": " + b
		}
		return false, why
	}
	return true, "upstream ready (GET " + path + " answered " + a.line + ")"
}

// discover tries the candidate health paths in order and keeps the
// first route the engine has.
func (u *Upstream) discover(r *round) (bool, string) {
	var missing []string
	for _, p := range autoHealthPaths {
		a := r.get(p, healthTimeout, healthBody)
		if a.err != nil {
			return false, fmt.Sprintf("upstream unreachable: GET %s: %v", u.url(p), a.err)
		}
		if noRoute(a.status) {
			missing = append(missing, p+" "+a.line)
			continue
		}
		u.health.path = p
		u.log.Info("readiness: upstream health check found", "url", u.url(p), "status", a.line, "how", "auto")
		return u.verdict(p, a)
	}
	return false, "no health endpoint found on the upstream (" + strings.Join(missing, ", ") +
		"); set upstream_health_path to the engine's"
}
