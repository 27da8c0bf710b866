package mustergang

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

// carryOut does what a transition of the gang manager asks, in the order
// of gang.Effects. owner is the object Events about the gang go on when the
// caller has it; nil looks it up.
func (p *Plugin) carryOut(ctx context.Context, e gang.Effects, owner *v1.ObjectReference) {
	logger := klog.FromContext(ctx)
	if e.StopDeadline != 0 {
		p.timers.cancel(planDeadline(e.StopDeadline))
	}
	if e.Installed != 0 {
		plansInstalled.Inc()
	}
	if d := e.Dropped; d != nil {
		rejections.WithLabelValues(d.Cause.String()).Inc()
		logger.V(2).Info("Gang plan dropped", "gang", d.Key, "cause", d.Cause.String(), "reason", d.Reason, "backoff", d.Backoff)
	}
	if r := e.Reject; r != nil {
		p.reject(r)
	}
	for _, uid := range e.Allow {
		if wp := p.handle.GetWaitingPod(uid); wp != nil {
			wp.Allow(Name)
		}
	}
	if e.Notice != nil {
		p.publish(ctx, *e.Notice, owner)
		p.provisioning.noticed(*e.Notice)
	}
	for _, w := range e.Wake {
		p.wake(logger, w.Key, w.Reason, p.wakeTargets(w))
	}
	for _, t := range e.Timers {
		p.setTimer(t)
	}
	for _, d := range e.Displaced {
		p.carryOut(ctx, d, nil)
	}
}

// follow carries out what a decision of the gang manager asks: the
// effects of its transitions (their notices on owner; nil looks it up),
// and the timers of the gangs it forgot go.
func (p *Plugin) follow(ctx context.Context, f gang.Followup, owner *v1.ObjectReference) {
	for _, e := range f.Effects {
		p.carryOut(ctx, e, owner)
	}
	for _, key := range f.Forgotten {
		p.timers.forget(key)
		p.provisioning.forget(key)
	}
}

// wakeTargets are the pods a wake asks for.
func (p *Plugin) wakeTargets(w gang.Wake) []*v1.Pod {
	switch {
	case w.Plan != nil:
		return p.unreservedSiblings(w.Key, w.Plan, w.Except)
	case w.AllProfiles:
		return p.source.pendingInAnyProfile(w.Key)
	}
	return p.source.members(w.Key).pending
}

// setTimer sets a timer a transition asked for: a plan's deadline by its
// plan, the others by their gang (forgetting a gang stops them).
func (p *Plugin) setTimer(t gang.Timer) {
	if t.Kind == gang.TimerPlanDeadline {
		p.timers.once(planDeadline(t.PlanID), t.After, func() { p.fire(t) })
		return
	}
	p.timers.forGang(t.Key, t.After, func() { p.fire(t) })
}

// fire carries out what the gang manager says timer t's firing means.
func (p *Plugin) fire(t gang.Timer) {
	p.carryOut(p.handlerCtx(), p.gangs.TimerFired(t, p.backoffBase()), nil)
}

// backoffBase is the first backoff of a gang whose plan was dropped.
func (p *Plugin) backoffBase() time.Duration {
	return time.Duration(p.args.GangBackoffSeconds) * time.Second
}

// drop drops the gang's plan planID (0: whatever plan it has) for cause.
func (p *Plugin) drop(ctx context.Context, key gang.Key, planID int64, cause gang.DropCause, reason string) {
	p.carryOut(ctx, p.gangs.Drop(key, planID, cause, reason, p.now(), p.backoffBase()), nil)
}

// publish announces a gang's new outcome: a log line, the PodGroup status
// and, for outcomes that are Events (Outcome.IsEvent), an Event on the
// gang's owner.
func (p *Plugin) publish(ctx context.Context, n gang.Notice, owner *v1.ObjectReference) {
	klog.FromContext(ctx).V(2).Info("Gang notice", "gang", n.Key, "reason", n.Outcome.Reason(), "message", n.Message)
	if n.Outcome.IsEvent() {
		if owner == nil {
			owner = p.source.ownerRef(n.Key)
		}
		if owner != nil { // never a typed nil: the recorder would dereference it
			p.handle.EventRecorder().Eventf(owner, nil, n.Outcome.EventType(), n.Outcome.Reason(), "Scheduling", "%s", n.Message)
		}
	}
	p.status.enqueue(n.Key)
}

// podEvent records the outcome on the pod itself, for what users must see
// on the pod as well as on the gang's owner.
func (p *Plugin) podEvent(pod *v1.Pod, outcome gang.Outcome, message string) {
	p.handle.EventRecorder().Eventf(pod, nil, outcome.EventType(), outcome.Reason(), "Scheduling", "%s", message)
}
