package mustergang

import (
	"context"
	"fmt"
	"maps"
	"sort"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/muster-sched/muster/pkg/gang"
)

// maxPreemptionDryRuns bounds the victim search: each candidate set costs
// one plan (with the framework's filters) on the snapshot without it.
const maxPreemptionDryRuns = 256

// preempt makes room for the gang of pod, a member without a plan, by
// evicting lower-priority pods (gang.Decisions.Preempt), and carries that
// out. The result nominates pod when victims go; nil when none do.
func (p *Plugin) preempt(ctx context.Context, pod *v1.Pod) (*fwk.PostFilterResult, *fwk.Status) {
	c := &cycle{p: p, ctx: ctx}
	r := p.gangs.Decisions().Preempt(c, pod)
	result, status := p.enactRecourse(ctx, c, pod, r)
	if r.Evict == 0 {
		return nil, status
	}
	return result, status
}

// startEvictions evicts the units found chose for the preemptor's plan
// planID, in the background: each is told why, then deleted whole.
func (p *Plugin) startEvictions(ctx context.Context, found *gang.VictimsFound, preemptor *v1.Pod, key gang.Key, planID int64, gpus int64) {
	logger := klog.FromContext(ctx)
	preemptions.Inc()
	preemptedGPUs.Add(float64(gpus))
	var names []string
	var victimsByUnit [][]*v1.Pod
	for _, i := range found.Choice.Units {
		p.recordVictim(ctx, found.Candidates[i], key)
		names = append(names, found.Candidates[i].Name)
		victimsByUnit = append(victimsByUnit, found.Candidates[i].Victims)
	}
	logger.Info("Preempting for gang", "gang", key, "victims", names, "pods", len(found.Pods), "gpus", gpus, "budgetViolations", found.Choice.Violations, "checks", found.Checks)
	// Counted before the goroutine starts, so whoever watches the gauge never
	// sees an eviction as done before it began.
	evictions := schedmetrics.Goroutines.WithLabelValues(EvictionOperation)
	evictions.Inc()
	go func() {
		defer evictions.Dec()
		// The cycle's context ends with the cycle; the eviction ends with
		// the scheduler, logging as the cycle does.
		p.evictions.evict(klog.NewContext(p.handlerCtx(), logger), victimsByUnit, preemptor, key, planID)
	}()
}

// stillTerminating counts the pods the gang's last preemption evicted that
// the scheduler's snapshot still shows terminating, on nodes the gang
// could still use. A victim whose deletion failed and that runs on holds
// nothing back (it may be chosen again); once none is left the gang stops
// looking. After a restart the manager knows
// none of them: then the nominations the scheduler wrote for the gang's
// members (the preemptor's names its slot) say where to look.
func (p *Plugin) stillTerminating(ctx context.Context, key gang.Key) (int, error) {
	uids := p.gangs.Preempted(key)
	if uids.Len() == 0 {
		return p.terminatingWhereNominated(ctx, key), nil
	}
	nodes, err := p.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return 0, err
	}
	var pending []*v1.Pod // read once a victim terminates
	terminating, left := 0, 0
	for _, ni := range nodes {
		here := 0
		for _, pi := range ni.GetPods() {
			if pod := pi.GetPod(); uids.Has(pod.UID) {
				left++
				if pod.DeletionTimestamp != nil {
					here++
				}
			}
		}
		if here > 0 && pending == nil {
			pending = p.source.members(key).pending
		}
		if here > 0 && !p.refusedToAll(ctx, pending, ni) {
			terminating += here
		}
	}
	if left == 0 {
		p.gangs.PreemptedGone(key)
	}
	return terminating, nil
}

// refusedToAll reports whether the profile's filters refuse every pod on
// ni for good (refusedForGood): a victim terminating there (its kubelet
// lost, the node cordoned) may never finish, and frees nothing the gang
// could use if it did.
func (p *Plugin) refusedToAll(ctx context.Context, pods []*v1.Pod, ni fwk.NodeInfo) bool {
	for _, pod := range pods {
		if !p.refusedForGood(ctx, pod, ni) {
			return false
		}
	}
	return len(pods) > 0
}

// terminatingWhereNominated counts the pods terminating by preemption for
// the gang's pending members on the nodes they are nominated to
// (terminatingFor).
func (p *Plugin) terminatingWhereNominated(ctx context.Context, key gang.Key) int {
	seen := sets.New[string]()
	n := 0
	for _, m := range p.source.members(key).pending {
		if node := m.Status.NominatedNodeName; node != "" && !seen.Has(node) {
			seen.Insert(node)
			n += p.terminatingFor(ctx, m, node)
		}
	}
	return n
}

