package record

import (
	"time"

	"github.com/tokentap/tokentap/stream"
)

// Observer is told about every request while it runs: the live view,
// for instruments that must move before the request ends (in-flight
// gauges, per-gap histograms). Everything derived from the finished
// record goes through the end-of-request pipeline instead (package
// pipeline). Begin is called once per request, at arrival.
type Observer interface {
	Begin(k Key) Observation
}

// Key names the series a request is observed under. Every field is a
// bounded label value except Model, the name as the request gave it (at
// most MaxModelBytes): observers bound it with the exporter's model
// labels, the one bound every backend shares.
type Key struct {
	API     stream.Name
	Model   string // as requested, at most MaxModelBytes
	Traffic string // "live" or "canary"
	Probe   string // the probe's name for canary traffic; "" for live
}

// Observation receives the live observations of one request. Gap and
// ForwardDelay are called per event on the hot path: implementations must
// not allocate or take a lock shared across requests there. Done is
// called exactly once, when the request is over, before the pipeline's
// end stages run; an implementation may hold a request's observations
// until then (exporter.Request does, in arrays of 16).
type Observation interface {
	Gap(d time.Duration)
	ForwardDelay(d time.Duration)
	Malformed()
	UsageInjected()
	TapFailed(reason string)
	Done()
}

// Clock tells the time. time.Now carries a monotonic reading, and every
// duration the sidecar reports is a difference of two such readings.
type Clock interface{ Now() time.Time }

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Nop is an Observer that observes nothing.
type Nop struct{}

// Begin returns a no-op observation.
func (Nop) Begin(Key) Observation { return nopObs{} }

type nopObs struct{}

func (nopObs) Gap(time.Duration)          {}
func (nopObs) ForwardDelay(time.Duration) {}
func (nopObs) Malformed()                 {}
func (nopObs) UsageInjected()             {}
func (nopObs) TapFailed(string)           {}
func (nopObs) Done()                      {}
