package mustergang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// PreFilter plans the gang when it has no plan and steers the member to its
// planned node. Any reason the gang cannot go ahead is returned as
// UnschedulableAndUnresolvable: it becomes the pod's PodScheduled=False
// message, and it keeps per-pod preemption from acting for one member.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if _, err := cs.Read(dryRunKey); err == nil {
		return nil, fwk.NewStatus(fwk.Skip) // a planning dry run asks the other plugins only
	}
	info, inGang, err := p.source.resolve(pod)
	if err != nil {
		if !inGang {
			p.podEvent(pod, gang.OutcomeInvalid, err.Error())
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
		}
		defer p.forgetIfEnded(info.Key)
		return nil, p.refuse(ctx, info, refuseGang(gang.OutcomeInvalid, err.Error()))
	}
	if !inGang {
		return p.preFilterAlone(ctx, cs, pod, info.Constraints)
	}
	defer p.forgetIfEnded(info.Key)
	if info.NoGang != "" {
		// Said, not refused: its pods are placed one by one (quorum 1).
		p.carryOut(ctx, p.gangs.Refused(info.Key, gang.Refusal{Outcome: gang.OutcomeNotPossible, Message: info.NoGang}, p.now()), info.Ref)
		p.podEvent(pod, gang.OutcomeNotPossible, info.NoGang)
	}
	plan, r := p.gangPlan(ctx, pod, info, nodes)
	if r != nil {
		return nil, p.refuse(ctx, info, r)
	}
	return p.steer(cs, pod, info.Key, plan, info.Constraints)
}

// preFilterAlone serves a pod scheduled alone: it has a plan only when it
// preempted; otherwise Filter keeps it off capacity other gangs' plans hold.
func (p *Plugin) preFilterAlone(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, constraints gang.Constraints) (*fwk.PreFilterResult, *fwk.Status) {
	if plan := p.gangs.Plan(gang.LoneKey(pod)); plan != nil {
		return p.steer(cs, pod, gang.LoneKey(pod), plan, constraints)
	}
	st := &cycleState{policy: constraints.Policy, held: p.gangs.Held(p.source.priorityOf(pod))}
	if len(st.held) > 0 {
		// Filter reads the request only on nodes with held capacity;
		// summing it costs the framework's PodRequests twice.
		st.request = p.requestOf(pod)
		var err error
		if st.dra, err = p.dra.snapshot(ctx); err != nil {
			return nil, fwk.AsStatus(err)
		}
	}
	cs.Write(stateKey, st)
	return nil, nil
}

// gangPlan is the gang's active plan, made now when it has none and does
// not back off.
func (p *Plugin) gangPlan(ctx context.Context, pod *v1.Pod, info *gang.Resolved, nodes []fwk.NodeInfo) (*gang.ActivePlan, *refusal) {
	// One reading of the clock: the manager and this check must agree on
	// whether the gang still backs off (Planning is set only when not).
	now := p.now()
	admission := p.gangs.Admit(info.Key, pod.CreationTimestamp.Time, now)
	if until := admission.BackoffUntil; now.Before(until) {
		return nil, refuseCycle(fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("gang %s backs off until %s after: %s", info.Key, until.Format(time.RFC3339), admission.Why)))
	}
	if admission.Plan != nil {
		return admission.Plan, nil
	}
	return p.planGang(ctx, pod, info, nodes, admission.Planning)
}

// refusal is why a member cannot go ahead in this cycle: the status the
// framework gets and, when the gang's phase changes with it, what the gang
// manager records. refuse records it, in one place.
type refusal struct {
	status *fwk.Status
	// gang is nil when nothing new is said of the gang (it backs off, a
	// sibling's failed plan stands, the cycle failed).
	gang *gang.Refusal
	// failedPlan, for a gang with no room, tallies the nodes for the
	// record kubectl muster reads; asked only when the refusal is news.
	failedPlan func() *gang.FailedPlan
}

// refuseGang refuses the gang for outcome: recorded, announced, and the
// member unschedulable and unresolvable with msg.
func refuseGang(outcome gang.Outcome, msg string) *refusal {
	return &refusal{status: fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg), gang: &gang.Refusal{Outcome: outcome, Message: msg}}
}

