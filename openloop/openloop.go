// Package openloop runs an open-loop schedule: each instant fires when it
// is due, whatever became of the ones before it. The canary prober and
// tokentap replay share it (docs/measurement.md §7, docs/capture.md, "Replay").
//
// A scheduler that falls behind (a stalled goroutine, a busy machine)
// fires every instant that came due meanwhile, late, at once: none is
// skipped silently. The caller measures how late (the send instant minus
// the scheduled instant: the schedule lag) and counts what it could not
// send.
package openloop

import (
	"context"
	"runtime"
	"time"
)

// Schedule runs open-loop schedules. The zero value sleeps on a timer
// until each instant: the Go runtime's timers wake up to about a
// millisecond late when the process is idle (the poller waits in whole
// milliseconds), which a canary probe every few seconds does not feel.
type Schedule struct {
	// Spin, when above 0, wakes that long before each instant and
	// yields the processor in a loop until it: sends within tens of
	// microseconds of their instant on an idle machine, for at most Spin
	// of CPU per instant (tokentap replay: docs/capture.md, "Replay").
	Spin time.Duration
}

// Run fires fire(at) for every instant of the schedule that starts at
// first, next(at) giving the instant after at and false when the
// schedule has ended. Instants never go back: one before its
// predecessor is due at once. fire is called on Run's goroutine, in
// order; it should hand long work to another goroutine. An instant that
// comes due as ctx ends may still be fired: fire sees ctx done then.
//
// Run returns when the schedule ends (pending false), or when ctx is
// done, with the instant that was due next and not fired (pending true):
// the caller says it was not sent.
func Run(ctx context.Context, first time.Time, next func(time.Time) (time.Time, bool), fire func(at time.Time)) (at time.Time, pending bool) {
	return Schedule{}.Run(ctx, first, next, fire)
}

// Run is the package's Run, with s's precision.
func (s Schedule) Run(ctx context.Context, first time.Time, next func(time.Time) (time.Time, bool), fire func(at time.Time)) (at time.Time, pending bool) {
	at = first
	timer := time.NewTimer(time.Until(at) - s.Spin)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return at, true
		case <-timer.C:
		}
		for s.Spin > 0 && time.Now().Before(at) && ctx.Err() == nil {
			runtime.Gosched()
		}
		// Fire every instant that is due, late ones included: a stalled
		// scheduler catches up rather than silently skipping.
		for now := time.Now(); !at.After(now); {
			fire(at)
			n, ok := next(at)
			if !ok {
				return time.Time{}, false
			}
			at = n
		}
		timer.Reset(time.Until(at) - s.Spin)
	}
}
