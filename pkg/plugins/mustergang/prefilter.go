package mustergang

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

const stateKey fwk.StateKey = "PreFilter" + Name

// cycleState is written once by PreFilter and only read afterwards, so Clone
// may share it.
type cycleState struct {
	// slot is the member's planned node; empty for pods scheduled alone.
	slot   string
	planID int64
	key    gang.Key
	policy gang.Policy
	// held and request let Filter keep pods scheduled alone off capacity
	// that gang plans hold.
	held    map[string]gang.Resources
	request gang.Resources
}

func (s *cycleState) Clone() fwk.StateData { return s }

// readState returns what PreFilter wrote. A missing state where PreFilter
// must have run is a bug, reported rather than guessed around: a gang
// member without its state must never be taken for a pod scheduled alone.
func readState(cs fwk.CycleState) (*cycleState, error) {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("%s: reading PreFilter state: %w", Name, err)
	}
	s, ok := data.(*cycleState)
	if !ok {
		return nil, fmt.Errorf("%s: PreFilter state has type %T", Name, data)
	}
	return s, nil
}

// PreEnqueue keeps members of a gang that has fewer pods than its quorum out
// of the scheduling queue. It writes no pod condition (the framework does not
// for PreEnqueue), so the wait is explained by an Event on the Job or
// PodGroup and by the PodGroup status.
func (p *Plugin) PreEnqueue(ctx context.Context, pod *v1.Pod) *fwk.Status {
	info, ok, err := p.resolve(pod)
	if !ok || err != nil {
		return nil // scheduled alone, or explained with a condition by PreFilter
	}
	p.registry.FirstSeen(info.key, pod.CreationTimestamp.Time)
	total := p.members(info.key).total
	if total >= info.quorum {
		return nil
	}
	msg := fmt.Sprintf("gang %s has %d of %d members; waiting for the rest to be created", info.key, total, info.quorum)
	p.notice(ctx, info, v1.EventTypeNormal, ReasonWaitingForMembers, msg)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
}

// PreFilter plans the gang when it has no plan and steers the member to its
// planned node. Any reason the gang cannot go ahead is returned as
// UnschedulableAndUnresolvable: it becomes the pod's PodScheduled=False
// message, and it keeps per-pod preemption from acting for one member.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if _, err := cs.Read(dryRunKey); err == nil {
		return nil, fwk.NewStatus(fwk.Skip) // a planning dry run asks the other plugins only
	}
	constraints, err := gang.ConstraintsFromPod(pod, p.levels)
	info, inGang, resolveErr := p.resolve(pod)
	if err == nil {
		err = resolveErr
	}
	if err != nil {
		if info != nil {
			p.notice(ctx, info, v1.EventTypeWarning, ReasonInvalid, err.Error())
		} else {
			p.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, ReasonInvalid, "Scheduling", "%s", err.Error())
		}
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if !inGang {
		// A pod scheduled alone has a plan only when it preempted.
		plan := p.registry.Plan(gang.LoneKey(pod))
		if plan == nil {
			cs.Write(stateKey, &cycleState{policy: constraints.Policy, held: p.registry.Held(gang.Key{}), request: gang.PodRequest(pod)})
			return nil, nil
		}
		return p.steer(cs, pod, gang.LoneKey(pod), plan, constraints)
	}
	key := info.key
	if info.noGang != "" {
		p.notice(ctx, info, v1.EventTypeWarning, ReasonNoGang, info.noGang)
		p.handle.EventRecorder().Eventf(pod, nil, v1.EventTypeWarning, ReasonNoGang, "Scheduling", "%s", info.noGang)
	}
	p.registry.FirstSeen(key, pod.CreationTimestamp.Time)
	if until, why := p.registry.Backoff(key); p.now().Before(until) {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("gang %s backs off until %s after: %s", key, until.Format(time.RFC3339), why))
	}

	plan := p.registry.Plan(key)
	if plan == nil {
		var status *fwk.Status
		if plan, status = p.planGang(ctx, pod, info, constraints, nodes); status != nil {
			return nil, status
		}
	}
	return p.steer(cs, pod, key, plan, constraints)
}

