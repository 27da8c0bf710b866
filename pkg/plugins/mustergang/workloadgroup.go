package mustergang

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/muster-sched/muster/pkg/gang"
)

// Kubernetes' own gangs: a pod with spec.schedulingGroup belongs to that
// scheduling.k8s.io/v1beta1 PodGroup (GenericWorkload gate). The group is
// read from the framework's own PodGroup state (Handle.PodGroupManager),
// never from an informer of muster's.
//
// With the gate on, kube-scheduler queues such pods as one pod-group entity
// and runs its pod-group cycle: every queued member's PreFilter, Filter and
// Reserve in one pass over one snapshot, then all of them are reverted, and
// the members go to Reserve and Permit again for real. muster's PreFilter
// plans the gang for the first member and steers each member to its slot,
// so the pass places the whole plan or nothing. Reserve and Unreserve leave
// the tentative pass alone (IsPodGroupSchedulingCycle), but Reserve notes
// who got through it: the core counts a partly placed group as success
// (the framework takes placement feasibility only from its own
// GangScheduling plugin), so muster's Permit refuses the placed members
// when a sibling was refused at its slot. PodGroupPostFilter stands in for
// PostFilter, which the core does not run inside a pod-group cycle.

var _ fwk.PodGroupPostFilterPlugin = &Plugin{}

// WorkloadPodGroup returns a Kubernetes PodGroup from the scheduler's
// cache (gang.Owners).
func (src *gangSource) WorkloadPodGroup(namespace, name string) (*schedulingv1beta1.PodGroup, error) {
	key := gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: namespace, Name: name}
	manager := src.handle.PodGroupManager()
	if manager == nil {
		return nil, fmt.Errorf("gang %s: the scheduler keeps no PodGroups; run muster with --feature-gates=GenericWorkload=true", key)
	}
	pg, err := manager.PodGroups().Get(namespace, name)
	if err != nil {
		// Not a NotFound error: this message says what muster needs.
		return nil, fmt.Errorf("gang %s: PodGroup %s not found in namespace %s (muster needs --feature-gates=GenericWorkload=true to see PodGroups): %v",
			key, name, namespace, err)
	}
	return pg, nil
}

// priorityOf is the priority pod schedules and is preempted with: its
// PodGroup's spec.priority when it joins one that has it, else its own.
func (src *gangSource) priorityOf(pod *v1.Pod) int32 {
	key, _ := gang.KeyOf(pod)
	return src.priorityIn(pod, key)
}

// priorityIn is priorityOf for a pod whose gang.KeyOf is key (the zero Key
// when it has none).
func (src *gangSource) priorityIn(pod *v1.Pod, key gang.Key) int32 {
	if key.Kind == gang.KindWorkloadPodGroup {
		if pg, err := src.WorkloadPodGroup(key.Namespace, key.Name); err == nil && pg.Spec.Priority != nil {
			return *pg.Spec.Priority
		}
	}
	return corev1helpers.PodPriority(pod)
}

// victimKey is the unit pod is preempted in: its gang, except for the
// members of a gang PodGroup that lets its pods be disrupted one by one
// (disruptionMode single, the API's default), which are units of their own
// like pods scheduled alone. A basic PodGroup's pods are their Job's or
// StatefulSet's gang, as without the PodGroup.
func (src *gangSource) victimKey(pod *v1.Pod) (gang.Key, bool) {
	key, ok := gang.KeyOf(pod)
	return src.victimKeyIn(pod, key, ok)
}

// victimKeyIn is victimKey for a pod whose gang.KeyOf is key, ok.
func (src *gangSource) victimKeyIn(pod *v1.Pod, key gang.Key, ok bool) (gang.Key, bool) {
	if !ok || key.Kind != gang.KindWorkloadPodGroup {
		return key, ok
	}
	pg, err := src.WorkloadPodGroup(key.Namespace, key.Name)
	if err != nil {
		return gang.Key{}, false
	}
	if pg.Spec.SchedulingPolicy.Gang == nil {
		_, owned := gang.ControllerKey(pod)
		return key, owned
	}
	if mode := pg.Spec.DisruptionMode; mode == nil || mode.All == nil {
		return gang.Key{}, false
	}
	return key, true
}