// terminatingFor counts the pods of lower priority than pod terminating by
// preemption on node, as DefaultPreemption's PodEligibleToPreemptOthers
// does for the nominated node; none on a node that left or that the
// profile's filters refuse pod for good (refusedForGood): what terminates
// there may never finish, and the pod may preempt elsewhere.
func (p *Plugin) terminatingFor(ctx context.Context, pod *v1.Pod, node string) int {
	ni, err := p.handle.SnapshotSharedLister().NodeInfos().Get(node)
	if err != nil || ni.Node() == nil {
		return 0
	}
	prio := p.source.priorityOf(pod)
	count := 0
	for _, pi := range ni.GetPods() {
		if v := pi.GetPod(); preemption.PodTerminatingByPreemption(v) && p.source.priorityOf(v) < prio {
			count++
		}
	}
	if count > 0 && p.refusedForGood(ctx, pod, ni) {
		return 0
	}
	return count
}

// refusedForGood reports whether a filter of the profile refuses pod on ni
// for a reason no eviction there changes (UnschedulableAndUnresolvable: the
// node cordoned, a taint of a lost kubelet; being reclaimed, which muster's
// own Filter decides), as DefaultPreemption reads the nominated node's
// status. The node is full until the victims are gone, so a filter that
// refuses it for room (Unschedulable) is set aside and the rest asked, in
// the profile's order. A pod its PreFilter plugins refuse everywhere is
// not refused here: that is no reason to preempt elsewhere.
func (p *Plugin) refusedForGood(ctx context.Context, pod *v1.Pod, ni fwk.NodeInfo) bool {
	if p.nodes.reclaiming(ni.Node()) {
		return true
	}
	fw, ok := p.handle.(framework.Framework)
	if !ok {
		return false
	}
	state := framework.NewCycleState()
	state.Write(dryRunKey, dryRunMarker{}) // muster's own PreFilter and Filter stand aside
	if _, status, _ := fw.RunPreFilterPlugins(ctx, state, pod); !status.IsSuccess() {
		return false
	}
	skip := state.GetSkipFilterPlugins().Clone()
	for {
		state.SetSkipFilterPlugins(skip)
		status := fw.RunFilterPlugins(ctx, state, pod, ni)
		switch {
		case status.IsSuccess():
			return false
		case status.Code() == fwk.UnschedulableAndUnresolvable:
			return true
		case status.Plugin() == "" || skip.Has(status.Plugin()):
			return false
		}
		skip.Insert(status.Plugin())
	}
}

// searchVictims finds what to evict for the gang of gr, changing nothing
// (gang.FindVictims): the scheduler's side of the search is victimFinder.
func (p *Plugin) searchVictims(ctx context.Context, gr *gangRequest, prio int32, policy gang.Policy) (*gang.VictimsFound, error) {
	nodes, err := p.handle.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return nil, err
	}
	if !p.anyBoundBelow(nodes, prio) {
		return &gang.VictimsFound{}, nil // before the DRA snapshot and the views: nothing to search
	}
	dra, err := p.dra.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	views, _ := p.nodes.views(nodes, dra)
	gpu := v1.ResourceName(p.args.GPUResourceName)
	lackGPUs := gang.NeededGPUs(gr.Request) - gang.FreeGPUs(p.nodes.subtractHeld(views, gr.planning.HeldByOthers()), policy, gpu)
	found := gang.FindVictims(&victimFinder{p: p, ctx: ctx, gr: gr, nodes: nodes, views: views, prio: prio, policy: policy},
		gang.VictimSearchInput{Views: views, Request: gr.Request, Policy: policy, GPU: gpu, LackGPUs: lackGPUs, MaxChecks: maxPreemptionDryRuns})
	preemptionChecks.Observe(float64(found.Checks))
	return &found, nil
}

// victimFinder is the scheduler's side of one preemption search on the
// cycle's snapshot (nodes, and views[i] for nodes[i]).
type victimFinder struct {
	p      *Plugin
	ctx    context.Context
	gr     *gangRequest
	nodes  []fwk.NodeInfo
	views  []gang.NodeView
	prio   int32
	policy gang.Policy
}

func (f *victimFinder) Candidates(loneOn func(node int) bool) []*gang.Candidate {
	return f.p.victimUnits(f.nodes, f.views, f.gr.Info.Key, f.prio, f.policy, loneOn)
}

func (f *victimFinder) Budgets(candidates []*gang.Candidate, units []gang.VictimUnit) []int32 {
	return f.p.budgets(candidates, units)
}

