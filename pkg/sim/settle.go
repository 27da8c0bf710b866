package sim

import (
	"container/heap"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// bindReactor stands in for the API server's pods/binding subresource, which
// the fake tracker does not persist: it sets spec.nodeName and the
// PodScheduled condition on the stored pod and records the binding. It
// refuses pods or nodes that are gone and pods already bound, as the API
// server would. It runs under the fake's lock, so it uses only the tracker.
func (h *harness) bindReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateAction)
	if !ok || action.GetSubresource() != "binding" {
		return false, nil, nil
	}
	binding, ok := create.GetObject().(*v1.Binding)
	if !ok {
		return true, nil, fmt.Errorf("binding: unexpected %T", create.GetObject())
	}
	tracker := h.cs.Tracker()
	podsResource := v1.SchemeGroupVersion.WithResource("pods")
	nodesResource := v1.SchemeGroupVersion.WithResource("nodes")
	if _, err := tracker.Get(nodesResource, "", binding.Target.Name); err != nil {
		return true, nil, err
	}
	obj, err := tracker.Get(podsResource, action.GetNamespace(), binding.Name)
	if err != nil {
		return true, nil, err
	}
	pod := obj.(*v1.Pod).DeepCopy()
	if h.opts.BindFault != nil {
		if err := h.opts.BindFault(pod, binding.Target.Name); err != nil {
			return true, nil, err
		}
	}
	if pod.Spec.NodeName != "" {
		return true, nil, apierrors.NewConflict(podsResource.GroupResource(), pod.Name, fmt.Errorf("pod is already bound to %s", pod.Spec.NodeName))
	}
	pod.Spec.NodeName = binding.Target.Name
	pod.ResourceVersion = strconv.FormatInt(h.resourceVersion.Add(1), 10)
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue})
	if err := tracker.Update(podsResource, pod, action.GetNamespace()); err != nil {
		return true, nil, err
	}
	h.counts.want(kindPodBind)
	now := time.Now()
	if h.dra != nil {
		h.dra.bound(pod.Name, now)
	}
	h.binds.add(bindRecord{pod: pod.Name, uid: pod.UID, node: pod.Spec.NodeName, at: now})
	return true, binding, nil
}

// Kinds of change the simulator waits to see delivered by the scheduler's
// informers before it trusts the scheduler's queue to reflect them.
const (
	kindPodAdd = iota
	kindPodDelete
	kindPodBind
	kindPodUngate
	kindNodeAdd
	kindNodeUpdate
	kindNodeDelete
	kindJobAdd
	kindJobDelete
	kindPodGroupAdd
	kindPodGroupDelete
	kindPDBAdd
	kindPDBUpdate
	kindPDBDelete
	kindSliceAdd
	kindSliceDelete
	kindClaimAdd
	kindClaimUpdate
	kindClaimDelete
	// kindClaimRelease: a deleted pod's claims were deleted (dra.go).
	kindClaimRelease
	numKinds
)

// counters compare changes made (want) with changes the shared informers
// delivered (seen). The simulator's handlers sit on the scheduler's own
// informers, so a delivered change has reached the scheduler's handlers too
// (they are called from the same distribution, possibly a moment later: the
// settle window covers that).
type counters struct {
	wanted [numKinds]atomic.Int64
	seen   [numKinds]atomic.Int64
}

func (c *counters) want(kind int) { c.wanted[kind].Add(1) }

func (c *counters) caughtUp() bool {
	for k := 0; k < numKinds; k++ {
		if c.seen[k].Load() < c.wanted[k].Load() {
			return false
		}
	}
	return true
}

func (c *counters) handler(add, del int, update func(old, new interface{}) int) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { c.seen[add].Add(1) },
		DeleteFunc: func(interface{}) { c.seen[del].Add(1) },
		UpdateFunc: func(old, new interface{}) {
			if update != nil {
				if k := update(old, new); k >= 0 {
					c.seen[k].Add(1)
				}
			}
		},
	}
}