// steer sends a planned member to its slot: PreFilter narrows to it and
// Filter rejects every other node. Members of a plan that preempted wait
// until the victims are gone.
func (p *Plugin) steer(cs fwk.CycleState, pod *v1.Pod, key gang.Key, plan *gang.ActivePlan, constraints gang.Constraints) (*fwk.PreFilterResult, *fwk.Status) {
	node, planned := plan.Slots[pod.UID]
	if !planned {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("gang %s is placing %d other members; this pod waits for that plan to finish", key, len(plan.Slots)))
	}
	if n := plan.Victims.Len(); n > 0 {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("gang %s preempted pods to make room; waiting for %d of them to terminate (planned on %s)", key, n, node))
	}
	cs.Write(stateKey, &cycleState{slot: node, planID: plan.ID, key: key, policy: constraints.Policy})
	return &fwk.PreFilterResult{NodeNames: sets.New(node)}, nil
}

// gangRequest is what planning a gang needs, gathered once: the planner's
// request (its Check set per attempt) and the pods it places.
type gangRequest struct {
	info *gangInfo
	// alone: the gang's quorum is bound and only this pod is placed.
	alone      bool
	req        gang.Request
	set        memberSet
	candidates []*v1.Pod
}

// prepareGang gathers the gang of pod for planning: the pending members to
// place, around the members already bound.
func (p *Plugin) prepareGang(ctx context.Context, pod *v1.Pod, info *gangInfo, c gang.Constraints) (*gangRequest, *fwk.Status) {
	key := info.key
	set := p.members(key)
	if set.total < info.quorum {
		msg := fmt.Sprintf("gang %s has %d of %d members; waiting for the rest to be created", key, set.total, info.quorum)
		p.notice(ctx, info, v1.EventTypeNormal, ReasonWaitingForMembers, msg)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	needed := info.quorum - set.bound()
	if needed > len(set.pending) {
		msg := fmt.Sprintf("gang %s needs %d more members but only %d can be scheduled; %d are held by scheduling gates",
			key, needed, len(set.pending), set.total-set.bound()-len(set.pending))
		p.notice(ctx, info, v1.EventTypeNormal, ReasonWaitingForMembers, msg)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	candidates := set.pending
	if needed <= 0 {
		// Quorum is already bound (e.g. a member beyond min-available):
		// place this pod, still around the members that run.
		candidates, needed = []*v1.Pod{pod}, 1
	}
	gr := &gangRequest{info: info, set: set, candidates: candidates, alone: len(candidates) == 1, req: gang.Request{
		Gang:       key.String(),
		Needed:     needed,
		GPU:        v1.ResourceName(p.args.GPUResourceName),
		Levels:     p.levels,
		Required:   c.Required,
		Preferred:  c.Preferred,
		Policy:     c.Policy,
		BoundNodes: set.boundNodes,
	}}
	byTemplate := map[string]*gang.NodeConstraints{}
	for _, m := range candidates {
		tmpl := templateKey(m)
		nc := byTemplate[tmpl]
		if nc == nil {
			nc = gang.ConstraintsOf(m)
			byTemplate[tmpl] = nc
		}
		gr.req.Members = append(gr.req.Members, gang.Member{UID: m.UID, Name: m.Name, Request: gang.PodRequest(m), Constraints: nc})
		// A nomination left from an earlier attempt (a failover, a Permit
		// wait that ended) must not make the framework count this pending
		// member twice against its own gang's plan.
		if m.Status.NominatedNodeName != "" {
			p.handle.DeleteNominatedPodIfExists(m)
		}
	}
	return gr, nil
}

// computePlan plans the gang over nodes with victims gone (none, outside
// preemption), each choice confirmed by the profile's filters.
func (p *Plugin) computePlan(ctx context.Context, gr *gangRequest, nodes []fwk.NodeInfo, victims []*v1.Pod) (*gang.Plan, *filterCheck, error) {
	check, err := p.newFilterCheck(ctx, gr.info.key, gr.candidates, victims)
	if err != nil {
		return nil, nil, err
	}
	req := gr.req
	req.Check = check
	views := p.nodeViews(nodes, p.registry.Held(gr.info.key))
	if len(victims) > 0 {
		freed := map[string]gang.Resources{}
		for _, v := range victims {
			f := freed[v.Spec.NodeName]
			f.Add(gang.PodRequest(v))
			freed[v.Spec.NodeName] = f
		}
		for i := range views {
			if f, ok := freed[views[i].Node.Name]; ok {
				views[i].Free = views[i].Free.Clone()
				views[i].Free.Add(f)
			}
		}
	}
	plan, err := gang.Compute(req, views)
	return plan, check, err
}

// planGang computes and installs a plan for the gang of pod: every pending
// member, around the members already bound, each choice confirmed by the
// profile's own filters.
func (p *Plugin) planGang(ctx context.Context, pod *v1.Pod, info *gangInfo, c gang.Constraints, nodes []fwk.NodeInfo) (*gang.ActivePlan, *fwk.Status) {
	gr, status := p.prepareGang(ctx, pod, info, c)
	if status != nil {
		return nil, status
	}
	// A sibling's cycle found no plan on this very snapshot, with no plan
	// dropped since: the answer is the same.
	epoch := gang.Epoch{Snapshot: snapshotGeneration(nodes), Releases: p.registry.Releases()}
	if !gr.alone {
		if msg, ok := p.registry.Unplaceable(info.key, epoch, len(gr.candidates), gr.req.Needed, p.now()); ok {
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
		}
	}
	// Members still waiting at Permit from a plan that was dropped while they
	// entered it hold capacity no plan accounts for: release them first.
	released := p.rejectWaiting(info.key, nil, fmt.Sprintf("gang %s is being planned again", info.key))

	start := p.now()
	plan, check, err := p.computePlan(ctx, gr, nodes, nil)
	planDuration.Observe(p.now().Sub(start).Seconds())
	if err != nil {
		msg := err.Error()
		if check != nil {
			if why := check.Explain(); why != "" {
				msg += "; " + why
			}
		}
		unplaceable.Inc()
		// Reused only when the planner's own screening decided: what the
		// filters see (volumes, claims, pod labels) changes without the
		// snapshot's generation, and members released here change it next.
		if !gr.alone && check.rejected == 0 && released == 0 {
			p.registry.SetUnplaceable(info.key, epoch, len(gr.candidates), gr.req.Needed, msg, p.now(), reuseFailedPlan)
		}
		p.notice(ctx, info, v1.EventTypeWarning, ReasonUnschedulable, msg)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	klog.FromContext(ctx).V(4).Info("Plan checked with the framework's filters", "gang", info.key, "filterChecks", check.checks)
	return p.installPlan(ctx, pod, gr, plan, nil)
}

// installPlan makes plan the gang's active plan, holding its slots in the
// ledger, and wakes the planned siblings (unless victims must go first).
func (p *Plugin) installPlan(ctx context.Context, pod *v1.Pod, gr *gangRequest, plan *gang.Plan, victims []*v1.Pod) (*gang.ActivePlan, *fwk.Status) {
	logger := klog.FromContext(ctx)
	info, key := gr.info, gr.info.key
	now := p.now()
	active := &gang.ActivePlan{
		Plan:     *plan,
		Requests: map[types.UID]gang.Resources{},
		Reserved: sets.New[types.UID](),
		Victims:  sets.New[types.UID](),
		Created:  now,
		Deadline: now.Add(info.timeout),
		Quorum:   info.quorum,
		Bound:    gr.set.bound(),
	}
	for _, m := range gr.req.Members {
		if _, ok := plan.Slots[m.UID]; ok {
			active.Requests[m.UID] = m.Request
		}
	}
	for _, v := range victims {
		active.Victims.Insert(v.UID)
	}
	active.Evicted = active.Victims.Clone()
	active.Profile = p.handle.ProfileName()
	if !p.registry.SetPlan(key, active, pod.CreationTimestamp.Time) {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s was planned concurrently; retrying", key))
	}
	id := active.ID
	p.after(info.timeout, func() { p.expirePlan(key, id) })
	logger.V(2).Info("Planned gang", "gang", key, "members", len(plan.Slots), "bound", gr.set.bound(), "level", plan.Level, "domain", plan.Domain,
		"nodes", plan.Nodes, "preemptibleNodes", plan.PreemptibleNodes, "victims", len(victims))
	msg := fmt.Sprintf("gang %s: %d members planned on %d nodes in %s %s (%d preemptible)",
		key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain, plan.PreemptibleNodes)
	if gr.set.bound() > 0 {
		msg += fmt.Sprintf(", joining %d running members", gr.set.bound())
	}
	if len(victims) == 0 {
		p.notice(ctx, info, v1.EventTypeNormal, ReasonPlanned, msg)
		p.activateSiblings(logger, key, active, pod.UID)
	}
	return active, nil
}

// templateKey groups members whose node constraints are identical.
func templateKey(pod *v1.Pod) string {
	data, err := json.Marshal([]interface{}{pod.Spec.NodeSelector, pod.Spec.Affinity, pod.Spec.Tolerations, pod.Labels})
	if err != nil {
		return string(pod.UID) // cannot happen for API objects; never share then
	}
	return string(data)
}

// nodeViews turns the snapshot into the planner's view, subtracting what
// other gangs' plans hold.
func (p *Plugin) nodeViews(nodes []fwk.NodeInfo, held map[string]gang.Resources) []gang.NodeView {
	views := make([]gang.NodeView, 0, len(nodes))
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil {
			continue
		}
		free := gang.FreeOnNode(ni)
		if h, ok := held[node.Name]; ok {
			free.Sub(h)
		}
		views = append(views, gang.NodeView{Node: node, Free: free, Preemptible: p.preemptible(node), Reclaiming: p.reclaiming(node)})
	}
	return views
}

// activate moves pods into the active queue. It takes the queue's lock: never
// call it from PreEnqueue or QueueSort.
func (p *Plugin) activate(logger klog.Logger, pods []*v1.Pod) {
	if len(pods) == 0 {
		return
	}
	toActivate := make(map[string]*v1.Pod, len(pods))
	for _, m := range pods {
		toActivate[m.Namespace+"/"+m.Name] = m
	}
	p.handle.Activate(logger, toActivate)
}

// PreFilterExtensions is not needed: muster adds no per-pod state that
// preemption dry runs would have to update.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter keeps a gang member on its planned node, keeps every muster pod off
// nodes being reclaimed, and keeps pods scheduled alone out of the capacity
// gang plans hold and on the nodes their preemptible policy allows.
func (p *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s, err := readState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	node := ni.Node()
	if s.slot != "" && node.Name != s.slot {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("gang %s planned this member on node %s", s.key, s.slot))
	}
	if p.reclaiming(node) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node is being reclaimed")
	}
	if s.slot != "" {
		return nil // the plan already applied policy and capacity
	}
	spot := p.preemptible(node)
	if (s.policy == gang.PolicyForbid && spot) || (s.policy == gang.PolicyRequire && !spot) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("preemptible policy %s", s.policy))
	}
	if h, ok := s.held[node.Name]; ok {
		free := gang.FreeOnNode(ni)
		free.Sub(h)
		if !free.Fits(s.request) {
			return fwk.NewStatus(fwk.Unschedulable, "capacity held for a planned gang")
		}
	}
	return nil
}

