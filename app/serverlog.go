package app

import (
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverErrors builds the ErrorLog of the sidecar's HTTP servers. net/http
// writes there what it cannot return to anyone: failed accepts, malformed
// requests, panics in handlers. A failed accept ("http: Accept error: ...;
// retrying in 5ms") means the listener is not taking clients: most often
// the process is out of descriptors ("too many open files"), and every
// new client waits. Those are counted in tokentap_accept_errors_total by
// listener and reason, and logged at error level, at most once per
// acceptLogEvery with the count since the previous line. Every other
// line goes to the log at debug, as before.
type serverErrors struct {
	log   *slog.Logger
	count *prometheus.CounterVec
	clock func() time.Time
}

// acceptLogEvery is the least time between two accept-error lines of one
// listener.
const acceptLogEvery = 10 * time.Second

// Reasons of tokentap_accept_errors_total.
const (
	acceptEMFILE = "emfile" // too many open files (the process's descriptor limit)
	acceptENFILE = "enfile" // too many open files in system
	acceptOther  = "other"
)

// newServerErrors registers tokentap_accept_errors_total on reg, every
// listener's reasons at 0.
func newServerErrors(log *slog.Logger, reg prometheus.Registerer, listeners ...string) *serverErrors {
	e := &serverErrors{log: log, clock: time.Now,
		count: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokentap_accept_errors_total",
			Help: "Failed accepts of client connections, by listener and reason (emfile: out of descriptors; enfile: the system is; other); net/http retries after a pause, so new clients wait."},
			[]string{"listener", "reason"})}
	for _, l := range listeners {
		for _, r := range []string{acceptEMFILE, acceptENFILE, acceptOther} {
			e.count.WithLabelValues(l, r)
		}
	}
	reg.MustRegister(e.count)
	return e
}

// logger returns the ErrorLog of the server of listener.
func (e *serverErrors) logger(listener string) *log.Logger {
	return log.New(&serverLog{e: e, listener: listener}, "", 0)
}

// serverLog is one server's ErrorLog writer; log.Logger serialises its
// writes.
type serverLog struct {
	e        *serverErrors
	listener string
	mu       sync.Mutex
	next     time.Time // no accept-error line before
	since    int       // accept errors since the last line
}

func (w *serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	detail, ok := strings.CutPrefix(msg, "http: Accept error: ")
	if !ok {
		w.e.log.Debug(msg, "listener", w.listener)
		return len(p), nil
	}
	reason := acceptOther
	switch {
	case strings.Contains(detail, "too many open files in system"):
		reason = acceptENFILE
	case strings.Contains(detail, "too many open files"):
		reason = acceptEMFILE
	}
	w.e.count.WithLabelValues(w.listener, reason).Inc()
	now := w.e.clock()
	w.mu.Lock()
	w.since++
	n, due := w.since, !now.Before(w.next)
	if due {
		w.since, w.next = 0, now.Add(acceptLogEvery)
	}
	w.mu.Unlock()
	if due {
		w.e.log.Warn("accepting client connections fails; new clients wait (out of descriptors? raise ulimit -n, or lower --max-connections)",
			"listener", w.listener, "reason", reason, "errors", n, "error", detail)
	}
	return len(p), nil
}