// watch adds the counting handlers to the scheduler's informers (before they
// start, so the initial list is counted as adds nobody waits for).
func (c *counters) watch(factory informers.SharedInformerFactory, podGroups, pdbs, dra bool) error {
	podUpdate := func(old, new interface{}) int {
		o, ok1 := old.(*v1.Pod)
		n, ok2 := new.(*v1.Pod)
		switch {
		case !ok1 || !ok2:
			return -1
		case o.Spec.NodeName == "" && n.Spec.NodeName != "":
			return kindPodBind
		case len(o.Spec.SchedulingGates) > 0 && len(n.Spec.SchedulingGates) == 0:
			return kindPodUngate
		}
		return -1
	}
	nodeUpdate := func(old, new interface{}) int { return kindNodeUpdate }
	regs := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandlerFuncs
	}{
		{factory.Core().V1().Pods().Informer(), c.handler(kindPodAdd, kindPodDelete, podUpdate)},
		{factory.Core().V1().Nodes().Informer(), c.handler(kindNodeAdd, kindNodeDelete, nodeUpdate)},
		{factory.Batch().V1().Jobs().Informer(), c.handler(kindJobAdd, kindJobDelete, nil)},
	}
	if podGroups {
		regs = append(regs, struct {
			informer cache.SharedIndexInformer
			handler  cache.ResourceEventHandlerFuncs
		}{factory.Scheduling().V1beta1().PodGroups().Informer(), c.handler(kindPodGroupAdd, kindPodGroupDelete, nil)})
	}
	if pdbs {
		// Only the budgets' status changes, written by the harness.
		regs = append(regs, struct {
			informer cache.SharedIndexInformer
			handler  cache.ResourceEventHandlerFuncs
		}{factory.Policy().V1().PodDisruptionBudgets().Informer(), c.handler(kindPDBAdd, kindPDBDelete, func(_, _ interface{}) int { return kindPDBUpdate })})
	}
	if dra {
		// Slices only come and go with their nodes; claims are written by
		// the scheduler (created, allocated, reserved, deleted at
		// Unreserve) and deleted by the simulator when their pod goes.
		regs = append(regs, struct {
			informer cache.SharedIndexInformer
			handler  cache.ResourceEventHandlerFuncs
		}{factory.Resource().V1().ResourceSlices().Informer(), c.handler(kindSliceAdd, kindSliceDelete, nil)},
			struct {
				informer cache.SharedIndexInformer
				handler  cache.ResourceEventHandlerFuncs
			}{factory.Resource().V1().ResourceClaims().Informer(), c.handler(kindClaimAdd, kindClaimDelete, func(_, _ interface{}) int { return kindClaimUpdate })})
	}
	for _, r := range regs {
		if _, err := r.informer.AddEventHandler(r.handler); err != nil {
			return err
		}
	}
	return nil
}

// busyReason names what the scheduler is still doing, "" when it has nothing
// to do for now: every change was delivered, no pod is queued to be tried,
// being tried, waiting at Permit or binding. Pods parked as unschedulable do
// not count: only a cluster event can move them, and the next step brings
// those. Pods in the backoff queue do not count either: with the active
// queue empty the scheduler pops them at once (which the settle loop sees as
// a new scheduling cycle), except those that failed with an error (native
// gang scheduling reports an unschedulable pod group that way), which wait
// for their backoff on the virtual clock, i.e. for the next step.
func (h *harness) busyReason() string {
	if !h.counts.caughtUp() {
		return "informers have not delivered every change"
	}
	if name := h.unconfirmedBind(); name != "" {
		return "the binding of " + name + " is not confirmed in the scheduler's cache"
	}
	q := h.sched.SchedulingQueue
	if n := len(q.PodsInActiveQ()); n > 0 {
		return fmt.Sprintf("%d pods in activeQ", n)
	}
	if n := len(q.InFlightPods()); n > 0 {
		return fmt.Sprintf("%d pods in flight (being scheduled or waiting at Permit)", n)
	}
	if h.b.podGroups {
		if n := len(q.PendingPodGroupPods()); n > 0 {
			return fmt.Sprintf("%d pods wait for their in-flight pod group", n)
		}
		if n := len(q.IncompletePodGroupPodsPods()); n > 0 {
			return fmt.Sprintf("%d pods wait for their PodGroup object", n)
		}
	}
	evicting, err := h.evictionsInFlight()
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
func (h *harness) unconfirmedBind() string {
	records := h.binds.since(h.confirmedBinds)
	for _, r := range records {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: r.pod, Namespace: namespace, UID: r.uid}}
		if _, err := h.sched.Cache.GetPod(pod); err != nil {
			if _, err := h.cs.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), namespace, r.pod); apierrors.IsNotFound(err) {
				h.confirmedBinds++ // deleted since (a preemption victim): nothing to confirm
				continue
			}
			return r.pod
		}
		if assumed, err := h.sched.Cache.IsAssumedPod(pod); err != nil || assumed {
			return r.pod
		}
		h.confirmedBinds++
	}
	return ""
}