// PostFilter runs when a member could not go to its planned node, or was
// rejected by another plugin's PreFilter before muster's ran: something
// changed since the plan (a pod the default scheduler placed, a volume
// deleted). The plan is dropped at once, the waiting siblings released, and
// the (member, node) pair is avoided by the next plans. It also clears the
// pod's nomination, so a stale one never lingers.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	clear := framework.NewPostFilterResultWithNominatedNode("")
	key, plan := p.registry.PlanOf(pod.UID)
	if plan == nil {
		// No plan: the gang (or the lone pod) does not fit. Preemption may
		// make room; otherwise any stale nomination is cleared.
		result, status := p.preempt(ctx, pod)
		if result == nil {
			result = clear
		}
		return result, status
	}
	slot := plan.Slots[pod.UID]
	if msg, waiting := p.waitingForVictims(key, plan, slot, statuses); waiting {
		// Keep the hold; the end of the wait requeues the member.
		return framework.NewPostFilterResultWithNominatedNode(slot), fwk.NewStatus(fwk.Unschedulable, msg)
	}
	why := "node is gone"
	if st := statuses.Get(slot); st != nil && len(st.Reasons()) > 0 {
		why = st.Message()
	}
	if s, err := readState(cs); err == nil && s.slot == slot {
		// muster's PreFilter steered the member there and a Filter said no.
		p.registry.Avoid(key, pod.UID, slot, p.now().Add(avoidFor))
		p.after(avoidFor, func() { p.activate(p.logger, p.members(key).pending) })
	} else {
		why = "rejected before muster's PreFilter ran: " + why
	}
	reason := fmt.Sprintf("member %s cannot go to its planned node %s: %s", pod.Name, slot, why)
	p.failPlan(ctx, key, plan.ID, "plan_broken", reason)
	return clear, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: %s", key, reason))
}

