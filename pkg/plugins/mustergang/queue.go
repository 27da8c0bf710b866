package mustergang

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// Less orders the queue's entries by priority, then by when their gang (or
// the pod, when alone) was first seen, then by gang and pod name, so the
// members of a gang leave the queue together and the order is total. A
// Kubernetes PodGroup queued as one entry (GenericWorkload) sorts as its
// members would, ahead of them. The key never changes while an entry is
// queued and never calls the API server.
func (p *Plugin) Less(a, b fwk.QueuedEntityInfo) bool {
	// Priority first, from the entry itself (a pod's, or its PodGroup's):
	// most comparisons end here without looking the gangs up.
	if pa, pb := a.GetPriority(), b.GetPriority(); pa != pb {
		return pa > pb
	}
	ka, kb := p.sortKey(a), p.sortKey(b)
	if !ka.seen.Equal(kb.seen) {
		return ka.seen.Before(kb.seen)
	}
	if ka.group != kb.group {
		return ka.group < kb.group
	}
	return ka.name < kb.name
}

// queueSortKey is where an entry sorts among those of its priority: one key
// for every kind of entry, so that the order is transitive when pods and
// pod groups share the queue.
type queueSortKey struct {
	seen  time.Time
	group string
	name  string // "" for a pod group: it sorts before its members
}

func (p *Plugin) sortKey(e fwk.QueuedEntityInfo) queueSortKey {
	switch q := e.(type) {
	case *framework.QueuedPodInfo:
		if q.PodInfo != nil {
			seen, group := p.queueKey(q.Pod)
			return queueSortKey{seen: seen, group: group, name: q.Pod.Name}
		}
	case *framework.QueuedPodGroupInfo:
		if q.PodGroupInfo != nil {
			if pods := q.GetUnscheduledPods(); len(pods) > 0 {
				seen, group := p.queueKey(pods[0])
				return queueSortKey{seen: seen, group: group}
			}
			return queueSortKey{seen: e.GetTimestamp(), group: q.GetNamespace() + "/" + q.GetName()}
		}
	}
	return queueSortKey{seen: e.GetTimestamp()}
}

func (p *Plugin) queueKey(pod *v1.Pod) (time.Time, string) {
	if key, ok := gang.KeyOf(pod); ok {
		return p.gangs.FirstSeen(key, pod.CreationTimestamp.Time), key.String()
	}
	return pod.CreationTimestamp.Time, pod.Namespace + "/" + pod.Name
}

// EventsToRegister lists the events that can make a waiting gang
// schedulable. Hints answer Queue when unsure. A change of a gang's Job,
// StatefulSet or PodGroup (its quorum) is not registered here: it reaches the
// gang through the plugin's own informers (ownerHandler), whose listers the
// plugin reads. Registering it would start a second, cluster-wide dynamic
// informer per kind whose events can run ahead of those listers. The
// framework delivers a pending pod's own updates to it alone (TargetPod),
// never to its siblings, and no unscheduled pod's deletion: a sibling's
// change reaches the gang through the plugin's pod informer (wake.go).
//
// A member refused for another plugin's sake carries MusterGang's status: the
// plan's filter check runs the profile's PreFilter and Filter plugins, and a
// sibling held back by another PreEnqueue plugin keeps MusterGang's refusal.
// The framework then asks MusterGang's hints only, so the events and hints
// of those plugins are registered here as well (profileEvents).
func (p *Plugin) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	// Events that may make room: of a gang waiting for room they requeue
	// its lead only (throughLead).
	room := []fwk.ClusterEventWithHint{
		// A deleted pod frees capacity when it was bound. (A plan released
		// by another gang wakes the gangs waiting for capacity directly.)
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}},
		// New or grown nodes, changed labels (topology, spot) or taints; not
		// a node that only lost room (a reclaim notice taint, a cordon).
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel | fwk.UpdateNodeTaint},
			QueueingHintFn: nodeMayAddRoom},
	}
	if p.dra.enabled() {
		// DRA GPUs: a node's devices published or changed, a GPU class
		// made or changed, a claim released or deleted (devices freed) or
		// created (a member's claim from its template).
		room = append(room,
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceSlice, ActionType: fwk.Add | fwk.Update}},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.DeviceClass, ActionType: fwk.Add | fwk.Update}},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Add | fwk.Update | fwk.Delete}})
	}
	others, err := p.profileEvents(ctx)
	for i, e := range others {
		if e.Event.Resource != fwk.TargetPod {
			others[i].QueueingHintFn = p.throughLead(e.QueueingHintFn, queuedAlways(e.Event, room))
		}
	}
	for i, e := range room {
		room[i].QueueingHintFn = p.throughLead(e.QueueingHintFn, e.QueueingHintFn == nil)
	}
	room = append(room, others...)
	events := []fwk.ClusterEventWithHint{
		// A new member can complete a gang's quorum.
		{Event: fwk.ClusterEvent{Resource: fwk.UnscheduledPod, ActionType: fwk.Add}, QueueingHintFn: p.sameGangPod},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Add}, QueueingHintFn: p.sameGangPod},
	}
	if workloadGroups() {
		// A Kubernetes PodGroup created after its pods, or its minCount
		// changed (mutable in 1.37), can complete its gang's quorum.
		events = append(events, fwk.ClusterEventWithHint{
			Event: fwk.ClusterEvent{Resource: fwk.PodGroup, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: sameWorkloadGroup})
	}
	return append(events, room...), err
}

