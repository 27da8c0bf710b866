package sim

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// pluginClock is the simulator's virtual clock as muster's plugin sees it
// (plan deadlines, gang backoff, node avoidance). It is the same FakeClock
// the scheduling queue follows, with two differences:
//
//   - the plugin's AfterFunc timers are tracked, so a settled step can move
//     the clock to the next one instead of waiting for it in real time;
//   - their callbacks run on a goroutine of their own: FakeClock calls them
//     while it holds its lock, and the plugin's callbacks read the clock
//     (through the scheduling queue), which would deadlock.
type pluginClock struct {
	*clocktesting.FakeClock

	mu      sync.Mutex
	pending map[*pluginTimer]time.Time // timer → when it fires
	running sync.WaitGroup             // callbacks started and not returned
}

var _ clock.WithDelayedExecution = (*pluginClock)(nil)

func newPluginClock(c *clocktesting.FakeClock) *pluginClock {
	return &pluginClock{FakeClock: c, pending: map[*pluginTimer]time.Time{}}
}

// AfterFunc runs cb on its own goroutine once the virtual clock reaches now+d.
// c.mu is never held while calling into the FakeClock: FakeClock.SetTime
// holds its own lock while it fires the callback, which takes c.mu.
func (c *pluginClock) AfterFunc(d time.Duration, cb func()) clock.Timer {
	t := &pluginTimer{clock: c}
	deadline := c.Now().Add(d)
	inner := c.FakeClock.AfterFunc(d, func() {
		c.mu.Lock()
		delete(c.pending, t)
		t.fired = true
		c.running.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.running.Done()
			cb()
		}()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	t.inner = inner
	if !t.fired {
		c.pending[t] = deadline
	}
	return t
}

// nextTimer is when the earliest pending timer fires (ok=false: none).
func (c *pluginClock) nextTimer() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, at := range c.pending {
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next, !next.IsZero()
}

// waitCallbacks returns once every callback the clock has fired so far has
// returned.
func (c *pluginClock) waitCallbacks() { c.running.Wait() }

// pluginTimer is one AfterFunc timer of the plugin.
type pluginTimer struct {
	clock *pluginClock
	inner clock.Timer
	fired bool
}

func (t *pluginTimer) C() <-chan time.Time { return t.inner.C() }

func (t *pluginTimer) Stop() bool {
	t.clock.mu.Lock()
	delete(t.clock.pending, t)
	t.clock.mu.Unlock()
	return t.inner.Stop()
}

func (t *pluginTimer) Reset(d time.Duration) bool {
	deadline := t.clock.Now().Add(d)
	t.clock.mu.Lock()
	t.clock.pending[t] = deadline
	t.fired = false
	t.clock.mu.Unlock()
	return t.inner.Reset(d)
}
