package sim

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// The scheduling loop is paused while a step's changes are applied, so the
// scheduler sees all changes of one virtual instant at once, in the order its
// queue sorts them, however fast this machine creates objects. Without it,
// which gang is planned first would depend on how far object creation had
// got when the scheduler looked: the same seed could place differently.
//
// Pausing works through the scheduler's exported NextEntity hook: the
// simulator creates a barrier pod (top priority, never schedulable), and the
// wrapped NextEntity parks the loop when it pops it, until the step's changes
// are delivered.

const barrierLabel = "sim.muster.dev/barrier"

// handlerMargin lets the scheduler's own event handlers finish the last
// change after the simulator has confirmed it reached them.
const handlerMargin = 250 * time.Microsecond

// pollInterval is how long the harness waits between two looks at the
// scheduler's state.
const pollInterval = 50 * time.Microsecond

func (h *harness) installBarrier(ctx context.Context) {
	pop := h.sched.NextEntity
	h.sched.NextEntity = func(logger klog.Logger) (framework.QueuedEntityInfo, error) {
		for {
			entity, err := pop(logger)
			if err != nil || entity == nil {
				return entity, err
			}
			info, ok := entity.(*framework.QueuedPodInfo)
			if !ok || info.Pod == nil || info.Pod.Labels[barrierLabel] == "" {
				logger.V(4).Info("Simulator: popped", "entity", klog.KObj(entity))
				return entity, nil
			}
			h.sched.SchedulingQueue.Done(info.Pod.UID)
			select {
			case h.parked <- struct{}{}:
			case <-ctx.Done():
				return nil, nil
			}
			select {
			case <-h.resumed:
			case <-ctx.Done():
				return nil, nil
			}
		}
	}
}

func barrierPod(step uint64, schedulerName string, created time.Duration) *v1.Pod {
	name := fmt.Sprintf("sim-barrier-%d", step)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, UID: types.UID("pod-" + name),
			CreationTimestamp: metav1.NewTime(epoch.Add(created)),
			Labels:            map[string]string{barrierLabel: "true"},
		},
		Spec: v1.PodSpec{
			SchedulerName: schedulerName,
			// Popped before anything queued, in every profile's QueueSort.
			Priority:     ptr.To[int32](2_000_000_000),
			NodeSelector: map[string]string{barrierLabel: "never"},
			Containers:   []v1.Container{{Name: "barrier", Image: "registry.k8s.io/pause:3.10"}},
		},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}
}

// pause parks the scheduling loop: it is idle (the previous step settled),
// so the barrier pod is the next thing it pops.
func (h *harness) pause(ctx context.Context) error {
	pod := barrierPod(h.stepIndex, h.b.schedulerName, h.now)
	h.counts.want(kindPodAdd)
	if _, err := h.cs.CoreV1().Pods(namespace).Create(ctx, versioned(&h.resourceVersion, pod), metav1.CreateOptions{}); err != nil {
		return err
	}
	select {
	case <-h.parked:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(h.opts.StepTimeout):
		return fmt.Errorf("the scheduling loop did not reach the step barrier within %s", h.opts.StepTimeout)
	}
	h.counts.want(kindPodDelete)
	h.deletions.mine(pod.Name)
	return h.cs.CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
}

// resume lets the scheduling loop go on.
func (h *harness) resume() { h.resumed <- struct{}{} }

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
func (h *harness) waitDelivered(ctx context.Context) error {
	if err := h.waitFor(ctx, h.scheduledChanges); err != nil {
		return err
	}
	for _, pod := range h.changes.created {
		h.counts.want(kindPodUngate)
		patch := fmt.Sprintf(`{"metadata":{"resourceVersion":"%d"},"spec":{"schedulingGates":null}}`, h.resourceVersion.Add(1))
		if _, err := h.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("lifting the scheduling gate of %s: %w", pod.Name, err)
		}
	}
	q := h.sched.SchedulingQueue
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
		for _, pod := range h.changes.created {
			if unschedulable[pod.UID] {
				gated[pod.Namespace+"/"+pod.Name] = pod
			}
		}
		return gated
	}
	if err := h.waitCaughtUp(ctx); err != nil {
		return err
	}
	// A pod that a plugin's PreEnqueue held while the gate was still on is
	// only re-checked on events that plugin registered; the lifted gate is
	// not one of them. Activate re-runs PreEnqueue now that the step is
	// complete.
	if gated := stillGated(); len(gated) > 0 {
		q.Activate(klog.FromContext(ctx), gated)
	}
	return h.waitFor(ctx, func() string {
		for name := range stillGated() {
			return "pod " + name + " still gated in the queue"
		}
		return h.unflushedBackoff()
	})
}

// waitFor polls until the informers delivered every change and pending
// returns "".
func (h *harness) waitFor(ctx context.Context, pending func() string) error {
	deadline := time.Now().Add(h.opts.StepTimeout)
	for {
		why := "informers have not delivered every change"
		if h.counts.caughtUp() {
			why = pending()
		}
		if why == "" {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scheduler did not take in the step's changes within %s: %s", h.opts.StepTimeout, why)
		}
		h.pauser.pause(pollInterval)
	}
}

// waitCaughtUp polls until the informers delivered every change.
func (h *harness) waitCaughtUp(ctx context.Context) error {
	return h.waitFor(ctx, func() string { return "" })
}

// createdPodsQueued names a pod of the step the scheduler has not taken in
// (queued, or cached when the harness bound it).
func (h *harness) createdPodsQueued() string {
	q, c := h.sched.SchedulingQueue, h.sched.Cache
	for _, pod := range h.changes.created {
		if pod.Spec.NodeName != "" { // bound by the harness (None)
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
func (h *harness) scheduledChanges() string {
	q, c := h.sched.SchedulingQueue, h.sched.Cache
	for _, pod := range h.changes.deletedQueue {
		if _, ok := q.GetPod(pod.Name, pod.Namespace, pod.Spec.SchedulingGroup); ok {
			return "deleted pod " + pod.Name + " still queued"
		}
	}
	for _, pod := range h.changes.deletedBound {
		if _, err := c.GetPod(pod); err == nil {
			return "deleted pod " + pod.Name + " still in the cache"
		}
	}
	for _, pod := range h.changes.createdBound {
		if _, err := c.GetPod(pod); err != nil {
			return "background pod " + pod.Name + " not in the cache"
		}
	}
	if n := c.NodeCount(); n != len(h.nodes) {
		return fmt.Sprintf("cache has %d nodes, want %d", n, len(h.nodes))
	}
	for _, name := range h.changes.tainted {
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
func (h *harness) unflushedBackoff() string {
	now := h.clock.Now().Truncate(backoffWindow)
	for _, pod := range h.sched.SchedulingQueue.PodsInBackoffQ() {
		if exp := h.backoffExpiration(pod); !exp.IsZero() && exp.Before(now) {
			return "pod " + pod.Name + " finished its backoff but is still in the backoff queue"
		}
	}
	return ""
}

// backoffExpiration is when a pod in the backoff queue may be retried: its
// own backoff, or its pod group's for a member of a native PodGroup (zero
// when the queue no longer has it).
func (h *harness) backoffExpiration(pod *v1.Pod) time.Time {
	q := h.sched.SchedulingQueue
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