// throughLead wraps hint (nil: always Queue) so that an event that may
// make room for a gang waiting for it (gang.Manager.Lead) requeues one
// member, not all. Every member was refused with the gang, so each such
// event used to requeue them all; the first planned again and the others
// reused its answer. A queued gang is tried at every freed capacity, and on
// a full cluster that was most of muster's work (BENCHMARKS.md, "A
// contended soak"). Now a member other than the lead is skipped when the
// lead is requeued by the same event: the lead's cycle plans the gang, and
// a plan wakes the others (gang.WakePlanMade). A member is still requeued
// on its own answer when the lead's is Skip (a new node only it may use),
// when the lead is no longer pending, and always for a Kubernetes PodGroup,
// which the framework queues as one entry. The pod's own updates
// (TargetPod) are not wrapped: they reach that pod alone.
//
// leadQueued says the lead is requeued by every such event (a hint of
// muster's own without condition matches it): the lead's answer is not
// asked, a hint costs as much as a NodeInfo of the event's pod.
func (p *Plugin) throughLead(hint fwk.QueueingHintFn, leadQueued bool) fwk.QueueingHintFn {
	answer := func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		if hint == nil {
			return fwk.Queue, nil
		}
		return hint(logger, pod, oldObj, newObj)
	}
	return func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		if lead := p.leadOf(pod); lead != nil {
			if leadQueued {
				return fwk.QueueSkip, nil
			}
			if h, err := answer(logger, lead, oldObj, newObj); err == nil && h == fwk.Queue {
				return fwk.QueueSkip, nil
			}
		}
		return answer(logger, pod, oldObj, newObj)
	}
}

// queuedAlways reports whether one of muster's own events, registered
// without a hint, matches every event e does.
func queuedAlways(e fwk.ClusterEvent, own []fwk.ClusterEventWithHint) bool {
	for _, o := range own {
		if o.QueueingHintFn == nil && o.Event.Resource == e.Resource && e.ActionType&^o.Event.ActionType == 0 {
			return true
		}
	}
	return false
}

// leadOf is the pending member that carries the wakes of pod's gang while
// it waits for room; nil when that is pod itself or none.
func (p *Plugin) leadOf(pod *v1.Pod) *v1.Pod {
	key, inGang := gang.KeyOf(pod)
	if !inGang || key.Kind == gang.KindWorkloadPodGroup {
		return nil
	}
	uid, name, ok := p.gangs.Lead(key)
	if !ok || uid == pod.UID {
		return nil
	}
	obj, exists, err := p.source.pods.GetByKey(pod.Namespace + "/" + name)
	lead, isPod := obj.(*v1.Pod)
	if err != nil || !exists || !isPod || lead.UID != uid || lead.Spec.NodeName != "" || lead.DeletionTimestamp != nil {
		return nil
	}
	return lead
}