// refuseCycle refuses this cycle only; the gang's phase stands.
func refuseCycle(status *fwk.Status) *refusal { return &refusal{status: status} }

// refuse records r for the gang of info and returns the framework's status.
func (p *Plugin) refuse(ctx context.Context, info *gang.Resolved, r *refusal) *fwk.Status {
	if r.gang != nil {
		effects := p.gangs.Refused(info.Key, *r.gang, p.now())
		if effects.Notice != nil && r.failedPlan != nil {
			p.failedPlans.record(info.OwnerKey, info.OwnerUID, r.failedPlan())
		}
		p.carryOut(ctx, effects, info.Ref)
	}
	return r.status
}

// steer sends a planned member to its slot: PreFilter narrows to it and
// Filter rejects every other node. Members of a plan that preempted wait
// until the victims are gone.
func (p *Plugin) steer(cs fwk.CycleState, pod *v1.Pod, key gang.Key, plan *gang.ActivePlan, constraints gang.Constraints) (*fwk.PreFilterResult, *fwk.Status) {
	node, planned := plan.Slots[pod.UID]
	if !planned {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("%s is placing %d other members; this pod waits for that plan to finish", key.Subject(), len(plan.Slots)))
	}
	state := &cycleState{slot: node, planID: plan.ID, key: key, policy: constraints.Policy}
	var pass *groupPass
	if cs.IsPodGroupSchedulingCycle() {
		// Seen, whether steered below or held back: a member of the plan
		// the pass never shows muster was refused by another PreFilter.
		pass = passOf(cs.GetPodGroupSchedulingCycle(), plan.ID)
		pass.saw(pod.UID)
	}
	// holdBack refuses the member while the plan waits for its victims.
	// PostFilter (PodGroupPostFilter in a pod-group cycle) reads that the
	// refusal is the wait, not a failure: by the time it runs the last
	// victim may be gone and the wait no longer visible.
	holdBack := func(msg string) (*fwk.PreFilterResult, *fwk.Status) {
		state.heldForVictims = true
		cs.Write(stateKey, state)
		if pass != nil {
			pass.heldBackForVictims()
		}
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	if n := plan.Victims.Len(); n > 0 {
		return holdBack(fmt.Sprintf("%s preempted pods to make room and waits for them; %d of them still terminating (planned on %s)", key.Subject(), n, node))
	}
	if cached := p.slotWithEvictedPod(plan); cached != "" {
		// Every victim is deleted, but the scheduler's cache (this
		// cycle's snapshot) still shows one on a planned node: muster's
		// informer saw it go first. Every member waits, not only the one
		// planned there: in a pod-group cycle a partial pass would count
		// as placed and the refused member would break the plan. The
		// PostFilter wakes the gang again once the cache has caught up.
		return holdBack(fmt.Sprintf("%s preempted pods to make room and waits for them to leave %s", key.Subject(), cached))
	}
	if !p.devicesReleased(plan) {
		// The victims are gone but the DRA devices they held are not
		// released yet: the planned node would refuse the member now. A
		// ResourceClaim event wakes it.
		return holdBack(fmt.Sprintf("%s preempted pods to make room and waits for the devices they held to be released", key.Subject()))
	}
	if pass != nil {
		state.pass = pass
		pass.steered(pod, node)
	}
	cs.Write(stateKey, state)
	return &fwk.PreFilterResult{NodeNames: sets.New(node)}, nil
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

// gangRequest is what planning a gang needs, gathered once: the planner's
// request (its Check set per attempt) and the pods it places.
type gangRequest struct {
	info *gang.Resolved
	// alone: the gang's quorum is bound and only this pod is placed.
	alone bool
	req   gang.Request
	set   memberSet
	// candidates are the members to place, as the framework sees them:
	// their affinity terms parsed and their requests summed once per plan.
	candidates []*framework.PodInfo
	// planning is what the gang manager said planning needs (other gangs'
	// holdings, the pairs to avoid, the last failed plan).
	planning *gang.Planning
	// priority is the gang's, its lowest member's (preemptorPriority);
	// never names a member that may not preempt.
	priority int32
	never    string
}

// prepareGang gathers the gang of pod for planning: the pending members to
// place, around the members already bound.
func (p *Plugin) prepareGang(ctx context.Context, pod *v1.Pod, info *gang.Resolved, planning *gang.Planning) (*gangRequest, *refusal) {
	key, c := info.Key, info.Constraints
	set := p.source.membersInFlight(key, planning.InFlight)
	if set.total < info.Quorum {
		return nil, refuseGang(gang.OutcomeWaitingForMembers, shortMessage(key, set.total, info.Quorum))
	}
	needed := info.Quorum - set.bound()
	if needed > len(set.pending) {
		return nil, refuseGang(gang.OutcomeWaitingForMembers, fmt.Sprintf("gang %s needs %d more members but only %d can be scheduled; %d are held by scheduling gates",
			key, needed, len(set.pending), set.total-set.bound()-len(set.pending)))
	}
	candidates := set.pending
	if needed <= 0 {
		// Quorum is already bound (e.g. a member beyond min-available):
		// place this pod, still around the members that run.
		candidates, needed = []*v1.Pod{pod}, 1
	}
	if msg := disagreement(key, pod, c, candidates, p.nodes.levels); msg != "" {
		return nil, refuseGang(gang.OutcomeInvalid, msg)
	}
	// The owner's own topology requirement narrows the members' wishes.
	c.Required = gang.NarrowerLevel(p.nodes.levels, c.Required, info.Required)
	gr := &gangRequest{info: info, set: set, alone: len(candidates) == 1, planning: planning, req: gang.Request{
		Gang:       key.String(),
		Needed:     needed,
		GPU:        v1.ResourceName(p.args.GPUResourceName),
		Levels:     p.nodes.levels,
		Topology:   p.nodes.topology,
		Required:   c.Required,
		Preferred:  c.Preferred,
		Policy:     c.Policy,
		BoundNodes: set.boundNodes,
	}}
	byTemplate := map[string]*gang.NodeConstraints{}
	claims := &claimUnit{counted: sets.New[types.UID]()} // a claim several members share counts once
	for _, m := range candidates {
		pi, err := framework.NewPodInfo(m)
		if err != nil {
			return nil, refuseGang(gang.OutcomeInvalid, fmt.Sprintf("gang %s: member %s: %v", key, m.Name, err))
		}
		gr.candidates = append(gr.candidates, pi)
		tmpl := templateKey(m)
		nc := byTemplate[tmpl]
		if nc == nil {
			nc = gang.ConstraintsOf(klog.FromContext(ctx), m)
			byTemplate[tmpl] = nc
		}
		req := p.dra.request(podRequest(pi.CalculateResource()), m, claims)
		gr.req.Members = append(gr.req.Members, gang.Member{UID: m.UID, Name: m.Name, Request: req, Constraints: nc})
		// A nomination left from an earlier attempt (a failover, a Permit
		// wait that ended) must not make the framework count this pending
		// member twice against its own gang's plan.
		if m.Status.NominatedNodeName != "" {
			p.handle.DeleteNominatedPodIfExists(m)
		}
	}
	gr.priority, gr.never = p.preemptorPriority(pod, gr.candidates)
	planning.Priority = gr.priority
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
	check, err := p.newFilterCheck(ctx, gr.info.Key, gr.candidates, victims, gr.planning.Avoided)
	if err != nil {
		return nil, nil, err
	}
	req := gr.req
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

// planGang computes and installs a plan for the gang of pod: every pending
// member, around the members already bound, each choice confirmed by the
// profile's own filters.
func (p *Plugin) planGang(ctx context.Context, pod *v1.Pod, info *gang.Resolved, nodes []fwk.NodeInfo, planning *gang.Planning) (*gang.ActivePlan, *refusal) {
	gr, r := p.prepareGang(ctx, pod, info, planning)
	if r != nil {
		return nil, r
	}
	// A sibling's cycle found no plan on this very snapshot, with no plan
	// dropped and no member's spec changed since: the answer is the same.
	dra, err := p.dra.snapshot(ctx)
	if err != nil {
		return nil, refuseCycle(fwk.AsStatus(err))
	}
	views, generation := p.nodes.views(nodes, dra)
	epoch := gang.Epoch{Snapshot: generation, Releases: planning.Releases}
	for _, m := range gr.candidates {
		epoch.Members += m.Pod.Generation
	}
	if !gr.alone {
		if msg, ok := planning.FailedPlan(epoch, len(gr.candidates), gr.req.Needed, p.now()); ok {
			return nil, refuseCycle(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg))
		}
	}
	// Members still waiting at Permit from a plan that was dropped while they
	// entered it hold capacity no plan accounts for: release them first.
	released := p.rejectWaiting(info.Key, nil, fmt.Sprintf("gang %s is being planned again", info.Key))

	if p.dra.enabled() && len(p.dra.attributes) > 0 {
		p.nodes.topology.SetDeviceDomains(p.dra, p.dra.topologyVersion())
	}
	start := p.now()
	plan, check, err := p.computePlan(ctx, gr, views, nil, nil)
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
		r := refuseGang(gang.OutcomeUnschedulable, msg)
		if !gr.alone && check != nil && len(check.rejected) == 0 && released.Len() == 0 {
			r.gang.Reuse = &gang.FailedAttempt{Epoch: epoch, Pending: len(gr.candidates), Needed: gr.req.Needed, Valid: reuseFailedPlan}
		}
		r.failedPlan = func() *gang.FailedPlan {
			// Counted on the views the plan saw: other gangs' holdings
			// taken out, as computePlan did.
			held := p.nodes.subtractHeld(views, planning.HeldByOthers())
			var closest string
			if u := (*gang.Unplaceable)(nil); errors.As(err, &u) {
				closest = u.Closest
			}
			return &gang.FailedPlan{Time: p.now(), Nodes: gang.TallyNodes(gr.req, held, check.refuser(), closest), Message: msg}
		}
		return nil, r
	}
	klog.FromContext(ctx).V(4).Info("Plan checked with the framework's filters", "gang", info.Key, "filterChecks", check.checks)
	active, status := p.installPlan(ctx, pod, gr, plan, nil, "")
	if status != nil {
		return nil, refuseCycle(status)
	}
	return active, nil
}

