package mustergang

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/equality"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// Less orders pods by priority, then by when their gang (or the pod, when
// alone) was first seen, then by gang and pod name, so the members of a gang
// leave the queue together and the order is total. The key never changes
// while a pod is queued and never calls the API server.
func (p *Plugin) Less(a, b fwk.QueuedEntityInfo) bool {
	pa, pb := queuedPod(a), queuedPod(b)
	if pa == nil || pb == nil {
		if a.GetPriority() != b.GetPriority() {
			return a.GetPriority() > b.GetPriority()
		}
		return a.GetTimestamp().Before(b.GetTimestamp())
	}
	prioA, prioB := corev1helpers.PodPriority(pa), corev1helpers.PodPriority(pb)
	if prioA != prioB {
		return prioA > prioB
	}
	seenA, groupA := p.queueKey(pa)
	seenB, groupB := p.queueKey(pb)
	if !seenA.Equal(seenB) {
		return seenA.Before(seenB)
	}
	if groupA != groupB {
		return groupA < groupB
	}
	return pa.Name < pb.Name
}

func queuedPod(e fwk.QueuedEntityInfo) *v1.Pod {
	if qp, ok := e.(*framework.QueuedPodInfo); ok && qp.PodInfo != nil {
		return qp.Pod
	}
	return nil
}

func (p *Plugin) queueKey(pod *v1.Pod) (time.Time, string) {
	if key, ok := gang.KeyOf(pod); ok {
		return p.gangs.FirstSeen(key, pod.CreationTimestamp.Time), key.String()
	}
	return pod.CreationTimestamp.Time, pod.Namespace + "/" + pod.Name
}

// EventsToRegister lists the pod and node events that can make a waiting
// gang schedulable. Hints answer Queue when unsure. A change of a gang's Job,
// StatefulSet or PodGroup (its quorum) is not registered here: it reaches the
// gang through the plugin's own informers (ownerHandler), whose listers the
// plugin reads. Registering it would start a second, cluster-wide dynamic
// informer per kind whose events can run ahead of those listers. These hints
// are the framework's path to the active queue; muster's own (wake.go) covers
// what no registered event shows.
func (p *Plugin) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	events := []fwk.ClusterEventWithHint{
		// A new member can complete a gang's quorum.
		{Event: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Add}, QueueingHintFn: p.sameGangPod},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Add}, QueueingHintFn: p.sameGangPod},
		// A member whose scheduling gates are removed can now be planned.
		{Event: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.UpdatePodSchedulingGatesEliminated}, QueueingHintFn: p.sameGangPod},
		// A deleted pod frees capacity when it was bound; a member's
		// deletion or success changes its own gang. (A plan released by
		// another gang wakes the gangs waiting for capacity directly.)
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}},
		{Event: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Delete}, QueueingHintFn: p.sameGangDeleted},
		// New or grown nodes, changed labels (topology, spot) or taints; not
		// a node that only lost room (a reclaim notice taint, a cordon).
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel | fwk.UpdateNodeTaint},
			QueueingHintFn: nodeMayAddRoom},
	}
	if workloadGroups() {
		// A Kubernetes PodGroup created after its pods, or its minCount
		// changed (mutable in 1.37), can complete its gang's quorum.
		events = append(events, fwk.ClusterEventWithHint{
			Event: fwk.ClusterEvent{Resource: fwk.PodGroup, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: sameWorkloadGroup})
	}
	if p.dra.enabled() {
		// DRA GPUs: a node's devices published or changed, a GPU class
		// made or changed, a claim released or deleted (devices freed) or
		// created (a member's claim from its template).
		events = append(events,
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update}},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.DeviceClass, ActionType: fwk.Add | fwk.Update}},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Add | fwk.Update | fwk.Delete}})
	}
	return events, nil
}

