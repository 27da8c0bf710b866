package sim

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"
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

// pollInterval is how long the driver waits between two looks at the
// scheduler's state.
const pollInterval = 50 * time.Microsecond

func (d *driver) installBarrier(ctx context.Context) {
	pop := d.sched.NextEntity
	d.sched.NextEntity = func(logger klog.Logger) (framework.QueuedEntityInfo, error) {
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
			d.sched.SchedulingQueue.Done(info.Pod.UID)
			select {
			case d.parked <- struct{}{}:
			case <-ctx.Done():
				return nil, nil
			}
			select {
			case <-d.resumed:
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
func (d *driver) pause(ctx context.Context) error {
	pod := barrierPod(d.eng.steps, d.b.schedulerName, d.eng.now)
	d.c.counts.want(kindPodAdd)
	if _, err := d.c.cs.CoreV1().Pods(namespace).Create(ctx, versioned(d.c.resourceVersion, pod), metav1.CreateOptions{}); err != nil {
		return err
	}
	select {
	case <-d.parked:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d.stepTimeout):
		return fmt.Errorf("the scheduling loop did not reach the step barrier within %s", d.stepTimeout)
	}
	d.c.counts.want(kindPodDelete)
	d.c.deletions.mine(pod.Name)
	return d.c.cs.CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
}

// resume lets the scheduling loop go on.
func (d *driver) resume() { d.resumed <- struct{}{} }
