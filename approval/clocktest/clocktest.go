// Package clocktest is the one test clock: a clock the test moves by hand
// instead of sleeping, modelled on tailscale's tstest.Clock. Pass its Now
// (and Sleep) wherever code takes `Now func() time.Time` (a sleep function).
package clocktest

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Start is where a clock starts when Opts.Start is zero.
var Start = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// Opts configures a Clock.
type Opts struct {
	// Start is the first time; zero means Start.
	Start time.Time
	// Step is how far every Now call moves the clock before it reads it:
	// zero stands still until Advance or Set (distinct readings need a Step).
	Step time.Duration
}

// Clock is a manual clock, safe for concurrent use.
type Clock struct {
	mu    sync.Mutex // guards now, step and slept
	now   time.Time
	step  time.Duration
	slept []time.Duration
}

// New returns a clock at opts.Start.
func New(opts Opts) *Clock {
	if opts.Start.IsZero() {
		opts.Start = Start
	}
	return &Clock{now: opts.Start, step: opts.Step}
}

// Now advances the clock by its step and returns the time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

// Peek returns the time without stepping.
func (c *Clock) Peek() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// Set moves the clock to t (backwards too).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// SetStep changes how far each Now call moves the clock.
func (c *Clock) SetStep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step = d
}

// Sleep advances the clock by d instead of waiting, and records d (see
// Slept). It returns ctx.Err() without advancing when ctx is done.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.slept = append(c.slept, d)
	return nil
}

// Slept returns every duration passed to Sleep, in order.
func (c *Clock) Slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}
