package sim

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// Settling: after a step's changes are delivered and the scheduling loop
// resumed, the driver waits until the scheduler has nothing left to do,
// moving the virtual clock past the backoffs that would otherwise hold
// work back until a later step.

// busyReason names what the scheduler is still doing, "" when it has nothing
// to do for now: every change was delivered, no pod is queued to be tried,
// being tried, waiting at Permit or binding. Pods parked as unschedulable do
// not count: only a cluster event can move them, and the next step brings
// those. Pods in the backoff queue do not count either: with the active
// queue empty the scheduler pops them at once (which the settle loop sees as
// a new scheduling cycle), except those that failed with an error (native
// gang scheduling reports an unschedulable pod group that way), which wait
// for their backoff on the virtual clock, i.e. for the next step.
func (d *driver) busyReason() string {
	if !d.c.counts.caughtUp() {
		return "informers have not delivered every change"
	}
	if name := d.unconfirmedBind(); name != "" {
		return "the binding of " + name + " is not confirmed in the scheduler's cache"
	}
	if why := d.c.dra.unconfirmedClaimDelete(); why != "" {
		return why
	}
	q := d.sched.SchedulingQueue
	if n := len(q.PodsInActiveQ()); n > 0 {
		return fmt.Sprintf("%d pods in activeQ", n)
	}
	if n := len(q.InFlightPods()); n > 0 {
		return fmt.Sprintf("%d pods in flight (being scheduled or waiting at Permit)", n)
	}
	if d.b.podGroups {
		if n := len(q.PendingPodGroupPods()); n > 0 {
			return fmt.Sprintf("%d pods wait for their in-flight pod group", n)
		}
		if n := len(q.IncompletePodGroupPodsPods()); n > 0 {
			return fmt.Sprintf("%d pods wait for their PodGroup object", n)
		}
	}
	evicting, err := d.metrics.evictionsInFlight()
	if err != nil {
		return err.Error()
	}
	if evicting > 0 {
		return fmt.Sprintf("%.0f preemptions deleting their victims", evicting)
	}
	binding, err := testutil.GetGaugeMetricValue(schedmetrics.Goroutines.WithLabelValues(schedmetrics.Binding))
	if err != nil {
		return err.Error()
	}
	if binding > 0 {
		return fmt.Sprintf("%.0f binding goroutines", binding)
	}
	return ""
}

// unconfirmedBind names a bound pod whose binding the scheduler's cache has
// not taken in from its informer yet (the pod is still only assumed, or not
// there), "" when every binding so far is confirmed. The scheduler's handler
// of assigned pods confirms it and then wakes the pods that wait for such an
// event: until then the scheduler may still have work. The bindings are
// checked once each, in order.
func (d *driver) unconfirmedBind() string {
	confirmed := 0
	defer func() { d.confirmedBinds.read(confirmed) }()
	for _, r := range d.confirmedBinds.unread() {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: r.pod, Namespace: namespace, UID: r.uid}}
		if _, err := d.sched.Cache.GetPod(pod); err != nil {
			if _, err := d.c.cs.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), namespace, r.pod); apierrors.IsNotFound(err) {
				confirmed++ // deleted since (a preemption victim): nothing to confirm
				continue
			}
			return r.pod
		}
		if assumed, err := d.sched.Cache.IsAssumedPod(pod); err != nil || assumed {
			return r.pod
		}
		confirmed++
	}
	return ""
}

// settle waits until the scheduler has been idle for SettleQuiet and returns
// the real time it was busy since stepStart. Backoffs run on the virtual
// clock: when pods wait out a pod backoff (waitOutBackoff) or muster dropped
// a gang plan in this step and its members wait for the plugin's timers
// (waitOutGangBackoff), the clock is moved past them, never beyond the next
// scenario event, and the step goes on. Nothing is waited for in real time.
func (d *driver) settle(ctx context.Context, stepStart time.Time) (time.Duration, error) {
	var busy time.Duration
	segment := stepStart
	backoffRounds := 0
	for {
		busyEnd, ok, err := d.waitIdle(ctx, d.stepTimeout)
		if err != nil {
			return 0, err
		}
		busy += busyEnd.Sub(segment)
		if !ok {
			d.stats.stalled++
			return busy, nil
		}
		waited, err := d.waitOutBackoff(ctx, &backoffRounds)
		if err == nil && !waited {
			waited, err = d.waitOutGangBackoff(&backoffRounds)
		}
		if err != nil {
			return 0, err
		}
		if !waited {
			return busy, nil
		}
		segment = time.Now()
	}
}

