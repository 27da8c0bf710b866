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

func readState(cs fwk.CycleState) *cycleState {
	data, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*cycleState)
	return s
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
	_, _, total := p.members(info.key)
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
		cs.Write(stateKey, &cycleState{policy: constraints.Policy, held: p.registry.Held(gang.Key{}), request: gang.PodRequest(pod)})
		return nil, nil
	}
	key := info.key
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
	node, planned := plan.Slots[pod.UID]
	if !planned {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("gang %s is placing %d other members; this pod waits for that plan to finish", key, len(plan.Slots)))
	}
	cs.Write(stateKey, &cycleState{slot: node, planID: plan.ID, key: key, policy: constraints.Policy})
	return &fwk.PreFilterResult{NodeNames: sets.New(node)}, nil
}

// planGang computes and installs a plan for the gang of pod.
func (p *Plugin) planGang(ctx context.Context, pod *v1.Pod, info *gangInfo, c gang.Constraints, nodes []fwk.NodeInfo) (*gang.ActivePlan, *fwk.Status) {
	logger := klog.FromContext(ctx)
	key := info.key
	pending, bound, total := p.members(key)
	if total < info.quorum {
		msg := fmt.Sprintf("gang %s has %d of %d members; waiting for the rest to be created", key, total, info.quorum)
		p.notice(ctx, info, v1.EventTypeNormal, ReasonWaitingForMembers, msg)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	needed := info.quorum - bound
	if needed > len(pending) {
		msg := fmt.Sprintf("gang %s needs %d more members but only %d can be scheduled; %d are held by scheduling gates",
			key, needed, len(pending), total-bound-len(pending))
		p.notice(ctx, info, v1.EventTypeNormal, ReasonWaitingForMembers, msg)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
	}
	candidates := pending
	if needed <= 0 {
		// Quorum is already bound (e.g. a replacement pod): place this pod alone.
		candidates, needed = []*v1.Pod{pod}, 1
	}

	req := gang.Request{
		Gang:      key.String(),
		Needed:    needed,
		GPU:       v1.ResourceName(p.args.GPUResourceName),
		Levels:    p.levels,
		Required:  c.Required,
		Preferred: c.Preferred,
		Policy:    c.Policy,
	}
	byTemplate := map[string]*gang.NodeConstraints{}
	for _, m := range candidates {
		tmpl := templateKey(m)
		nc := byTemplate[tmpl]
		if nc == nil {
			nc = gang.ConstraintsOf(m)
			byTemplate[tmpl] = nc
		}
		req.Members = append(req.Members, gang.Member{UID: m.UID, Name: m.Name, Request: gang.PodRequest(m), Constraints: nc})
	}

	// Members still waiting at Permit from a plan that was dropped while they
	// entered it hold capacity no plan accounts for: release them first.
	p.rejectWaiting(key, nil, fmt.Sprintf("gang %s is being planned again", key))

	start := p.now()
	views := p.nodeViews(nodes, p.registry.Held(key))
	plan, err := gang.Compute(req, views)
	planDuration.Observe(p.now().Sub(start).Seconds())
	if err != nil {
		unplaceable.Inc()
		p.notice(ctx, info, v1.EventTypeWarning, ReasonUnschedulable, err.Error())
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}

	now := p.now()
	active := &gang.ActivePlan{
		Plan:     *plan,
		Requests: map[types.UID]gang.Resources{},
		Reserved: sets.New[types.UID](),
		Created:  now,
		Deadline: now.Add(info.timeout),
		Quorum:   info.quorum,
		Bound:    bound,
	}
	for _, m := range req.Members {
		if _, ok := plan.Slots[m.UID]; ok {
			active.Requests[m.UID] = m.Request
		}
	}
	if !p.registry.SetPlan(key, active, pod.CreationTimestamp.Time) {
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s was planned concurrently; retrying", key))
	}
	id := active.ID
	p.after(info.timeout, func() { p.expirePlan(key, id) })
	logger.V(2).Info("Planned gang", "gang", key, "members", len(plan.Slots), "level", plan.Level, "domain", plan.Domain,
		"nodes", plan.Nodes, "preemptibleNodes", plan.PreemptibleNodes, "duration", now.Sub(start))
	p.notice(ctx, info, v1.EventTypeNormal, ReasonPlanned, fmt.Sprintf("gang %s: %d members planned on %d nodes in %s %s (%d preemptible)",
		key, len(plan.Slots), plan.Nodes, plan.Level, plan.Domain, plan.PreemptibleNodes))
	var siblings []*v1.Pod
	for _, m := range pending {
		if _, planned := plan.Slots[m.UID]; planned && m.UID != pod.UID {
			siblings = append(siblings, m)
		}
	}
	p.activate(logger, siblings)
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
	s := readState(cs)
	if s == nil {
		return fwk.AsStatus(fmt.Errorf("%s: PreFilter state missing", Name))
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

// PostFilter runs when a member could not go to its planned node: another
// filter saw something the planner could not (ports, pod affinity, volumes,
// a pod the default scheduler placed there). The plan is dropped at once and
// the waiting siblings released, so nothing stays held.
func (p *Plugin) PostFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s := readState(cs)
	if s == nil || s.slot == "" {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	why := "node is gone"
	if st := statuses.Get(s.slot); st != nil && len(st.Reasons()) > 0 {
		why = st.Message()
	}
	reason := fmt.Sprintf("member %s no longer fits its planned node %s: %s", pod.Name, s.slot, why)
	p.failPlan(ctx, s.key, s.planID, "plan_broken", reason)
	return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: %s", s.key, reason))
}

// Score gives a gang member's planned node the top score (it is the only
// feasible one) and ranks nodes for pods scheduled alone by their
// preemptible policy; bin-packing comes from NodeResourcesFit's
// MostAllocated strategy in the shipped configuration.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(cs)
	if s == nil || s.slot != "" {
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
