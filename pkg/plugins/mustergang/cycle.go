package mustergang

import (
	"context"
	"errors"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// cycle is the scheduler's side of one member's cycle for the gang
// manager: the port its decisions ask (gang.PlacingCycle for PreFilter,
// gang.RecourseCycle for PostFilter) over the informers, the cycle's state
// and nodes, and the profile's filters. The methods are thin: what they
// call is beside the extension point that needs it.
type cycle struct {
	p   *Plugin
	ctx context.Context
	// nodes are PreFilter's; state and statuses PostFilter's.
	nodes    []fwk.NodeInfo
	state    fwk.CycleState
	statuses fwk.NodeToStatusReader
	// gr is what Gather gathered, views the nodes Snapshot read, found
	// what SearchVictims found: what the later steps work on.
	gr    *gangRequest
	views []gang.NodeView
	found *gang.VictimsFound
}

func (c *cycle) Now() time.Time             { return c.p.now() }
func (c *cycle) Profile() string            { return c.p.handle.ProfileName() }
func (c *cycle) BackoffBase() time.Duration { return c.p.backoffBase() }
func (c *cycle) Ended(key gang.Key) bool    { return c.p.source.gangEnded(key) }

func (c *cycle) PriorityOf(pod *v1.Pod) int32 {
	return c.p.source.priorityOf(pod)
}

// RequestOf: see requestOf. Filter reads it only on nodes with held
// capacity; summing it costs the framework's PodRequests twice.
func (c *cycle) RequestOf(pod *v1.Pod) gang.Resources { return c.p.requestOf(pod) }

func (c *cycle) Resolve(pod *v1.Pod) (*gang.Resolved, bool, error) {
	return c.p.source.resolve(pod)
}

func (c *cycle) Gather(pod *v1.Pod, info *gang.Resolved, planning *gang.Planning) (*gang.Gathered, *gang.Refusal) {
	gr, r := c.p.prepareGang(c.ctx, pod, info, planning)
	if r != nil {
		return nil, r
	}
	c.gr = gr
	return &gr.Gathered, nil
}

func (c *cycle) Snapshot() (int64, error) {
	dra, err := c.p.dra.snapshot(c.ctx)
	if err != nil {
		return 0, err
	}
	var generation int64
	c.views, generation = c.p.nodes.views(c.nodes, dra)
	return generation, nil
}

func (c *cycle) ReleaseWaiting(key gang.Key, message string) int {
	return c.p.rejectWaiting(key, nil, message).Len()
}

func (c *cycle) TryPlan(planning *gang.Planning) gang.Attempt {
	p := c.p
	if p.dra.enabled() && len(p.dra.attributes) > 0 {
		p.nodes.topology.SetDeviceDomains(p.dra, p.dra.topologyVersion())
	}
	// Real time, not the plugin's clock: the work it takes (a simulated
	// clock does not move while a plan is computed).
	start := time.Now()
	plan, check, err := p.computePlan(c.ctx, c.gr, c.views, nil, nil)
	planDuration.Observe(time.Since(start).Seconds())
	if err == nil {
		klog.FromContext(c.ctx).V(4).Info("Plan checked with the framework's filters", "gang", c.gr.Info.Key, "filterChecks", check.checks)
		return gang.Attempt{Plan: plan}
	}
	unplaceable.Inc()
	msg := err.Error()
	if check != nil {
		if why := check.Explain(); why != "" {
			msg += "; " + why
		}
	}
	views, req := c.views, c.gr.Request
	return gang.Attempt{Message: msg, Screened: check != nil && len(check.rejected) == 0, FailedPlan: func() *gang.FailedPlan {
		// Counted on the views the plan saw: other gangs' holdings
		// taken out, as computePlan did.
		held := p.nodes.subtractHeld(views, planning.HeldByOthers())
		var closest string
		if u := (*gang.Unplaceable)(nil); errors.As(err, &u) {
			closest = u.Closest
		}
		return &gang.FailedPlan{Time: p.now(), Nodes: gang.TallyNodes(req, held, check.refuser(), closest), Message: msg}
	}}
}

func (c *cycle) Presence(victims []*v1.Pod) gang.Presence {
	return c.p.presence(c.gr, victims)
}

func (c *cycle) VictimsLingering(plan *gang.ActivePlan) string {
	return c.p.victimsLingering(plan)
}

// TerminatingFor: see terminatingFor.
func (c *cycle) TerminatingFor(pod *v1.Pod, node string) int {
	return c.p.terminatingFor(c.ctx, pod, node)
}

// HeldOut reports whether Filter kept a pod scheduled alone off capacity
// that gang plans hold (heldByPlans): when such a plan is dropped, no
// cluster event moves the pod, and the drop must wake it.
func (c *cycle) HeldOut(pod *v1.Pod) (heldOut, known bool) {
	s, err := readState(c.state)
	if err != nil || s.slot != "" {
		return false, false // a gang member, or refused before muster's Filter ran
	}
	for node := range s.held {
		if st := c.statuses.Get(node); st != nil && st.Plugin() == Name && slices.Contains(st.Reasons(), heldByPlans) {
			return true, true
		}
	}
	return false, true
}

// WaitsForVictims: see waitingForVictims.
func (c *cycle) WaitsForVictims(key gang.Key, plan *gang.ActivePlan, slot string) (string, bool) {
	s, _ := readState(c.state)
	return c.p.waitingForVictims(key, plan, slot, s, c.statuses)
}

func (c *cycle) InSnapshot(node string) bool {
	_, err := c.p.handle.SnapshotSharedLister().NodeInfos().Get(node)
	return err == nil
}

// RefusedAt reads the framework's refusal of pod at its slot, and whether
// muster's PreFilter had steered it there (a Filter then refused it where
// it was sent: the next plans avoid that pair).
func (c *cycle) RefusedAt(pod *v1.Pod, slot string) (why string, avoid bool) {
	why = "node is gone"
	if st := c.statuses.Get(slot); st != nil && len(st.Reasons()) > 0 {
		why = st.Message()
	}
	s, err := readState(c.state)
	switch {
	case err == nil && s.slot == slot:
		return why, true
	case err != nil && !errors.Is(err, fwk.ErrNotFound):
		// A state of the wrong type is a bug: report it, and do not guess
		// where the member was steered.
		klog.FromContext(c.ctx).Error(err, "PostFilter of a planned member", "pod", klog.KObj(pod), "slot", slot)
		return "its PreFilter state is unreadable: " + why, false
	}
	// No state: another plugin's PreFilter rejected the member first.
	return "rejected before muster's PreFilter ran: " + why, false
}

func (c *cycle) ReleaseEarlierAllocation(pod *v1.Pod) string {
	return c.p.releaseEarlierAllocation(c.ctx, pod)
}

// Preemption: gangs preempt when the profile lets them, once per backoff.
func (c *cycle) Preemption() (bool, time.Duration) {
	return c.p.args.GangPreemption, time.Duration(max(c.p.args.GangBackoffSeconds, 1)) * time.Second
}

func (c *cycle) StillTerminating(key gang.Key) (int, error) { return c.p.stillTerminating(c.ctx, key) }

// SearchVictims finishes the evictions an earlier run began
// (evictor.resume) before it looks for victims of its own: while they are
// still being deleted it answers gang.ErrEarlierEvictionsUnfinished at
// once, so the capacity they free is not evicted a second time and no
// scheduling cycle waits on their API calls.
func (c *cycle) SearchVictims() (*gang.Victims, error) {
	p := c.p
	select {
	case <-p.evictions.resume(p.handlerCtx()):
	default:
		return nil, gang.ErrEarlierEvictionsUnfinished
	}
	found, err := p.searchVictims(c.ctx, c.gr, c.gr.Priority, c.gr.Info.Constraints.Policy)
	if err != nil {
		return nil, err
	}
	if found.Choice.Units == nil {
		klog.FromContext(c.ctx).V(2).Info("No preemption helps", "gang", c.gr.Info.Key, "candidateUnits", len(found.Candidates), "lowerPriorityUnits", found.LowerPriority, "checks", found.Checks)
		return nil, nil
	}
	c.found = found
	v := &gang.Victims{Plan: found.Plan, Pods: found.Pods, Violations: found.Choice.Violations}
	for _, i := range found.Choice.Units {
		v.Units = append(v.Units, found.Candidates[i].VictimUnit)
	}
	return v, nil
}
