package sim

import (
	"container/heap"
	"context"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// engine is the simulator's event engine: virtual time and the scenario's
// events, taken one virtual instant (a step) at a time. It knows nothing of
// what an event does: the harness applies each step's events to the cluster
// model and lets the scheduler driver run the scheduler on them.
type engine struct {
	scenario *scenario.Scenario
	// clock is virtual time as the scheduling queue and muster's plugin see
	// it: epoch plus now, or ahead of now once a settled step moved it past
	// a backoff (it never passes the next event).
	clock *clocktesting.FakeClock
	// now is the instant of the current step.
	now    time.Duration
	events eventQueue
	// steps counts the steps taken (it names each step's barrier pod and
	// seeds its pod order).
	steps uint64
	// flushPending: an evFlush is queued; lastWasFlush: the last step was
	// one (a flush that binds nothing queues no other).
	flushPending, lastWasFlush bool
}

func newEngine(sc *scenario.Scenario) *engine {
	return &engine{scenario: sc, clock: clocktesting.NewFakeClock(epoch)}
}

// Event kinds, in the order they apply within one step: finished jobs free
// capacity first, then nodes change, then new jobs arrive.
const (
	evComplete = iota
	evNotice
	evDelete
	evReplace
	evPreempted
	evFlush
	evArrival
)

type event struct {
	at   time.Duration
	kind int
	seq  int
	// gang and attempt: arrivals, completions and preemptions (a completion
	// of an attempt a reclaim or preemption has since restarted is ignored).
	gang    *gangState
	attempt int
	// reclaim: notices; node: deletions; slot and generation: deletions and
	// replacements.
	reclaim    *scenario.Reclaim
	node       string
	slot       int
	generation int
	// background: replacements, the background pods of the deleted node.
	background []*bgPod
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	if q[i].seq != q[j].seq {
		return q[i].seq < q[j].seq
	}
	// One reclaim event deletes and replaces several nodes: a total order
	// keeps the seed's runs identical.
	if q[i].node != q[j].node {
		return q[i].node < q[j].node
	}
	return q[i].slot < q[j].slot
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// push queues an event.
func (eng *engine) push(e event) { heap.Push(&eng.events, e) }

// after queues e at d from now (quantized to the scenario's tick).
func (eng *engine) after(d time.Duration, e event) {
	e.at = eng.now + eng.scenario.Quantize(d)
	eng.push(e)
}

// beforeNext reports whether t (on the virtual clock) comes before the
// next event's instant, or no event is left: the clock may be moved to t
// without overtaking the events.
func (eng *engine) beforeNext(t time.Time) bool {
	return eng.events.Len() == 0 || t.Before(epoch.Add(eng.events[0].at))
}

// stop is why the event loop ended.
type stop int

const (
	// drained: no event is left.
	drained stop = iota
	// beyondHorizon: the next event lies beyond the scenario's horizon.
	beyondHorizon
)

// run takes the events in order, one step per instant: step(t) applies
// every event due at t and returns how many pods were bound in it. It ends
// when no event is left or the next one lies beyond the horizon, with now
// at the last step's instant.
func (eng *engine) run(ctx context.Context, step func(context.Context, time.Duration) (int, error), unschedulable func() bool) (stop, error) {
	horizon := eng.scenario.Horizon.Duration
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if eng.events.Len() == 0 {
			return drained, nil
		}
		next := eng.events[0].at
		if next > horizon {
			return beyondHorizon, nil
		}
		binds, err := step(ctx, next)
		if err != nil {
			return 0, err
		}
		eng.scheduleFlush(binds, unschedulable)
	}
}

// begin starts the step at t (called while the scheduling loop is paused):
// the clock moves to t unless a settled step moved it further already.
func (eng *engine) begin(t time.Duration) {
	eng.now = t
	if at := epoch.Add(t); at.After(eng.clock.Now()) {
		eng.clock.SetTime(at)
	}
}

// due takes the next event due at the current step's instant.
func (eng *engine) due() (event, bool) {
	if eng.events.Len() == 0 || eng.events[0].at != eng.now {
		return event{}, false
	}
	return heap.Pop(&eng.events).(event), true
}

// unschedulableFlush is how long after a pod's last attempt kube-scheduler
// retries it without any event: podMaxInUnschedulablePodsDuration (5 min),
// checked every 30 s.
const unschedulableFlush = 5*time.Minute + 30*time.Second

// scheduleFlush queues a flush step unschedulableFlush from now when pods
// wait in the unschedulable pool and no scenario event comes before then: in
// a cluster they would be retried then, event or not. A flush step that
// bound nothing queues no other, so a run whose jobs can never run still
// ends.
func (eng *engine) scheduleFlush(binds int, unschedulable func() bool) {
	wasFlush := eng.lastWasFlush
	eng.lastWasFlush = false
	if eng.flushPending || (wasFlush && binds == 0) || !unschedulable() {
		return
	}
	at := eng.now + eng.scenario.Quantize(unschedulableFlush)
	if eng.events.Len() > 0 && eng.events[0].at <= at {
		return // that event's step comes first; the next step decides again
	}
	eng.push(event{at: at, kind: evFlush})
	eng.flushPending = true
}

// flushing notes that this step is the flush step scheduleFlush queued.
func (eng *engine) flushing() {
	eng.flushPending, eng.lastWasFlush = false, true
}