// PodGroupPostFilter runs when a PodGroup's cycle placed none of its
// members. It is PostFilter for the group: with no plan the gang may
// preempt; a plan waiting for its victims keeps its hold and nominations;
// any other plan was refused at its slots and is dropped.
func (p *Plugin) PodGroupPostFilter(ctx context.Context, cs fwk.PodGroupCycleState, group fwk.PodGroupInfo, _ fwk.PodGroupSchedulingFunc) (*fwk.PodGroupPostFilterResult, *fwk.Status) {
	pods := group.GetUnscheduledPods()
	if len(pods) == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "no member to place")
	}
	key, plan := gang.Key{}, (*gang.ActivePlan)(nil)
	for _, pod := range pods {
		if key, plan = p.gangs.PlanOf(pod.UID); plan != nil {
			break
		}
	}
	if plan == nil {
		var released []string
		for _, pod := range pods {
			if msg := p.releaseEarlierAllocation(ctx, pod); msg != "" {
				released = append(released, pod.Name+": "+msg)
			}
		}
		if len(released) > 0 {
			p.clearNominations(ctx, pods)
			return nil, fwk.NewStatus(fwk.Unschedulable, strings.Join(released, "; "))
		}
		// Preempting for the gang, through any member: the plan may leave
		// pods[0] out (a quorum below the members pending) and nominate
		// only the others.
		result, status := p.preempt(ctx, pods[0])
		if result != nil {
			for _, pod := range pods {
				if _, plan = p.gangs.PlanOf(pod.UID); plan != nil {
					return nominations(pods, plan), fwk.NewStatus(fwk.Success, status.Message())
				}
			}
		}
		p.clearNominations(ctx, pods)
		return nil, status
	}
	msg := gang.VictimsAwaited(key, plan, p.victimsLingering)
	waiting := msg != ""
	if !waiting && heldBackInPass(cs, plan.ID) {
		// muster's PreFilter held the members back for the victims, and
		// the last one went since (the core requeues the group on the
		// victim's deletion before muster's handler counts it gone).
		msg, waiting = fmt.Sprintf("%s waited for the pods it preempted; the last one is gone", key.Subject()), true
	}
	if waiting {
		p.wakeAfterCacheLag(key, plan)
		return nominations(pods, plan), fwk.NewStatus(fwk.Unschedulable, msg)
	}
	reason := fmt.Sprintf("%d members could not go to their planned nodes in the PodGroup's cycle", len(pods))
	klog.FromContext(ctx).V(2).Info("Plan refused in a pod-group cycle", "gang", key, "members", len(pods))
	p.drop(ctx, key, plan.ID, gang.DropPlanBroken, reason)
	p.clearNominations(ctx, pods)
	return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("gang %s: %s", key, reason))
}

// clearNominations clears the nominations of pods that nothing keeps
// (gang.KeptNomination), as PostFilter does for a pod alone. The core applies a
// PodGroupPostFilter's nominations only when it succeeds and otherwise
// leaves the old ones in place (schedule_one_podgroup.go in kube-scheduler
// 1.37), so a group that preempted once and then cannot fit would keep
// its nodes' room from every pod of its priority or lower.
func (p *Plugin) clearNominations(ctx context.Context, pods []*v1.Pod) {
	for _, pod := range pods {
		if pod.Status.NominatedNodeName == "" || gang.KeptNomination(&cycle{p: p, ctx: ctx}, pod) != "" {
			continue
		}
		p.handle.DeleteNominatedPodIfExists(pod)
		cleared := pod.Status.DeepCopy()
		cleared.NominatedNodeName = ""
		if err := schedutil.PatchPodStatus(ctx, p.handle.ClientSet(), pod.Name, pod.Namespace, &pod.Status, cleared); err != nil && !apierrors.IsNotFound(err) {
			// The nominator forgot it; the next failed cycle clears the
			// API's record again.
			klog.FromContext(ctx).Error(err, "Could not clear a stale nomination", "pod", klog.KObj(pod), "node", pod.Status.NominatedNodeName)
		}
	}
}

// nominations nominates each member to its slot in plan.
func nominations(pods []*v1.Pod, plan *gang.ActivePlan) *fwk.PodGroupPostFilterResult {
	out := &fwk.PodGroupPostFilterResult{NominatingInfos: map[types.NamespacedName]*fwk.NominatingInfo{}}
	for _, pod := range pods {
		if slot, ok := plan.Slots[pod.UID]; ok {
			out.NominatingInfos[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] =
				&fwk.NominatingInfo{NominatedNodeName: slot, NominatingMode: fwk.ModeOverride}
		}
	}
	return out
}

