package openloop

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// Every instant fires at its time; a fire that blocks past the next
// instants makes them late, never skipped; the schedule's end returns.
func TestRunFiresEveryInstantLateOrNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		offsets := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond, 100 * time.Millisecond}
		i := 0
		var lags []time.Duration
		_, pending := Run(t.Context(), t0, func(time.Time) (time.Time, bool) {
			i++
			if i == len(offsets) {
				return time.Time{}, false
			}
			return t0.Add(offsets[i]), true
		}, func(at time.Time) {
			lags = append(lags, time.Since(at))
			if len(lags) == 2 {
				time.Sleep(30 * time.Millisecond) // a stall: the next two come due meanwhile
			}
		})
		want := []time.Duration{0, 0, 20 * time.Millisecond, 15 * time.Millisecond, 0}
		if pending || len(lags) != len(want) {
			t.Fatalf("pending %v, lags %v", pending, lags)
		}
		for k := range want {
			if lags[k] != want[k] {
				t.Errorf("instant %d: lag %v, want %v", k, lags[k], want[k])
			}
		}
	})
}

// Ending the context returns the instant due next, not fired.
func TestRunStopsWithThePendingInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 25*time.Millisecond)
		defer cancel()
		fired := 0
		at, pending := Run(ctx, t0, func(t time.Time) (time.Time, bool) { return t.Add(10 * time.Millisecond), true },
			func(time.Time) { fired++ })
		if !pending || fired != 3 || !at.Equal(t0.Add(30*time.Millisecond)) {
			t.Fatalf("fired %d, pending %v at %v", fired, pending, at.Sub(t0))
		}
	})
}
