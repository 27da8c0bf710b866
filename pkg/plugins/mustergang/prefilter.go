package mustergang

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// PreFilter asks the gang manager where the member goes (gang.Decisions.Place:
// its slot in the gang's plan, made now when the gang has none) and tells
// the framework. Any reason the gang cannot go ahead is returned as
// UnschedulableAndUnresolvable: it becomes the pod's PodScheduled=False
// message, and it keeps per-pod preemption from acting for one member.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if _, err := cs.Read(dryRunKey); err == nil {
		return nil, fwk.NewStatus(fwk.Skip) // a planning dry run asks the other plugins only
	}
	placement := p.gangs.Decisions().Place(&cycle{p: p, ctx: ctx, nodes: nodes}, pod)
	return p.enact(ctx, cs, pod, placement)
}

// enact carries out what Place decided for pod: the transitions' effects
// and Events, then the framework's answer.
func (p *Plugin) enact(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, pl gang.Placement) (*fwk.PreFilterResult, *fwk.Status) {
	var owner *v1.ObjectReference
	if pl.Info != nil {
		owner = pl.Info.Ref
		if pl.FailedPlan != nil {
			p.failedPlans.record(pl.Info.OwnerKey, pl.Info.OwnerUID, pl.FailedPlan)
		}
	}
	p.follow(ctx, pl.Followup, owner)
	for _, n := range pl.PodEvents {
		p.podEvent(pod, n.Outcome, n.Message)
	}
	if plan := pl.Plan; pl.Planned {
		klog.FromContext(ctx).V(2).Info("Planned gang", "gang", pl.Key, "members", len(plan.Slots), "bound", plan.CountsOn.Len(), "level", plan.Level, "domain", plan.Domain,
			"nodes", plan.Nodes, "preemptibleNodes", plan.PreemptibleNodes)
	}
	switch {
	case pl.Stop != nil && !pl.HeldBack:
		return nil, stopStatus(pl.Stop)
	case pl.Plan == nil:
		return p.leaveHeldCapacity(ctx, cs, pl)
	}
	return p.steer(cs, pod, pl)
}

// stopStatus is the framework's status for a cycle Place stopped.
func stopStatus(s *gang.Stop) *fwk.Status {
	switch {
	case s.Err != nil:
		return fwk.AsStatus(s.Err)
	case s.Retry:
		return fwk.NewStatus(fwk.Unschedulable, s.Message)
	}
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, s.Message)
}

// leaveHeldCapacity serves a pod scheduled alone with no plan: Filter
// keeps it off capacity other gangs' plans hold (pl.Held).
func (p *Plugin) leaveHeldCapacity(ctx context.Context, cs fwk.CycleState, pl gang.Placement) (*fwk.PreFilterResult, *fwk.Status) {
	st := &cycleState{policy: pl.Info.Constraints.Policy, held: pl.Held, request: pl.Request}
	if len(st.held) > 0 {
		var err error
		if st.dra, err = p.dra.snapshot(ctx); err != nil {
			return nil, fwk.AsStatus(err)
		}
	}
	cs.Write(stateKey, st)
	return nil, nil
}

// steer sends a planned member to its slot: PreFilter narrows to it and
// Filter rejects every other node. Members of a plan that preempted are
// held back until the victims are gone (pl.HeldBack).
func (p *Plugin) steer(cs fwk.CycleState, pod *v1.Pod, pl gang.Placement) (*fwk.PreFilterResult, *fwk.Status) {
	state := &cycleState{slot: pl.Node, planID: pl.Plan.ID, key: pl.Key, policy: pl.Info.Constraints.Policy}
	var pass *groupPass
	if cs.IsPodGroupSchedulingCycle() {
		// Seen, whether steered below or held back: a member of the plan
		// the pass never shows muster was refused by another PreFilter.
		pass = passOf(cs.GetPodGroupSchedulingCycle(), pl.Plan.ID)
		pass.saw(pod.UID)
	}
	if pl.HeldBack {
		// PostFilter (PodGroupPostFilter in a pod-group cycle) reads that
		// the refusal is the wait, not a failure: by the time it runs the
		// last victim may be gone and the wait no longer visible.
		state.heldForVictims = true
		cs.Write(stateKey, state)
		if pass != nil {
			pass.heldBackForVictims()
		}
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, pl.Stop.Message)
	}
	if pass != nil {
		state.pass = pass
		pass.steered(pod, pl.Node)
	}
	cs.Write(stateKey, state)
	return &fwk.PreFilterResult{NodeNames: sets.New(pl.Node)}, nil
}

// devicesReleased reports whether the DRA devices of the pods preempted
// for plan are released: none of their ResourceClaims is still allocated
// and reserved for one of them. The resourceclaim controller drops a
// deleted pod from a claim's reservedFor after the pod is gone, and
// deallocates the claim it was the last user of in the same update. Every
// device counts, not only GPUs: a victim's NIC the member needs would
// have DynamicResources refuse it just the same.
func (p *Plugin) devicesReleased(plan *gang.ActivePlan) bool {
	if plan.Evicted.Len() == 0 || !p.dra.enabled() {
		return true
	}
	claims, err := p.dra.manager.ResourceClaims().List()
	if err != nil {
		return false // asked again at the next event
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, consumer := range claim.Status.ReservedFor {
			if plan.Evicted.Has(consumer.UID) {
				return false
			}
		}
	}
	return true
}

