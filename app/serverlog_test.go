package app

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A failed accept (what net/http writes to its ErrorLog) is counted by
// listener and reason and logged at error level, at most once per 10 s
// with the count since the previous line; other server lines stay at
// debug, uncounted.
func TestServerErrorsCountAcceptErrors(t *testing.T) {
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	e := newServerErrors(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), reg, "proxy", "admin")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.clock = func() time.Time { return now }
	proxyLog := e.logger("proxy")
	for range 5 {
		proxyLog.Printf("http: Accept error: accept tcp 127.0.0.1:8080: accept4: too many open files; retrying in 5ms")
		now = now.Add(time.Second)
	}
	e.logger("admin").Printf("http: Accept error: accept tcp 127.0.0.1:9464: accept4: too many open files in system; retrying in 10ms")
	proxyLog.Printf("http: TLS handshake error from 127.0.0.1:5555: EOF")
	get := func(l, r string) float64 { return testutil.ToFloat64(e.count.WithLabelValues(l, r)) }
	if get("proxy", acceptEMFILE) != 5 || get("admin", acceptENFILE) != 1 || get("proxy", acceptOther) != 0 {
		t.Fatalf("counts proxy/emfile %v admin/enfile %v proxy/other %v; want 5, 1, 0", get("proxy", acceptEMFILE), get("admin", acceptENFILE), get("proxy", acceptOther))
	}
	count := func(sub string) int { return strings.Count(logs.String(), sub) }
	if count("level=WARN msg=\"accepting client connections fails") != 2 || !strings.Contains(logs.String(), "listener=proxy reason=emfile errors=1") ||
		!strings.Contains(logs.String(), "listener=admin reason=enfile errors=1") {
		t.Fatalf("want one error line per listener within 10 s:\n%s", logs.String())
	}
	if count("level=DEBUG") != 1 || !strings.Contains(logs.String(), "TLS handshake error") {
		t.Fatalf("other server lines stay at debug:\n%s", logs.String())
	}
	now = now.Add(10 * time.Second)
	proxyLog.Printf("http: Accept error: accept tcp 127.0.0.1:8080: accept4: too many open files; retrying in 5ms")
	if !strings.Contains(logs.String(), "listener=proxy reason=emfile errors=5") {
		t.Fatalf("the next line counts the 4 unlogged errors and itself:\n%s", logs.String())
	}
	if n, err := testutil.GatherAndCount(reg, "tokentap_accept_errors_total"); err != nil || n != 6 {
		t.Fatalf("%d series (%v), want 2 listeners × 3 reasons, present from the start", n, err)
	}
}
