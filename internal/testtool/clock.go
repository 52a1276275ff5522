package testtool

import (
	"sync"
	"time"
)

// Clock is a clock a test sets (a record.Clock): a scripted upstream moves
// it to the instant of each write before writing, so every latency the
// code under test measures from it is exact, not within a tolerance.
type Clock struct {
	mu   sync.Mutex
	base time.Time
	now  time.Duration
}

// NewClock returns a Clock that reads base until it is set.
func NewClock(base time.Time) *Clock { return &Clock{base: base} }

// Now returns the instant set last.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(c.now)
}

// Set moves the clock to d after its base.
func (c *Clock) Set(d time.Duration) {
	c.mu.Lock()
	c.now = d
	c.mu.Unlock()
}
