package tracing

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/internal/testtool"
)

// One line per kind of error per 30 s: the digits of an error do not make
// a new kind, the next line after the window says how many were held
// back, another kind has its own line; every error is counted.
func TestErrorLogRateLimit(t *testing.T) {
	var buf bytes.Buffer
	clock := testtool.NewClock(time.Unix(1000, 0))
	count := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
	e := &errorLog{log: slog.New(slog.NewJSONHandler(&buf, nil)), count: count, now: clock.Now, kinds: map[string]*errorKind{}}
	e.Handle(errors.New("traces export: 42 spans refused"))
	clock.Set(time.Second)
	e.Handle(errors.New("traces export: 7 spans refused"))
	e.Handle(errors.New("metrics export: connection refused\x1b[2J"))
	clock.Set(29 * time.Second)
	e.Handle(errors.New("traces export: 9 spans refused"))
	clock.Set(30 * time.Second)
	e.Handle(errors.New("traces export: 1 spans refused"))
	e.Handle(nil)
	type line struct {
		Level, Msg, Err string
		Held            int `json:"held_back"`
	}
	var got []line
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var l line
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	want := []line{
		{"ERROR", "OpenTelemetry error", "traces export: 42 spans refused", 0},
		{"ERROR", "OpenTelemetry error", `metrics export: connection refused\x1b[2J`, 0},
		{"ERROR", "OpenTelemetry error", "traces export: 1 spans refused", 2},
	}
	if len(got) != len(want) {
		t.Fatalf("lines %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if v := testutil.ToFloat64(count); v != 5 {
		t.Errorf("counted %v errors, want 5", v)
	}
}
