package mustergang

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// Reserve records that a planned member is assumed on its node: from now on
// the scheduler cache counts it and the ledger stops holding its slot.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if s := readState(cs); s != nil && s.slot != "" {
		p.registry.Reserve(s.key, pod.UID)
	}
	return nil
}

// Unreserve runs when a reserved member is rejected (Permit timeout, a
// sibling's failure) or its binding fails. A member of an unfinished plan
// takes the whole plan down; a member that was already allowed is just no
// longer in flight and will be placed again. Idempotent.
func (p *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) {
	key, ok := gang.KeyOf(pod)
	if !ok {
		return
	}
	p.registry.Settled(key, pod.UID)
	reason, cause := fmt.Sprintf("member %s was rejected or failed to bind on node %s", pod.Name, nodeName), "rejected"
	if plan := p.registry.Plan(key); plan != nil && !p.now().Before(plan.Deadline) {
		reason, cause = timeoutReason(plan), "timeout"
	}
	p.failPlan(ctx, key, func(plan *gang.ActivePlan) bool { _, in := plan.Slots[pod.UID]; return in }, cause, reason)
}

// Permit holds each member until every member of the plan is reserved, then
// releases them all together.
func (p *Plugin) Permit(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) (*fwk.Status, time.Duration) {
	s := readState(cs)
	if s == nil || s.slot == "" {
		return nil, 0
	}
	planned, complete := p.registry.Reserve(s.key, pod.UID)
	if !planned {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: the plan for this member was dropped", s.key)), 0
	}
	if !complete {
		plan := p.registry.Plan(s.key)
		if plan == nil {
			return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: the plan for this member was dropped", s.key)), 0
		}
		wait := plan.Deadline.Sub(p.now())
		if wait <= 0 {
			return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: plan deadline passed", s.key)), 0
		}
		pending, _, _ := p.members(s.key)
		p.activate(klog.FromContext(ctx), pending, plan.Slots, pod.UID)
		return fwk.NewStatus(fwk.Wait, fmt.Sprintf("gang %s: %d of %d members reserved", s.key, plan.Reserved.Len(), len(plan.Slots))), wait
	}
	plan := p.registry.Complete(s.key)
	if plan == nil {
		return nil, 0
	}
	// Allow the siblings waiting at Permit; this member is allowed by
	// returning success.
	for uid := range plan.Slots {
		if uid == pod.UID {
			continue
		}
		if wp := p.handle.GetWaitingPod(uid); wp != nil {
			wp.Allow(Name)
		}
	}
	gangsScheduled.Inc()
	seen := p.registry.FirstSeen(s.key, pod.CreationTimestamp.Time)
	gangLatency.Observe(p.now().Sub(seen).Seconds())
	info, _, _ := p.resolve(pod)
	if info != nil {
		p.notice(ctx, info, v1.EventTypeNormal, ReasonScheduled, fmt.Sprintf("gang %s: all %d planned members reserved on %d nodes in %s %s; binding",
			s.key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain))
	}
	klog.FromContext(ctx).V(2).Info("Gang released", "gang", s.key, "members", len(plan.Slots), "waited", p.now().Sub(plan.Created))
	return nil, 0
}

// failPlan drops the gang's plan (when match accepts it), rejects members
// waiting at Permit, backs the gang off and wakes its members when the
// backoff ends.
func (p *Plugin) failPlan(ctx context.Context, key gang.Key, match func(*gang.ActivePlan) bool, cause, reason string) {
	backoff := time.Duration(p.args.GangBackoffSeconds) * time.Second
	plan := p.registry.Fail(key, match, reason, p.now().Add(backoff))
	if plan == nil {
		return
	}
	logger := klog.FromContext(ctx)
	rejections.WithLabelValues(cause).Inc()
	if cause == "timeout" {
		timeouts.Inc()
	}
	msg := fmt.Sprintf("gang %s: %s; released all %d planned members", key, reason, len(plan.Slots))
	for uid := range plan.Slots {
		if wp := p.handle.GetWaitingPod(uid); wp != nil {
			wp.Reject(Name, msg)
		}
	}
	logger.V(2).Info("Gang plan dropped", "gang", key, "cause", cause, "reason", reason)
	eventReason := ReasonRejected
	if cause == "timeout" {
		eventReason = ReasonTimeout
	}
	p.noticeKey(ctx, key, v1.EventTypeWarning, eventReason, msg)
	time.AfterFunc(backoff, func() {
		pending, _, _ := p.members(key)
		p.activate(logger, pending, nil, "")
	})
}

// expirePlan ends plan id if it did not complete before its deadline.
func (p *Plugin) expirePlan(key gang.Key, id int64) {
	plan := p.registry.Plan(key)
	if plan == nil || plan.ID != id {
		return
	}
	p.failPlan(context.Background(), key, func(current *gang.ActivePlan) bool { return current.ID == id }, "timeout", timeoutReason(plan))
}

func timeoutReason(plan *gang.ActivePlan) string {
	return fmt.Sprintf("timed out after %s with %d of %d members reserved",
		plan.Deadline.Sub(plan.Created).Round(time.Second), plan.Reserved.Len(), len(plan.Slots))
}