// gangRequest is what planning a gang needs, gathered once: the gang
// manager's part (its Request's Check set per attempt) and, for the
// framework, the members it places.
type gangRequest struct {
	gang.Gathered
	set memberSet
	// candidates are the members to place, as the framework sees them:
	// their affinity terms parsed and their requests summed once per plan.
	candidates []*framework.PodInfo
	// planning is what the gang manager said planning needs (other gangs'
	// holdings, the pairs to avoid, the last failed plan).
	planning *gang.Planning
}

// prepareGang gathers the gang of pod for planning: the pending members to
// place, around the members already bound.
func (p *Plugin) prepareGang(ctx context.Context, pod *v1.Pod, info *gang.Resolved, planning *gang.Planning) (*gangRequest, *gang.Refusal) {
	key, c := info.Key, info.Constraints
	set := p.source.membersInFlight(key, planning.InFlight)
	if set.total < info.Quorum {
		return nil, &gang.Refusal{Outcome: gang.OutcomeWaitingForMembers, Message: shortMessage(key, set.total, info.Quorum)}
	}
	needed := info.Quorum - set.bound()
	if needed > len(set.pending) {
		return nil, &gang.Refusal{Outcome: gang.OutcomeWaitingForMembers, Message: fmt.Sprintf("gang %s needs %d more members but only %d can be scheduled; %d are held by scheduling gates",
			key, needed, len(set.pending), set.total-set.bound()-len(set.pending))}
	}
	candidates := set.pending
	if needed <= 0 {
		// Quorum is already bound (e.g. a member beyond min-available):
		// place this pod, still around the members that run.
		candidates, needed = []*v1.Pod{pod}, 1
	}
	if msg := disagreement(key, pod, c, candidates, p.nodes.levels); msg != "" {
		return nil, &gang.Refusal{Outcome: gang.OutcomeInvalid, Message: msg}
	}
	// The owner's own topology requirement narrows the members' wishes.
	c.Required = gang.NarrowerLevel(p.nodes.levels, c.Required, info.Required)
	gr := &gangRequest{set: set, planning: planning, Gathered: gang.Gathered{Info: info, Alone: len(candidates) == 1, Pending: len(candidates), CountsOn: set.boundUIDs}}
	gr.Request = gang.Request{
		Gang:       key.String(),
		Needed:     needed,
		GPU:        v1.ResourceName(p.args.GPUResourceName),
		Levels:     p.nodes.levels,
		Topology:   p.nodes.topology,
		Required:   c.Required,
		Preferred:  c.Preferred,
		Policy:     c.Policy,
		BoundNodes: set.boundNodes,
	}
	byTemplate := map[string]*gang.NodeConstraints{}
	claims := &claimUnit{counted: sets.New[types.UID]()} // a claim several members share counts once
	for _, m := range candidates {
		facts, err := p.source.facts.of(m)
		if err != nil {
			return nil, &gang.Refusal{Outcome: gang.OutcomeInvalid, Message: fmt.Sprintf("gang %s: member %s: %v", key, m.Name, err)}
		}
		pi := facts.info
		gr.candidates = append(gr.candidates, pi)
		gr.Generations += m.Generation
		nc := byTemplate[facts.template]
		if nc == nil {
			nc = gang.ConstraintsOf(klog.FromContext(ctx), m)
			byTemplate[facts.template] = nc
		}
		req := p.dra.request(podRequest(pi.CalculateResource()), m, claims)
		gr.Request.Members = append(gr.Request.Members, gang.Member{UID: m.UID, Name: m.Name, Request: req, Constraints: nc})
		// A nomination left from an earlier attempt (a failover, a Permit
		// wait that ended) must not make the framework count this pending
		// member twice against its own gang's plan.
		if m.Status.NominatedNodeName != "" {
			p.handle.DeleteNominatedPodIfExists(m)
		}
	}
	gr.Priority, gr.Never = p.preemptorPriority(pod, gr.candidates)
	planning.Priority = gr.Priority
	return gr, nil
}

// requestOf is what pod needs, as the framework counts it on a node, with
// the GPUs of its ResourceClaims: what it takes when pending, what its
// eviction frees when bound.
func (p *Plugin) requestOf(pod *v1.Pod) gang.Resources {
	return p.dra.request(podRequest((&framework.PodInfo{Pod: pod}).CalculateResource()), pod, nil)
}