func (f *victimFinder) TryWithout(candidates []*gang.Candidate) (*gang.Plan, map[string]bool) {
	var pods []*v1.Pod
	var freed []gang.Resources
	for _, u := range candidates {
		pods = append(pods, u.Victims...)
		freed = append(freed, u.Requests...)
	}
	plan, check, err := f.p.computePlan(f.ctx, f.gr, f.views, pods, freed)
	var refused map[string]bool
	if check != nil {
		refused = check.refusedNodes
	}
	if err != nil {
		return nil, refused
	}
	return plan, refused
}

// preemptorPriority is the priority a gang preempts with: its lowest
// member's, so no member evicts what another could not. never names a
// member whose preemptionPolicy is Never (then the gang evicts nothing).
func (p *Plugin) preemptorPriority(pod *v1.Pod, members []*framework.PodInfo) (prio int32, never string) {
	prio = p.source.priorityOf(pod)
	pods := []*v1.Pod{pod}
	for _, m := range members {
		pods = append(pods, m.Pod)
	}
	for _, m := range pods {
		prio = min(prio, p.source.priorityOf(m))
		if m.Spec.PreemptionPolicy != nil && *m.Spec.PreemptionPolicy == v1.PreemptNever && never == "" {
			never = m.Name
		}
	}
	return prio, never
}

// anyBoundBelow reports whether a pod of priority below prio is bound on
// one of nodes: without one every unit is protected and the search finds
// nothing. On a full cluster most queued gangs are of the lowest priority,
// and each used to gather every bound pod into units to learn that
// (BENCHMARKS.md, "A contended soak").
func (p *Plugin) anyBoundBelow(nodes []fwk.NodeInfo, prio int32) bool {
	for _, ni := range nodes {
		if ni.Node() == nil {
			continue
		}
		for _, bp := range p.nodes.boundPods(ni) {
			if p.source.priorityIn(bp.info.GetPod(), bp.gang) < prio {
				return true
			}
		}
	}
	return false
}

// victimUnits groups the snapshot's pods into whole gangs (every bound
// member, wherever it runs, whichever scheduler placed it) and lone pods,
// and keeps the units entirely below priority prio, with no member already
// terminating or chosen by another preemption, and with a pod on a node the
// preemptor's policy may use (views[i] is nodes[i]'s, from nodeViews).
// FreedGPUs counts the GPUs a unit frees on such nodes.
//
// Lone pods that ask for no GPU are left out except on the nodes lone
// says: on a real cluster they are most pods (agents, services), and a GPU
// gang's search never needs them.
func (p *Plugin) victimUnits(nodes []fwk.NodeInfo, views []gang.NodeView, preemptor gang.Key, prio int32, policy gang.Policy, lone func(node int) bool) []*gang.Candidate {
	gpu := v1.ResourceName(p.args.GPUResourceName)
	byKey := map[gang.Key]*gang.Candidate{}
	useful := map[gang.Key]bool{}
	protected := map[gang.Key]bool{}
	claims := p.victimClaims(nodes)
	for i, ni := range nodes {
		if ni.Node() == nil {
			continue
		}
		eligible := views[i].Eligible(policy)
		loneHere := lone(i)
		for _, bp := range p.nodes.boundPods(ni) {
			pod := bp.info.GetPod()
			k, inGang := p.source.victimKeyIn(pod, bp.gang, bp.inGang)
			request := bp.request
			if !bp.final {
				var unit *claimUnit
				if inGang {
					unit = claims(k)
				}
				request.Scalars = maps.Clone(request.Scalars) // dra.request writes them
				request = p.dra.request(request, pod, unit)
			}
			gpus := request.Scalars[gpu]
			if !inGang && gpus == 0 && !loneHere {
				continue
			}
			key := gang.LoneKey(pod)
			if inGang {
				key = k
			}
			if key == preemptor {
				continue
			}
			podPrio := p.source.priorityIn(pod, bp.gang)
			// A lone unit whose pod is a member of a gang being placed (a
			// PodGroup whose pods may be disrupted one by one) is not
			// deleted from under its plan.
			if podPrio >= prio || pod.DeletionTimestamp != nil || p.gangs.IsVictim(pod.UID) || (!inGang && bp.inGang && p.gangs.Plan(bp.gang) != nil) {
				protected[key] = true // the whole unit, never a part of it
				continue
			}
			u := byKey[key]
			if u == nil {
				name := "pod " + pod.Namespace + "/" + pod.Name
				if inGang {
					name = "gang " + k.String()
				}
				u = &gang.Candidate{Key: key, VictimUnit: gang.VictimUnit{Name: name, Priority: podPrio}}
				byKey[key] = u
			}
			u.Victims = append(u.Victims, pod)
			u.Requests = append(u.Requests, request)
			u.Nodes = append(u.Nodes, i)
			u.Pods++
			u.GPUs += gpus
			u.Priority = max(u.Priority, podPrio)
			started := pod.CreationTimestamp.Time
			if pod.Status.StartTime != nil {
				started = pod.Status.StartTime.Time
			}
			if started.After(u.Started) {
				u.Started = started
			}
			if eligible {
				useful[key] = true
				u.FreedGPUs += gpus
			}
		}
	}
	var units []*gang.Candidate
	for key, u := range byKey {
		// A gang with a plan in progress has members waiting at Permit;
		// it is not a victim while it is being placed. A bound pod alone
		// has no plan (its plan ends at its Permit), so the thousands of
		// lone units of a real cluster cost no lookup here.
		if !useful[key] || protected[key] || (u.Key.Kind != gang.KindPod && p.gangs.Plan(u.Key) != nil) {
			continue
		}
		units = append(units, u)
	}
	sort.Slice(units, func(i, j int) bool { return units[i].Name < units[j].Name })
	return units
}

