package mustergang

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// PostFilter asks the gang manager what follows a cycle that found no node
// (gang.Decisions.Unplaced). A member that could not go to its planned node,
// or was rejected by another plugin's PreFilter before muster's ran, found
// something changed since the plan (a pod the default scheduler placed, a
// volume deleted): the plan is dropped at once, the waiting siblings
// released, and the (member, node) pair avoided by the next plans. A gang
// (or a pod alone) without a plan may preempt. A nomination nothing keeps
// is cleared, so a stale one never lingers.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	c := &cycle{p: p, ctx: ctx, state: cs, statuses: statuses}
	recourse := p.gangs.Decisions().Unplaced(c, pod)
	return p.enactRecourse(ctx, c, pod, recourse)
}

// enactRecourse carries out what the gang manager decided for pod's cycle
// that found no node (gang.Decisions.Unplaced, Preempt) and answers the
// framework: the node pod is nominated to, and why it waits.
func (p *Plugin) enactRecourse(ctx context.Context, c *cycle, pod *v1.Pod, r gang.Recourse) (*fwk.PostFilterResult, *fwk.Status) {
	p.follow(ctx, r.Followup, r.Owner)
	if r.WaitsForCache != nil {
		p.wakeAfterCacheLag(r.Key, r.WaitsForCache)
	}
	if r.Evict != 0 {
		p.startEvictions(ctx, c.found, pod, r.Key, r.Evict, r.Preempted)
	}
	result := framework.NewPostFilterResultWithNominatedNode(r.Nominate)
	if r.Err != nil {
		return result, fwk.AsStatus(r.Err)
	}
	return result, fwk.NewStatus(fwk.Unschedulable, r.Message)
}

// waitingForVictims reports whether a member was turned away only because
// its plan still waits for the pods it preempted (gang.VictimsAwaited), or
// muster's own PreFilter held the member back for them (s, its state; the
// last one went since). Any other refusal, muster's own included (the node
// is being reclaimed), is a refusal.
func (p *Plugin) waitingForVictims(key gang.Key, plan *gang.ActivePlan, slot string, s *cycleState, statuses fwk.NodeToStatusReader) (string, bool) {
	if msg := gang.VictimsAwaited(key, plan, p.victimsLingering); msg != "" {
		return msg, true
	}
	if s != nil && s.heldForVictims && s.planID == plan.ID {
		if st := statuses.Get(slot); st != nil {
			return st.Message(), true
		}
		return fmt.Sprintf("%s waits for preempted pods to terminate", key.Subject()), true
	}
	return "", false
}

// victimsLingering says what a plan whose victims are all deleted still
// waits for ("" when nothing; gang.VictimsAwaited).
func (p *Plugin) victimsLingering(plan *gang.ActivePlan) string {
	if cached := p.slotWithEvictedPod(plan); cached != "" {
		// Every victim is deleted, but the scheduler's cache (this
		// cycle's snapshot) still shows one on a planned node: muster's
		// informer saw it go first. Every member waits, not only the one
		// planned there: in a pod-group cycle a partial pass would count
		// as placed and the refused member would break the plan. The
		// PostFilter wakes the gang again once the cache has caught up.
		return "them to leave " + cached
	}
	if !p.devicesReleased(plan) {
		// The victims are gone but the DRA devices they held are not
		// released yet: the planned node would refuse the member now. A
		// ResourceClaim event wakes it.
		return "the devices they held to be released"
	}
	return ""
}

// slotWithEvictedPod is a planned node on which the cycle's snapshot still
// shows a pod preempted for plan ("" for none).
func (p *Plugin) slotWithEvictedPod(plan *gang.ActivePlan) string {
	if plan.Evicted.Len() == 0 {
		return ""
	}
	seen := make(map[string]bool, len(plan.Slots))
	for _, node := range plan.Slots {
		if !seen[node] {
			seen[node] = true
			if p.evictedStillCached(plan, node) {
				return node
			}
		}
	}
	return ""
}

// cacheLag is how long after muster's informer saw the last victim go the
// scheduler's cache is expected to have dropped it too.
const cacheLag = 200 * time.Millisecond

// wakeAfterCacheLag wakes the plan's members again once the scheduler's
// cache has had time to drop the victims, when that is what they wait for
// (every victim deleted, one still in the snapshot): the wake when the last
// victim went may have come while the members were in their cycle (the
// queue drops an activation that finds a pod group in flight), and that
// cycle held them back for the cache.
func (p *Plugin) wakeAfterCacheLag(key gang.Key, plan *gang.ActivePlan) {
	if plan.Victims.Len() > 0 || p.slotWithEvictedPod(plan) == "" {
		return
	}
	planID := plan.ID
	p.timers.forGang(key, cacheLag, func() {
		if plan := p.gangs.Plan(key); plan != nil && plan.ID == planID {
			p.wake(p.logger(), key, gang.WakeVictimsGone, p.unreservedSiblings(key, plan, ""))
		}
	})
}

// evictedStillCached reports whether the cycle's snapshot still shows a pod
// preempted for plan on node.
func (p *Plugin) evictedStillCached(plan *gang.ActivePlan, node string) bool {
	if plan.Evicted.Len() == 0 {
		return false
	}
	info, err := p.handle.SnapshotSharedLister().NodeInfos().Get(node)
	if err != nil {
		return false
	}
	for _, pi := range info.GetPods() {
		if plan.Evicted.Has(pi.GetPod().UID) {
			return true
		}
	}
	return false
}

// releaseEarlierAllocation undoes, as the DynamicResources PostFilter does,
// the allocation of one of the pending pod's ResourceClaims that an earlier
// attempt made (its binding failed after PreBind, or the scheduler
// stopped between the two) and that no one else uses: the claim is
// reserved for no one or for the pod alone. Such a claim ties the pod to
// the node it was allocated on, even one cordoned, full or gone; and
// DynamicResources never learns that it is unusable, since its Filter does
// not run for a gang muster could not plan. The next plan allocates anew.
// It returns what it did ("" for nothing).
func (p *Plugin) releaseEarlierAllocation(ctx context.Context, pod *v1.Pod) string {
	if pod.Spec.NodeName != "" {
		return ""
	}
	for _, c := range p.dra.podClaims(pod) {
		reserved := c.Status.ReservedFor
		if c.Status.Allocation == nil || len(reserved) > 1 || len(reserved) == 1 && reserved[0].UID != pod.UID {
			continue
		}
		claim := c.DeepCopy()
		claim.Status.ReservedFor, claim.Status.Allocation, claim.Status.Devices = nil, nil, nil
		if _, err := p.handle.ClientSet().ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				// Changed since the scheduler's view: the DynamicResources
				// PostFilter released it already (a pod alone), or its
				// binding went on. The next cycle sees which.
				return ""
			}
			klog.FromContext(ctx).Error(err, "Could not release the allocation of an earlier attempt", "pod", klog.KObj(pod), "claim", klog.KObj(claim))
			return ""
		}
		klog.FromContext(ctx).V(2).Info("Released the allocation of an earlier attempt", "pod", klog.KObj(pod), "claim", klog.KObj(claim))
		return fmt.Sprintf("released ResourceClaim %s, allocated by an earlier attempt, so that the next plan allocates it anew", claim.Name)
	}
	return ""
}
