package mustergang

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// dropCause says why a plan was dropped: the rejections metric's label,
// the outcome announced, and whether the gang backs off.
type dropCause int

const (
	// dropTimeout: the deadline passed before every member was reserved.
	dropTimeout dropCause = iota
	// dropRejected: a member was rejected at Reserve or Permit, or failed
	// to bind.
	dropRejected
	// dropMemberDeleted: a planned member was deleted or finished.
	dropMemberDeleted
	// dropPlanBroken: a member could not go to its planned node.
	dropPlanBroken
	// dropNodeChanged: a planned node was deleted, cordoned, started being
	// reclaimed or stopped matching its member.
	dropNodeChanged
)

var dropCauseNames = [...]string{
	dropTimeout:       "timeout",
	dropRejected:      "rejected",
	dropMemberDeleted: "member_deleted",
	dropPlanBroken:    "plan_broken",
	dropNodeChanged:   "node_changed",
}

func (c dropCause) String() string { return dropCauseNames[c] }

// backsOff reports whether the gang waits before it is planned again: not
// when the cluster changed under a plan that was fine.
func (c dropCause) backsOff() bool { return c != dropNodeChanged }

func (c dropCause) outcome() gang.Outcome {
	if c == dropTimeout {
		return gang.OutcomeTimedOut
	}
	return gang.OutcomeRejected
}

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
		p.registry.Reserve(s.key, s.planID, pod.UID)
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
	p.registry.Settled(s.key, pod.UID)
	if plan := p.registry.Plan(s.key); plan != nil && plan.ID == s.planID {
		// The plan is still active, so muster did not reject this member:
		// its own Reserve or Permit failed on the node (another plugin's,
		// or the framework's timeout). The next plan must not put it there
		// again, or the same plan comes back after the backoff.
		p.avoid(s.key, nodeName, pod.UID)
	}
	p.failPlan(ctx, s.key, s.planID, dropRejected, fmt.Sprintf("member %s was rejected or failed to bind on node %s", pod.Name, nodeName))
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
	if refused := s.pass.refusedMember(); refused != nil {
		// The pod-group cycle placed this member but refused a sibling at
		// its slot: the core counts the placed part as success, muster
		// does not let it bind without the rest.
		reason := fmt.Sprintf("member %s could not go to its planned node %s in the PodGroup's cycle", refused.name, refused.node)
		p.avoid(s.key, refused.node, refused.uid)
		p.failPlan(ctx, s.key, s.planID, dropPlanBroken, reason)
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: %s", s.key, reason)), 0
	}
	outcome, plan := p.registry.Permit(s.key, s.planID, pod.UID, p.now())
	switch outcome {
	case gang.PermitDropped:
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: the plan for this member was dropped", s.key)), 0
	case gang.PermitWait:
		// Wake the planned members not reserved yet so the gang completes
		// quickly; the wait ends at the plan deadline (plus a grace so that
		// muster's deadline, not the framework's timer, decides).
		p.wake(klog.FromContext(ctx), s.key, wakeMemberWaiting, p.unreservedSiblings(s.key, plan, pod.UID))
		return fwk.NewStatus(fwk.Wait, fmt.Sprintf("gang %s: %d of %d members reserved", s.key, plan.Reserved.Len(), len(plan.Slots))),
			plan.Deadline.Sub(p.now()) + permitGrace
	}
	for uid := range plan.Slots {
		if uid == pod.UID {
			continue // allowed by returning success
		}
		if wp := p.handle.GetWaitingPod(uid); wp != nil {
			wp.Allow(Name)
		}
	}
	p.endDeadline(plan.ID)
	gangsScheduled.Inc()
	seen := p.registry.FirstSeen(s.key, pod.CreationTimestamp.Time)
	gangLatency.Observe(p.now().Sub(seen).Seconds())
	p.noticeKey(ctx, s.key, gang.OutcomeScheduled, fmt.Sprintf("gang %s: all %d planned members reserved on %d nodes in %s %s; binding",
		s.key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain))
	klog.FromContext(ctx).V(2).Info("Gang released", "gang", s.key, "members", len(plan.Slots), "waited", p.now().Sub(plan.Created))
	return nil, 0
}

// failPlan drops the gang's plan planID (0: whatever plan it has), rejects
// members waiting at Permit, backs the gang off (unless the cause was not
// its doing), and wakes its members when the backoff ends. Gangs that could not be placed are retried at once: the
// capacity this plan held is free again.
func (p *Plugin) failPlan(ctx context.Context, key gang.Key, planID int64, cause dropCause, reason string) {
	var base time.Duration
	if cause.backsOff() {
		base = time.Duration(p.args.GangBackoffSeconds) * time.Second
	}
	plan, backoff := p.registry.Fail(key, planID, reason, p.now(), base)
	if plan == nil {
		return
	}
	p.endDeadline(plan.ID)
	logger := klog.FromContext(ctx)
	rejections.WithLabelValues(cause.String()).Inc()
	if cause == dropTimeout {
		timeouts.Inc()
	}
	msg := fmt.Sprintf("gang %s: %s; released all %d planned members (retry in %s)", key, reason, len(plan.Slots), backoff)
	p.rejectWaiting(key, plan.Slots, msg)
	logger.V(2).Info("Gang plan dropped", "gang", key, "cause", cause.String(), "reason", reason, "backoff", backoff)
	outcome := cause.outcome()
	p.noticeKey(ctx, key, outcome, msg)
	for _, other := range p.registry.Failing(gang.OutcomeUnschedulable) {
		p.wake(logger, other, wakeCapacityFreed, p.pendingInAnyProfile(other))
	}
	p.after(backoff, func() {
		p.wake(p.logger, key, wakeBackoffEnded, p.members(key).pending)
	})
}

// rejectWaiting rejects the gang's members waiting at Permit: those in
// slots, or every waiting member of the gang when slots is nil (members
// left over from a plan that was dropped while they entered it). It returns
// how many it rejected.
func (p *Plugin) rejectWaiting(key gang.Key, slots map[types.UID]string, msg string) int {
	rejected := 0
	p.handle.IterateOverWaitingPods(func(wp fwk.WaitingPod) {
		pod := wp.GetPod()
		if k, ok := gang.KeyOf(pod); !ok || k != key {
			return
		}
		if _, in := slots[pod.UID]; in || slots == nil {
			wp.Reject(Name, msg)
			rejected++
		}
	})
	return rejected
}

// expirePlan ends plan id if it did not complete before its deadline.
func (p *Plugin) expirePlan(key gang.Key, id int64) {
	plan := p.registry.Plan(key)
	if plan == nil || plan.ID != id {
		return
	}
	reason := fmt.Sprintf("timed out after %s with %d of %d members reserved",
		plan.Deadline.Sub(plan.Created).Round(time.Second), plan.Reserved.Len(), len(plan.Slots))
	p.failPlan(p.handlerCtx(), key, id, dropTimeout, reason)
}