// victimClaims returns the claim unit of each victim gang among the pods
// on nodes: a claim its members share is freed once by its eviction. Which
// gang each bound pod is in is looked up only when a claim has several
// consumers.
func (p *Plugin) victimClaims(nodes []fwk.NodeInfo) func(gang.Key) *claimUnit {
	units := map[gang.Key]*claimUnit{}
	var gangOf map[types.UID]gang.Key
	in := func(key gang.Key, uid types.UID) bool {
		if gangOf == nil {
			gangOf = map[types.UID]gang.Key{}
			for _, ni := range nodes {
				for _, pi := range ni.GetPods() {
					if k, ok := p.source.victimKey(pi.GetPod()); ok {
						gangOf[pi.GetPod().UID] = k
					}
				}
			}
		}
		k, ok := gangOf[uid]
		return ok && k == key
	}
	return func(key gang.Key) *claimUnit {
		u := units[key]
		if u == nil {
			u = &claimUnit{counted: sets.New[types.UID](), has: func(uid types.UID) bool { return in(key, uid) }}
			units[key] = u
		}
		return u
	}
}

// budgets fills each unit's Budgets with how many of its pods each
// PodDisruptionBudget covers, and returns each budget's
// status.disruptionsAllowed: the search counts violations for the whole
// chosen set, as DefaultPreemption does.
func (p *Plugin) budgets(units []*gang.Candidate, candidates []gang.VictimUnit) []int32 {
	if p.pdbs == nil {
		return nil
	}
	var allowed []int32
	index := map[*policyv1.PodDisruptionBudget]int{}
	byNamespace := map[string][]*policyv1.PodDisruptionBudget{}
	for i, u := range units {
		for _, pod := range u.Victims {
			pdbs, listed := byNamespace[pod.Namespace]
			if !listed {
				pdbs, _ = p.pdbs.PodDisruptionBudgets(pod.Namespace).List(labels.Everything())
				byNamespace[pod.Namespace] = pdbs
			}
			for _, pdb := range pdbs {
				// policy/v1: an empty selector covers every pod of the
				// namespace, a nil one none (LabelSelectorAsSelector gives
				// Everything and Nothing). DefaultPreemption still counts
				// an empty one as none, as policy/v1beta1 did; the eviction
				// API and the disruption controller do not.
				selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
				if err != nil || !selector.Matches(labels.Set(pod.Labels)) {
					continue
				}
				if _, disrupted := pdb.Status.DisruptedPods[pod.Name]; disrupted {
					continue // already taken from the allowance, as DefaultPreemption counts it
				}
				b, ok := index[pdb]
				if !ok {
					b = len(allowed)
					index[pdb] = b
					allowed = append(allowed, pdb.Status.DisruptionsAllowed)
				}
				if candidates[i].Budgets == nil {
					candidates[i].Budgets = map[int]int32{}
				}
				candidates[i].Budgets[b]++
			}
		}
	}
	return allowed
}

// recordVictim tells a victim gang (or the lone pod) why it is evicted.
func (p *Plugin) recordVictim(ctx context.Context, u *gang.Candidate, preemptor gang.Key) {
	msg := fmt.Sprintf("preempted by higher-priority %s: %d pods, %d %s", preemptor.Subject(), u.Pods, u.GPUs, p.args.GPUResourceName)
	if u.Key.Kind != gang.KindPod {
		if ref := p.source.ownerRef(u.Key); ref != nil {
			p.handle.EventRecorder().Eventf(ref, nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
		}
		return
	}
	p.handle.EventRecorder().Eventf(u.Victims[0], nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
}