// groupPass is what muster saw of one pod-group cycle's tentative pass over
// a plan: the members its PreFilter saw, those it steered to their slots
// and those reserved there. The core shares one PodGroupCycleState among
// the pass's members.
type groupPass struct {
	mu     sync.Mutex
	planID int64
	seenU  sets.Set[types.UID]
	// steeredTo are the members steered, in the pass's order.
	steeredTo []passMember
	reservedU sets.Set[types.UID]
	// heldBack: muster's PreFilter held a member back for the plan's
	// victims (or their devices).
	heldBack bool
}

type passMember struct {
	uid  types.UID
	name string
	node string
}

const groupPassKey fwk.StateKey = "muster.dev/pod-group-pass"

// Clone shares the record: the pass's members write to one.
func (g *groupPass) Clone() fwk.StateData { return g }

// passOf returns the pass record of plan planID in the pod-group cycle's
// state, creating it.
func passOf(cs fwk.PodGroupCycleState, planID int64) *groupPass {
	if data, err := cs.Read(groupPassKey); err == nil {
		if g, ok := data.(*groupPass); ok && g.planID == planID {
			return g
		}
	}
	g := &groupPass{planID: planID, seenU: sets.New[types.UID](), reservedU: sets.New[types.UID]()}
	cs.Write(groupPassKey, g)
	return g
}

func (g *groupPass) heldBackForVictims() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.heldBack = true
}

// heldBackInPass reports whether muster's PreFilter held a member of plan
// planID back for its victims in the pod-group cycle of cs.
func heldBackInPass(cs fwk.PodGroupCycleState, planID int64) bool {
	data, err := cs.Read(groupPassKey)
	if err != nil {
		return false
	}
	g, ok := data.(*groupPass)
	if !ok || g.planID != planID {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heldBack
}

func (g *groupPass) saw(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seenU.Insert(uid)
}

func (g *groupPass) steered(pod *v1.Pod, node string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.steeredTo = append(g.steeredTo, passMember{uid: pod.UID, name: pod.Name, node: node})
}

func (g *groupPass) reserved(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reservedU.Insert(uid)
}

// refusedMember is the first member steered in the pass but not reserved
// in it (a Filter refused it at its slot), or nil. Nil-safe.
func (g *groupPass) refusedMember() *passMember {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.steeredTo {
		if !g.reservedU.Has(g.steeredTo[i].uid) {
			return &g.steeredTo[i]
		}
	}
	return nil
}

// unseenMember is the first member of plan, by name, that the group still
// has unscheduled and not held by a scheduling gate, not reserved, and
// never seen by muster's PreFilter in the pass: another plugin's PreFilter
// refused it first (the framework stops at the first refusal). Nil if none.
func (g *groupPass) unseenMember(plan *gang.ActivePlan, unscheduled map[string]*v1.Pod) *passMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := slices.Sorted(maps.Keys(unscheduled))
	for _, name := range names {
		pod := unscheduled[name]
		node, planned := plan.Slots[pod.UID]
		if planned && !plan.Reserved.Has(pod.UID) && !g.seenU.Has(pod.UID) && len(pod.Spec.SchedulingGates) == 0 {
			return &passMember{uid: pod.UID, name: pod.Name, node: node}
		}
	}
	return nil
}

// refusedInPass is the first member of s's plan that the pod-group cycle's
// pass refused, and whether it was refused at its slot. The core counts a
// partly placed group as success and runs no PostFilter for the refused
// member, so Permit must find it: steered but not reserved (a Filter
// refused it at its slot), or planned and never seen by muster's PreFilter
// (another PreFilter refused it first, a volume claim deleted since the
// plan). Nil outside a pass.
//
// The group's unscheduled pods are read from the cycle's snapshot, taken
// when the core began the group's cycle: a member created later (planned
// from muster's informer, but not in the pass) is left to a later cycle
// instead of being taken for one another plugin refused.
func (p *Plugin) refusedInPass(s *cycleState) (*passMember, bool) {
	if s.pass == nil {
		return nil, false
	}
	if m := s.pass.refusedMember(); m != nil {
		return m, true
	}
	snapshot := p.handle.SnapshotSharedLister()
	if snapshot == nil || s.key.Kind != gang.KindWorkloadPodGroup {
		return nil, false
	}
	group, err := snapshot.PodGroupStates().Get(s.key.Namespace, s.key.Name)
	if err != nil {
		return nil, false
	}
	plan := p.gangs.Plan(s.key)
	if plan == nil || plan.ID != s.planID {
		return nil, false // Arrive says what became of the plan
	}
	return s.pass.unseenMember(plan, group.UnscheduledPods()), false
}