// installPlan makes plan the gang's active plan, holding its slots in the
// ledger, and wakes the planned siblings (unless victims must go first).
// preempting announces a plan with victims.
func (p *Plugin) installPlan(ctx context.Context, pod *v1.Pod, gr *gangRequest, plan *gang.Plan, victims []*v1.Pod, preempting string) (*gang.ActivePlan, *fwk.Status) {
	info, key := gr.info, gr.info.Key
	now := p.now()
	active := &gang.ActivePlan{
		Plan:     *plan,
		Requests: map[types.UID]gang.Resources{},
		Reserved: sets.New[types.UID](),
		Victims:  sets.New[types.UID](),
		Profile:  p.handle.ProfileName(),
		Created:  now,
		Deadline: now.Add(info.Timeout),
		Quorum:   info.Quorum,
		Priority: gr.priority,
		CountsOn: sets.New(gr.set.boundUIDs...),
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
	msg := preempting
	if len(victims) == 0 {
		msg = fmt.Sprintf("gang %s: %d members planned on %d nodes in %s %s (%d preemptible)",
			key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain, plan.PreemptibleNodes)
		if gr.set.bound() > 0 {
			msg += fmt.Sprintf(", joining %d running members", gr.set.bound())
		}
	}
	effects, ok := p.gangs.Install(key, active, pod.UID, msg, pod.CreationTimestamp.Time, p.presence(gr, victims), p.backoffBase())
	if !ok {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s was planned concurrently; retrying", key))
	}
	p.carryOut(ctx, effects, info.Ref)
	if d := effects.Dropped; d != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: %s; the plan is dropped", key, d.Reason))
	}
	klog.FromContext(ctx).V(2).Info("Planned gang", "gang", key, "members", len(plan.Slots), "bound", gr.set.bound(), "level", plan.Level, "domain", plan.Domain,
		"nodes", plan.Nodes, "preemptibleNodes", plan.PreemptibleNodes, "victims", len(victims))
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
	pp := &planPresence{src: p.source, key: gr.info.Key, names: map[types.UID]string{}, victims: map[types.UID]*v1.Pod{}}
	for _, m := range gr.req.Members {
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

// reuseFailedPlan bounds how long a gang's members reuse a sibling's failed
// plan when nothing observable changed: long enough for one wave of
// sibling cycles, short enough that nothing unobserved is missed for long.
const reuseFailedPlan = 2 * time.Second

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
