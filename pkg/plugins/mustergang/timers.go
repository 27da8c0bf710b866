package mustergang

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/gang"
)

// timers are the plugin's pending timers on its clock: the real clock in a
// scheduler, the simulator's virtual clock in muster-sim, so plan
// deadlines, gang backoff and avoidance follow the same time as the
// scheduling queue. Pending timers hold the plugin (and through its handle
// the scheduler's caches), so they are stopped with the scheduler instead
// of firing minutes later; in the simulator each pending timer is a moment
// its virtual clock may move to, so a timer no longer needed is cancelled.
type timers struct {
	clock clock.WithDelayedExecution
	mu    sync.Mutex
	live  map[clock.Timer]bool // nil once the scheduler stopped
	named map[any]clock.Timer  // the pending timers set by once and forGang
	seq   uint64               // tells a gang's timers apart (gangTimer)
}

// planDeadline names the deadline timer of a plan (by ID).
type planDeadline int64

// membersCheck names the pending check of a gang short of members
// (explainShortLater).
type membersCheck gang.Key

// gangTimer names one of a gang's timers that wake its members (the end of
// a backoff or of an avoidance, a cache lag), so forget can stop them when
// the gang is gone.
type gangTimer struct {
	key gang.Key
	seq uint64
}

func newTimers(c clock.WithDelayedExecution) *timers {
	return &timers{clock: c, live: map[clock.Timer]bool{}, named: map[any]clock.Timer{}}
}

func (t *timers) now() time.Time { return t.clock.Now() }

// once runs f after d unless the scheduler stops first or a timer of the
// same name is pending; it reports whether it set one. cancel(name) stops
// it.
func (t *timers) once(name any, d time.Duration, f func()) bool {
	return t.set(name, d, f)
}

// forGang runs f after d unless forget(key) or the scheduler stops first.
func (t *timers) forGang(key gang.Key, d time.Duration, f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	t.setLocked(gangTimer{key: key, seq: t.seq}, d, f)
}

// forget stops the pending timers of gang key set by forGang, and its
// members check: the gang has no pods left.
func (t *timers) forget(key gang.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, timer := range t.named {
		if g, ok := name.(gangTimer); (ok && g.key == key) || name == any(membersCheck(key)) {
			t.stopNamed(name, timer)
		}
	}
}

func (t *timers) set(name any, d time.Duration, f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setLocked(name, d, f)
}

// setLocked is set with t.mu held.
func (t *timers) setLocked(name any, d time.Duration, f func()) bool {
	if t.live == nil {
		return false
	}
	if t.named[name] != nil {
		return false
	}
	var timer clock.Timer
	timer = t.clock.AfterFunc(d, func() {
		t.mu.Lock()
		delete(t.live, timer) // timer is set: the lock was held while it was assigned
		if t.named[name] == timer {
			delete(t.named, name)
		}
		t.mu.Unlock()
		f()
	})
	t.live[timer] = true
	t.named[name] = timer
	return true
}

// cancel stops the pending timer set by once under name, if any.
func (t *timers) cancel(name any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if timer := t.named[name]; timer != nil {
		t.stopNamed(name, timer)
	}
}

// stopNamed stops timer, pending under name. t.mu is held.
func (t *timers) stopNamed(name any, timer clock.Timer) {
	delete(t.named, name)
	if t.live[timer] {
		timer.Stop()
		delete(t.live, timer)
	}
}

// stop stops every pending timer; later ones are not set.
func (t *timers) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for timer := range t.live {
		timer.Stop()
	}
	t.live, t.named = nil, nil
}