// waitingForVictims reports whether a member was turned away only because
// its plan still waits for the pods it preempted: some have not terminated;
// muster's own PreFilter held the member back (the last one went since); or
// the cycle's snapshot still shows one on the member's slot (muster's
// informer can see a victim go before the scheduler's cache does).
func (p *Plugin) waitingForVictims(key gang.Key, plan *gang.ActivePlan, slot string, statuses fwk.NodeToStatusReader) (string, bool) {
	if n := plan.Victims.Len(); n > 0 {
		return fmt.Sprintf("gang %s waits for %d preempted pods to terminate", key, n), true
	}
	if st := statuses.Get(slot); st != nil && st.Plugin() == Name {
		return st.Message(), true
	}
	if p.evictedStillCached(plan, slot) {
		return fmt.Sprintf("gang %s waits for preempted pods to leave %s", key, slot), true
	}
	return "", false
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

// snapshotGeneration identifies the scheduler's snapshot: the highest
// generation of its nodes (every change to a node or its pods raises it).
func snapshotGeneration(nodes []fwk.NodeInfo) int64 {
	var gen int64
	for _, ni := range nodes {
		gen = max(gen, ni.GetGeneration())
	}
	return gen
}

// reuseFailedPlan bounds how long a gang's members reuse a sibling's failed
// plan when nothing observable changed: long enough for one wave of
// sibling cycles, short enough that nothing unobserved is missed for long.
const reuseFailedPlan = 2 * time.Second

// Score gives a gang member's planned node the top score (it is the only
// feasible one) and ranks nodes for pods scheduled alone by their
// preemptible policy; bin-packing comes from NodeResourcesFit's
// MostAllocated strategy in the shipped configuration.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readState(cs)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	if s.slot != "" {
		return fwk.MaxNodeScore, nil
	}
	spot := p.preemptible(ni.Node())
	switch {
	case s.policy == gang.PolicyAvoid && spot, s.policy == gang.PolicyPrefer && !spot:
		return fwk.MinNodeScore, nil
	}
	return fwk.MaxNodeScore, nil
}

// ScoreExtensions is nil: scores are already in [0, 100].
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

func (p *Plugin) preemptible(node *v1.Node) bool {
	for _, m := range p.args.PreemptibleNodeMatchers {
		if matchNode(node, m.Source == "Taint", m.Key, m.Value) {
			return true
		}
	}
	return false
}

func (p *Plugin) reclaiming(node *v1.Node) bool {
	if node.Spec.Unschedulable {
		return true
	}
	for _, key := range p.args.ReclaimTaintKeys {
		if matchNode(node, true, key, "") {
			return true
		}
	}
	return false
}

func matchNode(node *v1.Node, taint bool, key, value string) bool {
	if !taint {
		v, ok := node.Labels[key]
		return ok && (value == "" || v == value)
	}
	for _, t := range node.Spec.Taints {
		if t.Key == key && (value == "" || t.Value == value) {
			return true
		}
	}
	return false
}
