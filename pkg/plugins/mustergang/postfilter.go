package mustergang

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// PostFilter runs when a member could not go to its planned node, or was
// rejected by another plugin's PreFilter before muster's ran: something
// changed since the plan (a pod the default scheduler placed, a volume
// deleted). The plan is dropped at once, the waiting siblings released, and
// the (member, node) pair is avoided by the next plans. It also clears the
// pod's nomination, so a stale one never lingers.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	clear := framework.NewPostFilterResultWithNominatedNode("")
	key, plan := p.gangs.PlanOf(pod.UID)
	if plan == nil {
		// No plan: the gang (or the lone pod) does not fit. Preemption may
		// make room; otherwise any stale nomination is cleared.
		p.noteHeldOut(cs, pod, statuses)
		if msg := p.releaseEarlierAllocation(ctx, pod); msg != "" {
			return p.keptNomination(ctx, pod), fwk.NewStatus(fwk.Unschedulable, msg)
		}
		result, status := p.preempt(ctx, pod)
		if result == nil {
			result = p.keptNomination(ctx, pod)
		}
		p.forgetIfEnded(gang.LoneKey(pod)) // it may be deleted and held out
		return result, status
	}
	slot := plan.Slots[pod.UID]
	s, err := readState(cs)
	if msg, waiting := p.waitingForVictims(key, plan, slot, s, statuses); waiting {
		// Keep the hold; the end of the wait requeues the member.
		p.wakeAfterCacheLag(key, plan)
		return framework.NewPostFilterResultWithNominatedNode(slot), fwk.NewStatus(fwk.Unschedulable, msg)
	}
	now := p.now()
	if _, err := p.handle.SnapshotSharedLister().NodeInfos().Get(slot); err != nil {
		// The planned node left the cycle's snapshot before muster's node
		// handler dropped the plan: the same node change, no backoff.
		p.carryOut(ctx, p.gangs.NodeChanged(key, plan.ID, slot, "was deleted", now, now.Add(avoidFor)), nil)
		return clear, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%s: planned node %s was deleted", key.Subject(), slot))
	}
	why := "node is gone"
	if st := statuses.Get(slot); st != nil && len(st.Reasons()) > 0 {
		why = st.Message()
	}
	// A Filter refused the member where muster's PreFilter steered it: the
	// next plans avoid that pair.
	avoid := err == nil && s.slot == slot
	switch {
	case avoid:
	case err != nil && !errors.Is(err, fwk.ErrNotFound):
		// A state of the wrong type is a bug: report it, and do not guess
		// where the member was steered.
		klog.FromContext(ctx).Error(err, "PostFilter of a planned member", "pod", klog.KObj(pod), "gang", key)
		why = "its PreFilter state is unreadable: " + why
	default:
		// No state: another plugin's PreFilter rejected the member first.
		why = "rejected before muster's PreFilter ran: " + why
	}
	reason := fmt.Sprintf("member %s cannot go to its planned node %s: %s", pod.Name, slot, why)
	p.carryOut(ctx, p.gangs.PlanBroken(key, plan.ID, pod.UID, slot, reason, avoid, now, now.Add(avoidFor), p.backoffBase()), nil)
	return clear, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%s: %s", key.Subject(), reason))
}

// keptNomination clears pod's nomination, unless pods it preempted still
// terminate on that node (terminatingFor): as with DefaultPreemption, the
// nomination then keeps their room for it, and after a restart, when the
// gang manager has forgotten the preemption, it says where they are.
func (p *Plugin) keptNomination(ctx context.Context, pod *v1.Pod) *fwk.PostFilterResult {
	node := pod.Status.NominatedNodeName
	if node == "" || p.terminatingFor(ctx, pod, node) == 0 {
		node = ""
	}
	return framework.NewPostFilterResultWithNominatedNode(node)
}

// noteHeldOut tells the gang manager whether Filter kept a pod scheduled
// alone off capacity that gang plans hold (heldByPlans): when such a plan
// is dropped, no cluster event moves the pod, and the drop must wake it.
func (p *Plugin) noteHeldOut(cs fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) {
	s, err := readState(cs)
	if err != nil || s.slot != "" {
		return // a gang member, or refused before muster's Filter ran
	}
	heldOut := false
	for node := range s.held {
		if st := statuses.Get(node); st != nil && st.Plugin() == Name && slices.Contains(st.Reasons(), heldByPlans) {
			heldOut = true
			break
		}
	}
	p.gangs.HeldOut(gang.LoneKey(pod), heldOut, p.now())
}

// waitingForVictims reports whether a member was turned away only because
// its plan still waits for the pods it preempted (victimsPending), or
// muster's own PreFilter held the member back for them (s, its state; the
// last one went since). Any other refusal, muster's own included (the node
// is being reclaimed), is a refusal.
func (p *Plugin) waitingForVictims(key gang.Key, plan *gang.ActivePlan, slot string, s *cycleState, statuses fwk.NodeToStatusReader) (string, bool) {
	if msg, waiting := p.victimsPending(key, plan); waiting {
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

// victimsPending reports whether plan still waits for the pods it
// preempted: some have not terminated, or the cycle's snapshot still shows
// one on a planned node (muster's informer can see a victim go before the
// scheduler's cache does).
func (p *Plugin) victimsPending(key gang.Key, plan *gang.ActivePlan) (string, bool) {
	if n := plan.Victims.Len(); n > 0 {
		return fmt.Sprintf("%s waits for %d preempted pods to terminate", key.Subject(), n), true
	}
	if cached := p.slotWithEvictedPod(plan); cached != "" {
		return fmt.Sprintf("%s waits for preempted pods to leave %s", key.Subject(), cached), true
	}
	return "", false
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

// avoidFor is how long a (member, node) pair the framework rejected in a
// real cycle is kept out of new plans.
const avoidFor = time.Minute

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