// waitOutGangBackoff moves the virtual clock to the plugin's next timer
// when muster dropped a gang plan in this step and pods still wait: the
// dropped gang backs off (gangBackoffSeconds, doubling) and its members are
// woken by a timer. In a cluster the retry comes seconds later, long before
// the next job event, so it belongs to this step. The timer's callback has
// returned (its members are queued) when this returns.
func (d *driver) waitOutGangBackoff(rounds *int) (bool, error) {
	timers := d.b.pluginTimers
	if timers == nil || *rounds >= maxBackoffRounds {
		return false, nil
	}
	if len(d.sched.SchedulingQueue.UnschedulablePods()) == 0 && len(d.sched.SchedulingQueue.PodsInBackoffQ()) == 0 {
		return false, nil // every pod is placed; no one waits for the timers
	}
	next, ok := timers.nextTimer()
	if !ok {
		return false, nil
	}
	if !d.eng.beforeNext(next) {
		return false, nil // the next step's clock reaches it, in order
	}
	// Read last (it gathers every metric): a plan dropped since the last
	// look, in this step or an earlier one whose pods were all placed then.
	if !d.metrics.rejectedInStep() {
		return false, nil
	}
	*rounds++
	d.stats.gangBackoffMoves++
	if next.After(d.eng.clock.Now()) {
		d.eng.clock.SetTime(next)
	} else {
		d.eng.clock.SetTime(d.eng.clock.Now()) // fires timers due now
	}
	timers.waitCallbacks()
	return true, nil
}

// maxPodBackoff is kube-scheduler's default podMaxBackoffSeconds.
const maxPodBackoff = 10 * time.Second

// maxBackoffRounds bounds how often one step moves the queue's clock past
// a backoff: a pod that fails with an error every time would otherwise keep
// the step going forever.
const maxBackoffRounds = 5

// waitOutBackoff moves the scheduling queue's virtual clock past the backoff
// of the pods left in the backoff queue once the scheduler is idle, and
// waits until the queue has moved them to the active queue. Pods there
// failed with an error (native gang scheduling reports a pod group waiting
// for its preemption victims that way); in a cluster they would be retried
// seconds later, so they are retried within the step when that is before the
// next scenario event (never past it: the clock stays in order with the
// events). It reports whether it moved the clock.
func (d *driver) waitOutBackoff(ctx context.Context, rounds *int) (bool, error) {
	var latest time.Time
	waiting := d.sched.SchedulingQueue.PodsInBackoffQ()
	for _, pod := range waiting {
		if exp := d.backoffExpiration(pod); exp.After(latest) {
			latest = exp
		}
	}
	if len(waiting) == 0 || *rounds >= maxBackoffRounds {
		return false, nil
	}
	if latest.IsZero() {
		latest = d.eng.clock.Now().Add(maxPodBackoff)
	}
	past := latest.Truncate(backoffWindow).Add(backoffWindow)
	if !d.eng.beforeNext(past) {
		return false, nil // the next step's clock reaches it, in order
	}
	*rounds++
	d.stats.podBackoffMoves++
	if past.After(d.eng.clock.Now()) {
		d.eng.clock.SetTime(past)
	}
	return true, d.waitFor(ctx, d.unflushedBackoff)
}

// waitIdle polls until idle() has held for SettleQuiet. It returns when the
// idle stretch began (the end of the busy time), and ok=false on timeout.
func (d *driver) waitIdle(ctx context.Context, timeout time.Duration) (time.Time, bool, error) {
	deadline := time.Now().Add(timeout)
	var idleSince time.Time
	var idleCycle int64
	for {
		if err := ctx.Err(); err != nil {
			return time.Time{}, false, err
		}
		now := time.Now()
		// A pod popped during the idle stretch (from the backoff queue) ends it.
		cycle := d.sched.SchedulingQueue.SchedulingCycle()
		if reason := d.busyReason(); reason == "" && (idleSince.IsZero() || cycle == idleCycle) {
			if idleSince.IsZero() {
				idleSince, idleCycle = now, cycle
			} else if now.Sub(idleSince) >= d.settleQuiet {
				return idleSince, true, nil
			}
		} else {
			idleSince = time.Time{}
		}
		if now.After(deadline) {
			klog.FromContext(ctx).Info("Simulator step did not settle", "virtual", d.eng.now, "busy", d.busyReason(),
				"backoffQ", len(d.sched.SchedulingQueue.PodsInBackoffQ()))
			return now, false, nil
		}
		d.pauser.pause(pollInterval)
	}
}
