package mustergang

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// permitGrace lets muster's own plan deadline, which is serialized with plan
// completion, fire before the framework's per-pod Permit timer.
const permitGrace = 5 * time.Second

// Reserve records that a planned member is assumed on its node: from now on
// the scheduler cache counts it and the ledger stops holding its slot.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if cs.IsPodGroupSchedulingCycle() {
		// The pod-group cycle's tentative pass, reverted before the real
		// Reserve (workloadgroup.go): only noted.
		if s, err := readState(cs); err == nil && s.pass != nil {
			s.pass.reserved(pod.UID)
		}
		return nil
	}
	s, err := readState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.slot != "" {
		p.gangs.Reserved(s.key, s.planID, pod.UID)
	}
	return nil
}

// Unreserve runs when a reserved member is rejected (Permit timeout, a
// sibling's failure) or its binding fails. A member of an unfinished plan
// takes that plan down; a member that was already allowed is just no longer
// in flight and will be placed again. Idempotent.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) {
	if cs.IsPodGroupSchedulingCycle() {
		return // the end of the pod-group cycle's tentative pass
	}
	s, err := readState(cs)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Unreserve without PreFilter state", "pod", klog.KObj(pod))
		return
	}
	if s.slot == "" {
		return
	}
	now := p.now()
	p.carryOut(ctx, p.gangs.Rejected(s.key, s.planID, pod.UID, pod.Name, nodeName, now, now.Add(gang.AvoidFor), p.backoffBase()), nil)
}

// Permit holds each member until every member of the plan is reserved, then
// releases them all together.
func (p *Plugin) Permit(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) (*fwk.Status, time.Duration) {
	s, err := readState(cs)
	if err != nil {
		return fwk.AsStatus(err), 0
	}
	if s.slot == "" {
		return nil, 0
	}
	if refused, atSlot := p.refusedInPass(s); refused != nil {
		// The pod-group cycle placed this member but refused a sibling:
		// the core counts the placed part as success, muster does not let
		// it bind without the rest. Only a refusal at the slot is the
		// node's: that pair is avoided.
		reason := fmt.Sprintf("member %s could not go to its planned node %s in the PodGroup's cycle", refused.name, refused.node)
		if !atSlot {
			reason = fmt.Sprintf("member %s was refused in the PodGroup's cycle before muster's PreFilter ran (see its PodScheduled condition)", refused.name)
		}
		now := p.now()
		p.carryOut(ctx, p.gangs.PlanBroken(s.key, s.planID, refused.uid, refused.node, reason, atSlot, now, now.Add(gang.AvoidFor), p.backoffBase()), nil)
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%s: %s", s.key.Subject(), reason)), 0
	}
	standing := p.source.live(s.key)
	live := func(uid types.UID) bool {
		// Every other reserved member returned Wait in an earlier cycle
		// (a pod-group cycle reserves and permits its members one by
		// one): one no longer among the waiting pods was turned away.
		return standing(uid) && (uid == pod.UID || p.handle.GetWaitingPod(uid) != nil)
	}
	// The owner read again: a quorum raised while the members were reserved
	// must not release the gang below it.
	quorum := 0
	if info, inGang, err := p.source.resolve(pod); inGang && err == nil {
		quorum = info.Quorum
	}
	arrival, plan, effects := p.gangs.Arrive(s.key, s.planID, pod.UID, p.now(), p.backoffBase(), &gang.ReleaseCheck{Live: live, Quorum: quorum})
	switch arrival {
	case gang.ArrivalDropped:
		p.carryOut(ctx, effects, nil) // the plan timed out as it arrived, or a reserved member (this one too) was deleted
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%s: the plan for this member was dropped", s.key.Subject())), 0
	case gang.ArrivalWait:
		// The planned members not reserved yet are woken so the gang
		// completes quickly; the wait ends at the plan deadline (plus a
		// grace so that muster's deadline, not the framework's timer,
		// decides).
		p.carryOut(ctx, effects, nil)
		return fwk.NewStatus(fwk.Wait, fmt.Sprintf("gang %s: %d of %d members reserved", s.key, plan.Reserved.Len(), len(plan.Slots))),
			plan.Deadline.Sub(p.now()) + permitGrace
	}
	p.carryOut(ctx, effects, nil) // allows the others; this one by returning success
	gangsScheduled.Inc()
	seen := p.gangs.FirstSeen(s.key, pod.CreationTimestamp.Time)
	gangLatency.Observe(p.now().Sub(seen).Seconds())
	klog.FromContext(ctx).V(2).Info("Gang released", "gang", s.key, "members", len(plan.Slots), "waited", p.now().Sub(plan.Created))
	return nil, 0
}

// rejectWaiting rejects the gang's members waiting at Permit: those in
// slots, or every waiting member of the gang when slots is nil (members
// left over from a plan that was dropped while they entered it). It returns
// those it rejected.
func (p *Plugin) rejectWaiting(key gang.Key, slots map[types.UID]string, msg string) sets.Set[types.UID] {
	rejected := sets.New[types.UID]()
	p.handle.IterateOverWaitingPods(func(wp fwk.WaitingPod) {
		pod := wp.GetPod()
		if k, ok := gang.KeyOf(pod); !ok || k != key {
			return
		}
		if _, in := slots[pod.UID]; in || slots == nil {
			wp.Reject(Name, msg)
			rejected.Insert(pod.UID)
		}
	})
	return rejected
}

// lateLookEvery and lateLookFor pace the look again for a reserved member
// of a dropped plan that is not among the waiting pods yet: the framework
// adds a pod to them right after the Permit plugins return, in the same
// scheduling cycle. That is a race between goroutines, so it is timed on
// the real clock, not on the plugin's (virtual in the simulator).
const (
	lateLookEvery = 5 * time.Millisecond
	lateLookFor   = time.Second
)

// reject carries out a Rejection: the members waiting now are turned away,
// and reserved members not waiting yet (their Permit returned Wait as the
// plan dropped) are looked for again, so they do not wait at Permit until
// the framework's timer with their nodes' resources assumed.
func (p *Plugin) reject(r *gang.Rejection) {
	rejected := p.rejectWaiting(r.Key, r.Members, r.Message)
	late := sets.New(r.Reserved...).Difference(rejected)
	if late.Len() > 0 {
		go p.rejectLate(r.Key, late, r.Message)
	}
}

// rejectLate rejects members uids of gang key once they wait at Permit,
// unless one waits for a newer plan of its gang. It gives up after
// lateLookFor (a member that was bound meanwhile never waits) or when the
// scheduler stops.
func (p *Plugin) rejectLate(key gang.Key, uids sets.Set[types.UID], msg string) {
	_ = wait.PollUntilContextTimeout(p.run, lateLookEvery, lateLookFor, true, func(context.Context) (bool, error) {
		for uid := range uids {
			wp := p.handle.GetWaitingPod(uid)
			if wp == nil {
				continue
			}
			uids.Delete(uid)
			if plan := p.gangs.Plan(key); plan == nil || !plan.Reserved.Has(uid) {
				wp.Reject(Name, msg)
			}
		}
		return uids.Len() == 0, nil
	})
}
