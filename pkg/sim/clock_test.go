package sim

import (
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The plugin's timers are tracked until they fire or stop, fire only when
// the virtual clock reaches them, and may read the clock from their callback
// (FakeClock alone would deadlock: it fires callbacks under its lock).
func TestPluginClockTracksTimers(t *testing.T) {
	c := newPluginClock(clocktesting.NewFakeClock(epoch))
	if _, ok := c.nextTimer(); ok {
		t.Fatal("a new clock has a pending timer")
	}
	var fired atomic.Int32
	var seen atomic.Int64
	c.AfterFunc(5*time.Second, func() {
		seen.Store(int64(c.Now().Sub(epoch))) // reads the clock
		fired.Add(1)
	})
	stopped := c.AfterFunc(2*time.Second, func() { fired.Add(100) })
	c.AfterFunc(120*time.Second, func() { fired.Add(1000) })

	if next, _ := c.nextTimer(); !next.Equal(epoch.Add(2 * time.Second)) {
		t.Errorf("next timer at %s, want +2s", next.Sub(epoch))
	}
	stopped.Stop()
	if next, _ := c.nextTimer(); !next.Equal(epoch.Add(5 * time.Second)) {
		t.Errorf("after Stop the next timer is at %s, want +5s", next.Sub(epoch))
	}
	c.SetTime(epoch.Add(4 * time.Second))
	c.waitCallbacks()
	if n := fired.Load(); n != 0 {
		t.Errorf("callbacks ran before their time: %d", n)
	}
	c.SetTime(epoch.Add(5 * time.Second))
	c.waitCallbacks()
	if n := fired.Load(); n != 1 {
		t.Errorf("after reaching +5s the callbacks added %d, want 1", n)
	}
	if got := time.Duration(seen.Load()); got != 5*time.Second {
		t.Errorf("the callback read the clock at %s, want 5s", got)
	}
	if next, ok := c.nextTimer(); !ok || !next.Equal(epoch.Add(120*time.Second)) {
		t.Errorf("after the +5s timer fired the next is %s (%t), want +120s", next.Sub(epoch), ok)
	}
}
