package app

import (
	"log/slog"
	"time"
)

// hangupLogEvery is the least time between two SIGHUP lines.
const hangupLogEvery = time.Second

// hangups says in the log what SIGHUPs did: one line per signal, but at
// most one per hangupLogEvery; a line counts the signals since the
// previous one (signals) and how many reopens failed (failed, with the
// last error). The reopen itself runs on every signal. Used by Run's
// goroutine only.
type hangups struct {
	log    *slog.Logger
	clock  func() time.Time
	path   string
	what   string    // what is reopened; "" means "records file"
	next   time.Time // no line before
	n      int       // signals since the last line
	failed int       // of which reopens failed
	err    error     // the last failure
}

// reopened notes one SIGHUP's reopen and its error (nil: it worked).
func (h *hangups) reopened(err error) {
	h.n++
	if err != nil {
		h.failed, h.err = h.failed+1, err
	}
	now := h.clock()
	if now.Before(h.next) {
		return
	}
	what := h.what
	if what == "" {
		what = "records file"
	}
	if h.failed > 0 {
		h.log.Error("SIGHUP: reopening the "+what, "path", h.path, "signals", h.n, "failed", h.failed, "err", h.err)
	} else {
		h.log.Info("SIGHUP: "+what+" reopened", "path", h.path, "signals", h.n)
	}
	h.n, h.failed, h.err, h.next = 0, 0, nil, now.Add(hangupLogEvery)
}