// profileEvents are the events, with their own hints, of the profile's
// other PreEnqueue, PreFilter and Filter plugins: those whose refusals
// reach the framework as MusterGang's. They take no informer of their own:
// those plugins registered the same events.
func (p *Plugin) profileEvents(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	profile, ok := p.handle.(interface {
		ListPlugins() *schedconfig.Plugins
		EnqueueExtensions() []fwk.EnqueueExtensions
	})
	if !ok {
		return nil, nil
	}
	refusers := sets.New[string]()
	if plugins := profile.ListPlugins(); plugins != nil {
		for _, set := range []schedconfig.PluginSet{plugins.PreEnqueue, plugins.PreFilter, plugins.Filter} {
			for _, pl := range set.Enabled {
				refusers.Insert(pl.Name)
			}
		}
	}
	refusers.Delete(Name)
	var events []fwk.ClusterEventWithHint
	for _, ext := range profile.EnqueueExtensions() {
		if !refusers.Has(ext.Name()) {
			continue
		}
		theirs, err := ext.EventsToRegister(ctx)
		if err != nil {
			return nil, fmt.Errorf("events of plugin %s: %w", ext.Name(), err)
		}
		events = append(events, theirs...)
	}
	return events, nil
}

// sameGangPod queues a member when a sibling is bound, and when a pending
// sibling is added with the gang's quorum reached. A sibling added before
// that would only send every held member back through PreEnqueue to be held
// again: for a gang of 1000 created pod by pod, half a million PreEnqueue
// calls, which kept the queue's lock from the gang's own cycles.
func (p *Plugin) sameGangPod(_ klog.Logger, pod *v1.Pod, _, newObj interface{}) (fwk.QueueingHint, error) {
	added, ok := newObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, nil
	}
	mine, inGang := gang.KeyOf(pod)
	theirs, _ := gang.KeyOf(added)
	if !inGang || mine != theirs {
		return fwk.QueueSkip, nil
	}
	if added.Spec.NodeName == "" && !p.source.quorumReachedWith(added) {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
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

// PreEnqueue keeps members of a gang that has fewer pods than its quorum out
// of the scheduling queue. It writes no pod condition (the framework does not
// for PreEnqueue), so the wait is explained by an Event on the Job or
// PodGroup and by the PodGroup status.
func (p *Plugin) PreEnqueue(ctx context.Context, pod *v1.Pod) *fwk.Status {
	// A member's own invalid annotation does not stop its gang's quorum
	// from being counted; PreFilter explains it once the gang is whole.
	info, ok, err := p.source.resolve(pod)
	if errors.Is(err, errPodGroupsNotListed) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if !ok || info.Quorum == 0 {
		return nil // scheduled alone, or its owner cannot be read: explained with a condition by PreFilter
	}
	p.gangs.FirstSeen(info.Key, pod.CreationTimestamp.Time)
	total := p.source.keptLiveCount(info.Key)
	if total >= info.Quorum {
		return nil
	}
	p.explainShortLater(info)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, shortMessage(info.Key, total, info.Quorum))
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
func (p *Plugin) explainShortLater(info *gang.Resolved) {
	key, quorum, owner, due := info.Key, info.Quorum, info.Ref, p.now().Add(membersGrace)
	p.timers.once(membersCheck(key), membersGrace, func() {
		// The quorum is read again: a check armed before the quorum was
		// raised is the one that fires for the members held after it.
		quorum := p.source.currentQuorum(key, quorum)
		if total := p.source.liveCount(key); total < quorum {
			// At the time the check was due: a timer's callback must not
			// read a fake clock that is running it.
			p.carryOut(p.handlerCtx(), p.gangs.Refused(key, gang.Refusal{Outcome: gang.OutcomeWaitingForMembers, Message: shortMessage(key, total, quorum)}, due), owner)
		}
	})
}