func (p *Plugin) sameGangPod(_ klog.Logger, pod *v1.Pod, _, newObj interface{}) (fwk.QueueingHint, error) {
	added, ok := newObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, nil
	}
	mine, inGang := gang.KeyOf(pod)
	theirs, _ := gang.KeyOf(added)
	if inGang && mine == theirs {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

func sameWorkloadGroup(_ klog.Logger, pod *v1.Pod, _, newObj interface{}) (fwk.QueueingHint, error) {
	pg, ok := newObj.(*schedulingv1beta1.PodGroup)
	if !ok {
		return fwk.Queue, nil
	}
	if key, inGang := gang.KeyOf(pod); inGang && key == (gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: pg.Namespace, Name: pg.Name}) {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// nodeMayAddRoom skips node updates that can only take room away: taints
// added (none removed) or the node cordoned, with labels and allocatable
// unchanged.
func nodeMayAddRoom(_ klog.Logger, _ *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	oldNode, ok1 := oldObj.(*v1.Node)
	newNode, ok2 := newObj.(*v1.Node)
	if !ok1 || !ok2 {
		return fwk.Queue, nil // an add, or unsure
	}
	if !equality.Semantic.DeepEqual(oldNode.Labels, newNode.Labels) ||
		!equality.Semantic.DeepEqual(oldNode.Status.Allocatable, newNode.Status.Allocatable) ||
		(oldNode.Spec.Unschedulable && !newNode.Spec.Unschedulable) {
		return fwk.Queue, nil
	}
	for _, t := range oldNode.Spec.Taints {
		if !taintIn(t, newNode.Spec.Taints) {
			return fwk.Queue, nil // a taint was removed
		}
	}
	return fwk.QueueSkip, nil
}

func taintIn(t v1.Taint, taints []v1.Taint) bool {
	for _, o := range taints {
		if o.Key == t.Key && o.Value == t.Value && o.Effect == t.Effect {
			return true
		}
	}
	return false
}

// sameGangDeleted: an unscheduled pod's deletion frees nothing (a plan it
// was part of is released through the gang manager), except for its own gang.
func (p *Plugin) sameGangDeleted(logger klog.Logger, pod *v1.Pod, oldObj, _ interface{}) (fwk.QueueingHint, error) {
	return p.sameGangPod(logger, pod, nil, oldObj)
}

// PreEnqueue keeps members of a gang that has fewer pods than its quorum out
// of the scheduling queue. It writes no pod condition (the framework does not
// for PreEnqueue), so the wait is explained by an Event on the Job or
// PodGroup and by the PodGroup status.
func (p *Plugin) PreEnqueue(ctx context.Context, pod *v1.Pod) *fwk.Status {
	info, ok, err := p.source.resolve(pod)
	if !ok || err != nil {
		return nil // scheduled alone, or explained with a condition by PreFilter
	}
	p.gangs.FirstSeen(info.key, pod.CreationTimestamp.Time)
	total := p.source.members(info.key).total
	if total >= info.quorum {
		return nil
	}
	p.explainShortLater(info)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, shortMessage(info.key, total, info.quorum))
}

// membersGrace is how long a gang may lack members before muster says so. A
// Job controller or a client creates a gang's pods one after another; a gang
// whose pods all arrive within the grace needs no explanation, and an Event
// and a PodGroup status write for every such gang cost API calls that a
// burst of gangs pays for in throughput.
const membersGrace = time.Second

func shortMessage(key gang.Key, total, quorum int) string {
	return fmt.Sprintf("gang %s has %d of %d members; waiting for the rest to be created", key, total, quorum)
}

// explainShortLater explains, with GangWaitingForMembers, a gang that still
// has fewer pods than its quorum membersGrace after a member was held for
// it. One check per gang is pending at a time; a member held after a check
// fired arms the next.
func (p *Plugin) explainShortLater(info *gangInfo) {
	key, quorum, owner, due := info.key, info.quorum, info.owner, p.now().Add(membersGrace)
	p.timers.once(membersCheck(key), membersGrace, func() {
		if total := p.source.members(key).total; total < quorum {
			// At the time the check was due: a timer's callback must not
			// read a fake clock that is running it.
			p.carryOut(p.handlerCtx(), p.gangs.Refused(key, gang.Refusal{Outcome: gang.OutcomeWaitingForMembers, Message: shortMessage(key, total, quorum)}, due), owner)
		}
	})
}
