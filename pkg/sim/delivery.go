package sim

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// Delivery: the simulator trusts the scheduler's queue and cache only once
// they reflect every change it made. The cluster model counts the changes
// it makes (want) and the scheduler's informers count what they deliver
// (counters); the driver waits for the two to meet and for the scheduler's
// handlers to have applied them.

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
		// Only the budgets' status changes, written by the cluster model.
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

// stepChanges are the changes of one step the scheduler must have taken in
// before it may go on.
type stepChanges struct {
	created      []*v1.Pod // unbound pods created: must be queued
	deletedQueue []*v1.Pod // unbound pods deleted: must have left the queue
	deletedBound []*v1.Pod // bound pods deleted: must have left the cache
	createdBound []*v1.Pod // bound pods created (background): must be in the cache
	tainted      []string  // nodes that got the reclaim taint
}

func (c *stepChanges) reset() { *c = stepChanges{} }

// stepGate is the scheduling gate every pod is created with. Lifting the
// gates of all of a step's pods once they all exist makes the scheduler see
// them at once: a gang is never held at PreEnqueue for members that are
// merely not created yet, so no plugin records a half-created gang, and all
// of the step's pods wait in the active queue in QueueSort order.
const stepGate = "sim.muster.dev/step"

// waitDelivered waits until the simulator's informer handlers have seen every
// change of the step and the scheduler's handlers have applied them: created
// pods are in its queue, deleted ones out of its queue or cache, node changes
// in its cache. Then it lifts the new pods' scheduling gates and waits until
// they are ungated in the queue, and until the queue's backoff flusher has
// caught up with the virtual clock.
func (d *driver) waitDelivered(ctx context.Context) error {
	if err := d.waitFor(ctx, d.scheduledChanges); err != nil {
		return err
	}
	for _, pod := range d.c.changes.created {
		d.c.counts.want(kindPodUngate)
		patch := fmt.Sprintf(`{"metadata":{"resourceVersion":"%d"},"spec":{"schedulingGates":null}}`, d.c.resourceVersion.Add(1))
		if _, err := d.c.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("lifting the scheduling gate of %s: %w", pod.Name, err)
		}
	}
	q := d.sched.SchedulingQueue
	// While the loop is parked nothing is attempted, so a pod of this step
	// that is among the queue's unschedulable pods was gated there (by its
	// scheduling gate or a PreEnqueue plugin). The queue lists them under its
	// lock; a QueuedPodInfo it returns must not be read after (a race).
	stillGated := func() map[string]*v1.Pod {
		unschedulable := map[types.UID]bool{}
		for _, pod := range q.UnschedulablePods() {
			unschedulable[pod.UID] = true
		}
		gated := map[string]*v1.Pod{}
		for _, pod := range d.c.changes.created {
			if unschedulable[pod.UID] {
				gated[pod.Namespace+"/"+pod.Name] = pod
			}
		}
		return gated
	}
	if err := d.waitCaughtUp(ctx); err != nil {
		return err
	}
	// A pod that a plugin's PreEnqueue held while the gate was still on is
	// only re-checked on events that plugin registered; the lifted gate is
	// not one of them. Activate re-runs PreEnqueue now that the step is
	// complete.
	if gated := stillGated(); len(gated) > 0 {
		q.Activate(klog.FromContext(ctx), gated)
	}
	return d.waitFor(ctx, func() string {
		for name := range stillGated() {
			return "pod " + name + " still gated in the queue"
		}
		return d.unflushedBackoff()
	})
}

// waitFor polls until the informers delivered every change and pending
// returns "".
func (d *driver) waitFor(ctx context.Context, pending func() string) error {
	deadline := time.Now().Add(d.stepTimeout)
	for {
		why := "informers have not delivered every change"
		if d.c.counts.caughtUp() {
			why = pending()
		}
		if why == "" {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scheduler did not take in the step's changes within %s: %s", d.stepTimeout, why)
		}
		d.pauser.pause(pollInterval)
	}
}

// waitCaughtUp polls until the informers delivered every change.
func (d *driver) waitCaughtUp(ctx context.Context) error {
	return d.waitFor(ctx, func() string { return "" })
}

// createdPodsQueued names a pod of the step the scheduler has not taken in
// (queued, or cached when None's first fit bound it).
func (d *driver) createdPodsQueued() string {
	q, c := d.sched.SchedulingQueue, d.sched.Cache
	for _, pod := range d.c.changes.created {
		if pod.Spec.NodeName != "" { // bound by None's first fit
			if _, err := c.GetPod(pod); err != nil {
				return "pod " + pod.Name + " not in the cache"
			}
		} else if _, ok := q.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup); !ok {
			return "pod " + pod.Name + " not queued"
		}
	}
	return ""
}

// scheduledChanges names a change of the step the scheduler has not applied.
// The step's new pods are not among them: submit waited for those
// (createdPodsQueued) before it created their Jobs.
func (d *driver) scheduledChanges() string {
	q, c := d.sched.SchedulingQueue, d.sched.Cache
	for _, pod := range d.c.changes.deletedQueue {
		if _, ok := q.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup); ok {
			return "deleted pod " + pod.Name + " still queued"
		}
	}
	for _, pod := range d.c.changes.deletedBound {
		if _, err := c.GetPod(pod); err == nil {
			return "deleted pod " + pod.Name + " still in the cache"
		}
	}
	for _, pod := range d.c.changes.createdBound {
		if _, err := c.GetPod(pod); err != nil {
			return "background pod " + pod.Name + " not in the cache"
		}
	}
	if why := d.c.dra.unconfirmedClaimDelete(); why != "" {
		return why
	}
	if n := c.NodeCount(); n != len(d.c.nodes.byName) {
		return fmt.Sprintf("cache has %d nodes, want %d", n, len(d.c.nodes.byName))
	}
	for _, name := range d.c.changes.tainted {
		info, err := c.GetNode(name)
		if err != nil || info.Node() == nil || !hasReclaimTaint(info.Node()) {
			return "node " + name + " taint not in the cache"
		}
	}
	return ""
}

// backoffWindow is the scheduling queue's backoff ordering window: a backoff
// counts as over once it ends before the window the clock is in.
const backoffWindow = time.Second

// unflushedBackoff names a pod whose backoff ended before the current virtual
// time but that the queue's flusher (woken by the clock step) has not moved
// to the active queue yet.
func (d *driver) unflushedBackoff() string {
	now := d.eng.clock.Now().Truncate(backoffWindow)
	for _, pod := range d.sched.SchedulingQueue.PodsInBackoffQ() {
		if exp := d.backoffExpiration(pod); !exp.IsZero() && exp.Before(now) {
			return "pod " + pod.Name + " finished its backoff but is still in the backoff queue"
		}
	}
	return ""
}

// backoffExpiration is when a pod in the backoff queue may be retried: its
// own backoff, or its pod group's for a member of a native PodGroup (zero
// when the queue no longer has it).
func (d *driver) backoffExpiration(pod *v1.Pod) time.Time {
	q := d.sched.SchedulingQueue
	if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		if info, ok := q.GetPodGroup(*g.PodGroupName, pod.Namespace, fwk.PodGroupKeyType); ok {
			return info.GetBackoffExpiration()
		}
		return time.Time{}
	}
	if info, ok := q.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup); ok {
		return info.GetBackoffExpiration()
	}
	return time.Time{}
}

func hasReclaimTaint(node *v1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == configv1.TaintGKEImpendingTermination {
			return true
		}
	}
	return false
}