// settle waits until the scheduler has been idle for SettleQuiet and returns
// the real time it was busy since stepStart. Backoffs run on the virtual
// clock: when pods wait out a pod backoff (waitOutBackoff) or muster dropped
// a gang plan in this step and its members wait for the plugin's timers
// (waitOutGangBackoff), the clock is moved past them, never beyond the next
// scenario event, and the step goes on. Nothing is waited for in real time.
func (h *harness) settle(ctx context.Context, stepStart time.Time) (time.Duration, error) {
	var busy time.Duration
	segment := stepStart
	backoffRounds := 0
	for {
		busyEnd, ok, err := h.waitIdle(ctx, h.opts.StepTimeout)
		if err != nil {
			return 0, err
		}
		busy += busyEnd.Sub(segment)
		if !ok {
			h.stalled++
			return busy, nil
		}
		waited, err := h.waitOutBackoff(ctx, &backoffRounds)
		if err == nil && !waited {
			waited, err = h.waitOutGangBackoff(&backoffRounds)
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
func (h *harness) waitOutGangBackoff(rounds *int) (bool, error) {
	timers := h.b.pluginTimers
	if timers == nil || *rounds >= maxBackoffRounds {
		return false, nil
	}
	if len(h.sched.SchedulingQueue.UnschedulablePods()) == 0 && len(h.sched.SchedulingQueue.PodsInBackoffQ()) == 0 {
		return false, nil // every pod is placed; no one waits for the timers
	}
	next, ok := timers.nextTimer()
	if !ok {
		return false, nil
	}
	if h.events.Len() > 0 && !next.Before(epoch.Add(h.events[0].at)) {
		return false, nil // the next step's clock reaches it, in order
	}
	// Read last (it gathers every metric): a plan dropped since the last
	// look, in this step or an earlier one whose pods were all placed then.
	if rejects := gangRejections(); rejects > h.lastRejects {
		h.lastRejects, h.gangRejectedInStep = rejects, true
	}
	if !h.gangRejectedInStep {
		return false, nil
	}
	*rounds++
	h.gangBackoffMoves++
	if next.After(h.clock.Now()) {
		h.clock.SetTime(next)
	} else {
		h.clock.SetTime(h.clock.Now()) // fires timers due now
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
func (h *harness) waitOutBackoff(ctx context.Context, rounds *int) (bool, error) {
	var latest time.Time
	waiting := h.sched.SchedulingQueue.PodsInBackoffQ()
	for _, pod := range waiting {
		if exp := h.backoffExpiration(pod); exp.After(latest) {
			latest = exp
		}
	}
	if len(waiting) == 0 || *rounds >= maxBackoffRounds {
		return false, nil
	}
	if latest.IsZero() {
		latest = h.clock.Now().Add(maxPodBackoff)
	}
	past := latest.Truncate(backoffWindow).Add(backoffWindow)
	if h.events.Len() > 0 && !past.Before(epoch.Add(h.events[0].at)) {
		return false, nil // the next step's clock reaches it, in order
	}
	*rounds++
	h.podBackoffMoves++
	if past.After(h.clock.Now()) {
		h.clock.SetTime(past)
	}
	return true, h.waitFor(ctx, h.unflushedBackoff)
}

// waitIdle polls until idle() has held for SettleQuiet. It returns when the
// idle stretch began (the end of the busy time), and ok=false on timeout.
func (h *harness) waitIdle(ctx context.Context, timeout time.Duration) (time.Time, bool, error) {
	deadline := time.Now().Add(timeout)
	var idleSince time.Time
	var idleCycle int64
	for {
		if err := ctx.Err(); err != nil {
			return time.Time{}, false, err
		}
		now := time.Now()
		// A pod popped during the idle stretch (from the backoff queue) ends it.
		cycle := h.sched.SchedulingQueue.SchedulingCycle()
		if reason := h.busyReason(); reason == "" && (idleSince.IsZero() || cycle == idleCycle) {
			if idleSince.IsZero() {
				idleSince, idleCycle = now, cycle
			} else if now.Sub(idleSince) >= h.opts.SettleQuiet {
				return idleSince, true, nil
			}
		} else {
			idleSince = time.Time{}
		}
		if now.After(deadline) {
			klog.FromContext(ctx).Info("Simulator step did not settle", "virtual", h.now, "busy", h.busyReason(),
				"backoffQ", len(h.sched.SchedulingQueue.PodsInBackoffQ()))
			return now, false, nil
		}
		h.pauser.pause(pollInterval)
	}
}

// The scheduler's counters in the report. kube-scheduler's
// schedule_attempts_total and podgroup_schedule_attempts_total are
// unexported in its metrics package, and muster's in mustergang: only their
// names reach them, so they are read from the process's registry through
// testutil.GetCounterValuesFromGatherer. batch_attempts_total is exported,
// but asking its vector for a series creates the series: the report would
// then show 0 for a result that never happened, where it shows none. So it
// is read by name too. kube-scheduler's counters are read for the run's one
// profile.

// countersBy returns the series of counter name whose labels match match,
// by the value of label: none before the counter has a series.
func countersBy(name, label string, match map[string]string) map[string]float64 {
	values, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer, name, match, label)
	if err != nil {
		return map[string]float64{} // not registered yet, or no series
	}
	return values
}

// counterTotal reads a counter without labels (muster's gangs_scheduled_total
// and gang_unplaceable_total), which testutil's gatherer readers, keyed by a
// label, do not: the one reader of the registry's families written here. 0
// before the counter has a series.
func counterTotal(name string) float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return 0
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// gangRejections is muster_gang_rejections_total over all causes.
func gangRejections() float64 {
	total := 0.0
	for _, v := range countersBy("muster_gang_rejections_total", "cause", nil) {
		total += v
	}
	return total
}

// extraMetrics collects scheduler-specific counters for the report, as
// increases since the run started: whether opportunistic batching ever used a
// hint, muster's plan outcomes, native pod-group attempts.
func (h *harness) extraMetrics() map[string]float64 {
	out := h.counterValues()
	for k, v := range h.baseline {
		out[k] -= v
	}
	out["gate_opportunistic_batching"] = 0
	if utilfeature.DefaultFeatureGate.Enabled(features.OpportunisticBatching) {
		out["gate_opportunistic_batching"] = 1
	}
	return out
}

func (h *harness) counterValues() map[string]float64 {
	out := map[string]float64{}
	profile := map[string]string{"profile": h.b.schedulerName}
	for result, v := range countersBy("scheduler_batch_attempts_total", "result", profile) {
		out["batch_attempts_"+result] = v
	}
	out["schedule_attempts"] = 0
	for result, v := range countersBy("scheduler_schedule_attempts_total", "result", profile) {
		out["schedule_attempts_"+result] = v
		out["schedule_attempts"] += v
	}
	if isMuster(h.opts.Scheduler) {
		out["muster_gangs_scheduled"] = counterTotal("muster_gangs_scheduled_total")
		out["muster_plans_unplaceable"] = counterTotal("muster_gang_unplaceable_total")
		for cause, v := range countersBy("muster_gang_rejections_total", "cause", nil) {
			out["muster_plans_dropped_"+cause] = v
		}
	}
	if usesPodGroups(h.opts.Scheduler) {
		for result, v := range countersBy("scheduler_podgroup_schedule_attempts_total", "result", profile) {
			out["podgroup_attempts_"+result] = v
		}
	}
	return out
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
func (h *harness) scheduleFlush(binds int) {
	wasFlush := h.lastWasFlush
	h.lastWasFlush = false
	if h.flushPending || (wasFlush && binds == 0) || len(h.sched.SchedulingQueue.UnschedulablePods()) == 0 {
		return
	}
	at := h.now + h.plan.Scenario.Quantize(unschedulableFlush)
	if h.events.Len() > 0 && h.events[0].at <= at {
		return // that event's step comes first; the next step decides again
	}
	heap.Push(&h.events, event{at: at, kind: evFlush})
	h.flushPending = true
}

// flushUnschedulable moves every pod of the unschedulable pool back to be
// retried, as kube-scheduler's periodic flush does for pods that waited
// there longer than 5 minutes (every one has, at a flush step).
func (h *harness) flushUnschedulable() {
	h.flushPending, h.lastWasFlush = false, true
	h.sched.SchedulingQueue.MoveAllToActiveOrBackoffQueue(klog.Background(), framework.EventUnschedulableTimeout, nil, nil, nil)
}
