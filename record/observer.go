package record

import "time"

// Observer is told about every request as it happens. The exporter
// implements it; the proxy and the probe call it. Begin is called once per
// request, at arrival.
type Observer interface {
	Begin(k Key) Observation
}

// Key names the series a request is observed under; every field is a
// bounded label value except Model, which the exporter bounds itself.
type Key struct {
	API     API
	Model   string
	Traffic string // "live" or "canary"
	Probe   string // the probe's name for canary traffic; "" for live
}

// Observation receives the live observations of one request. Gap and
// ForwardDelay are called per event on the hot path: implementations must
// not allocate or take a lock shared across requests there. End is called
// exactly once, with the finished record.
type Observation interface {
	Gap(d time.Duration)
	ForwardDelay(d time.Duration)
	Malformed()
	UsageInjected()
	TapFailed(reason string)
	End(r *Record)
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
func (nopObs) End(*Record)                {}

// Fanout observes every request with each of its observers, in order.
type Fanout []Observer

// Begin begins with each observer.
func (f Fanout) Begin(k Key) Observation {
	if len(f) == 1 {
		return f[0].Begin(k)
	}
	m := make(multi, len(f))
	for i, o := range f {
		m[i] = o.Begin(k)
	}
	return m
}

type multi []Observation

func (m multi) Gap(d time.Duration) {
	for _, o := range m {
		o.Gap(d)
	}
}
func (m multi) ForwardDelay(d time.Duration) {
	for _, o := range m {
		o.ForwardDelay(d)
	}
}
func (m multi) Malformed() {
	for _, o := range m {
		o.Malformed()
	}
}
func (m multi) UsageInjected() {
	for _, o := range m {
		o.UsageInjected()
	}
}
func (m multi) TapFailed(r string) {
	for _, o := range m {
		o.TapFailed(r)
	}
}
func (m multi) End(r *Record) {
	for _, o := range m {
		o.End(r)
	}
}