// computePlan plans the gang over the node views with what other gangs'
// plans hold taken out and victims gone (none, outside preemption), each
// choice confirmed by the profile's filters. freed[i] is what victims[i]
// frees (its requestOf, which the victim search computes once per search,
// not once per set it tries).
func (p *Plugin) computePlan(ctx context.Context, gr *gangRequest, views []gang.NodeView, victims []*v1.Pod, freed []gang.Resources) (*gang.Plan, *filterCheck, error) {
	check, err := p.newFilterCheck(ctx, gr.Info.Key, gr.candidates, victims, gr.planning.Avoided)
	if err != nil {
		return nil, nil, err
	}
	req := gr.Request
	req.Check = check
	adjust := gr.planning.HeldByOthers()
	if len(victims) > 0 {
		adjust = maps.Clone(adjust)
		if adjust == nil {
			adjust = map[string]gang.Resources{}
		}
		for i, v := range victims {
			// Freed by the victims: a negative holding.
			a := adjust[v.Spec.NodeName].Clone()
			a.Sub(freed[i])
			adjust[v.Spec.NodeName] = a
		}
	}
	plan, err := gang.Compute(req, p.nodes.subtractHeld(views, adjust))
	return plan, check, err
}

// installPlan installs plan, made for gr in pod's cycle, with victims
// (gang.Decisions.InstallGathered) and carries out what that asks.
func (p *Plugin) installPlan(ctx context.Context, pod *v1.Pod, gr *gangRequest, plan *gang.Plan, victims []*v1.Pod, preempting string) (*gang.ActivePlan, *fwk.Status) {
	active, effects, stop := p.gangs.Decisions().InstallGathered(&cycle{p: p, ctx: ctx, gr: gr}, &gr.Gathered, plan, pod, victims, preempting)
	p.carryOut(ctx, effects, gr.Info.Ref)
	if stop != nil {
		return nil, stopStatus(stop)
	}
	return active, nil
}

// planPresence answers Install's questions (gang.Presence) from the pod
// informer's store, which changes before any handler runs. It reads the
// gang's pods at its first question.
type planPresence struct {
	src     *gangSource
	key     gang.Key
	names   map[types.UID]string
	victims map[types.UID]*v1.Pod
	// standing and bound are read at the first question.
	standing, bound sets.Set[types.UID]
}

// presence is what Install asks of the plan made for gr with victims.
func (p *Plugin) presence(gr *gangRequest, victims []*v1.Pod) *planPresence {
	pp := &planPresence{src: p.source, key: gr.Info.Key, names: map[types.UID]string{}, victims: map[types.UID]*v1.Pod{}}
	for _, m := range gr.Request.Members {
		pp.names[m.UID] = m.Name
	}
	for _, v := range victims {
		pp.victims[v.UID] = v
	}
	return pp
}

func (pp *planPresence) Member(uid types.UID) (name string, standing, bound bool) {
	if pp.standing == nil {
		pp.standing, pp.bound = sets.New[types.UID](), sets.New[types.UID]()
		for _, pod := range pp.src.standingPods(pp.src.gangIndex, pp.key) {
			pp.standing.Insert(pod.UID)
			pp.names[pod.UID] = pod.Name
			if pod.Spec.NodeName != "" {
				pp.bound.Insert(pod.UID)
			}
		}
	}
	if name = pp.names[uid]; name == "" {
		name = string(uid)
	}
	return name, pp.standing.Has(uid), pp.bound.Has(uid)
}

func (pp *planPresence) Victim(uid types.UID) bool {
	v := pp.victims[uid]
	return v != nil && pp.src.stands(v)
}

// templateKey groups members whose node constraints are identical.
func templateKey(pod *v1.Pod) string {
	data, err := json.Marshal([]interface{}{pod.Spec.NodeSelector, pod.Spec.Affinity, pod.Spec.Tolerations, pod.Labels})
	if err != nil {
		return string(pod.UID) // cannot happen for API objects; never share then
	}
	return string(data)
}

// PreFilterExtensions is not needed: muster adds no per-pod state that
// preemption dry runs would have to update.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// disagreement explains pending members whose placement annotations (topology,
// preemptible policy) differ from pod's: the gang is planned once for all of
// them, so which member's wishes won would depend on which came first. A
// TFJob's Chief, Worker and PS templates each carry their own annotations.
func disagreement(key gang.Key, pod *v1.Pod, c gang.Constraints, members []*v1.Pod, levels []gang.Level) string {
	for _, m := range members {
		if m.UID == pod.UID {
			continue
		}
		mc, err := gang.ConstraintsFromPod(m, levels)
		if err != nil {
			return fmt.Sprintf("gang %s: member %s: %v", key, m.Name, err)
		}
		if mc != c {
			return fmt.Sprintf("gang %s: members %s and %s ask for different placement (%s, %s); give every member the same %s annotations",
				key, pod.Name, m.Name, describeConstraints(c), describeConstraints(mc), "muster.dev/topology-*, muster.dev/preemptible")
		}
	}
	return ""
}

func describeConstraints(c gang.Constraints) string {
	s := "preemptible " + string(c.Policy)
	if c.Required != "" {
		s += ", topology-required " + c.Required
	}
	if c.Preferred != "" {
		s += ", topology-preferred " + c.Preferred
	}
	return s
}
