package mustergang

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"

	"github.com/muster-sched/muster/pkg/gang"
)

// dryRunKey marks a CycleState made for a planning dry run: muster's own
// PreFilter returns Skip on it (which also skips its Filter), so the dry run
// asks only the profile's other plugins.
const dryRunKey fwk.StateKey = Name + "/dry-run"

type dryRunMarker struct{}

func (dryRunMarker) Clone() fwk.StateData { return dryRunMarker{} }

// filterCheck confirms the planner's choices with the profile's own
// PreFilter and Filter plugins, as DefaultPreemption's dry run does: each
// member gets a CycleState from RunPreFilterPlugins, the members placed so
// far in a trial are added to it (RunPreFilterExtensionAddPod) and to a copy
// of their node's NodeInfo, and RunFilterPlugins decides. Nominated pods of
// other gangs and lone pods with at least the member's priority count as
// placed, as in RunFilterPluginsWithNominatedPods; the gang's own pending
// members never do (a stale nomination must not block its own plan).
type filterCheck struct {
	ctx    context.Context
	fw     framework.Framework
	key    gang.Key
	pods   map[types.UID]*framework.PodInfo
	avoid  map[types.UID]map[string]bool // pairs that failed in a real cycle
	base   map[types.UID]*memberBase
	nodes  fwk.NodeInfoLister
	checks int
	// screened counts the refusals of dryRunMember's screens.
	screened int
	// victims are pods a preemption dry run treats as gone, by node; their
	// nodes' infos are copies without them.
	victims     map[string][]fwk.PodInfo
	victimNodes map[string]fwk.NodeInfo

	// rejections keeps one reason per member (the first), for the
	// Unschedulable message; rejected, every (member, node) pair the
	// filters refused ("" for every node: its PreFilter failed), once
	// however often it was asked.
	rejections map[string]string
	rejected   map[memberNode]bool
	// refusedNodes are the nodes where a Filter plugin refused a member:
	// what blocks there is not GPUs (the planner screened them), so
	// preemption looks at the pods on them.
	refusedNodes map[string]bool
	// refusedBy names, per node, what refused a member there first: the
	// Filter plugin, PreFilterResult (a PreFilter plugin's node list) or
	// LastCycle (the pair failed in a real cycle); the failed-plan record
	// counts nodes by it.
	refusedBy map[string]string

	// dra is the per-trial view of DRA devices (see draCheck), made when
	// the first member needs devices; nil while none has.
	dra        *draCheck
	draGPUs    *draGPUs
	victimPods []*v1.Pod
	// draOverrides: in a dry run with victims, a refusal by the
	// DynamicResources plugin gives way to the other Filters and the
	// per-trial view, which sees the victims' devices free.
	draOverrides bool
}

type memberNode struct {
	member types.UID
	node   string
}

// memberBase is a member's dry run before any trial: the member as the
// framework is shown it (see dryRunMember) and what its PreFilter plugins
// made of it.
type memberBase struct {
	dryRunMember
	state  fwk.CycleState
	result *fwk.PreFilterResult
	status *fwk.Status
}

// newFilterCheck checks members' placements with the profile's filters,
// with victims gone and the (member, node) pairs of avoid refused.
func (p *Plugin) newFilterCheck(ctx context.Context, key gang.Key, members []*framework.PodInfo, victims []*v1.Pod, avoid map[types.UID]map[string]bool) (*filterCheck, error) {
	fw, ok := p.handle.(framework.Framework)
	if !ok {
		return nil, fmt.Errorf("%s: the framework handle (%T) cannot run PreFilter plugins", Name, p.handle)
	}
	c := &filterCheck{
		ctx: ctx, fw: fw, key: key,
		pods:         make(map[types.UID]*framework.PodInfo, len(members)),
		avoid:        avoid,
		base:         map[types.UID]*memberBase{},
		nodes:        p.handle.SnapshotSharedLister().NodeInfos(),
		rejections:   map[string]string{},
		rejected:     map[memberNode]bool{},
		refusedNodes: map[string]bool{},
		refusedBy:    map[string]string{},
		draGPUs:      p.dra,
		victimPods:   victims,
	}
	c.draOverrides = len(victims) > 0 && p.dra.enabled()
	for _, m := range members {
		c.pods[m.Pod.UID] = m
	}
	if len(victims) > 0 {
		c.victims, c.victimNodes = map[string][]fwk.PodInfo{}, map[string]fwk.NodeInfo{}
		logger := klog.FromContext(ctx)
		for _, v := range victims {
			ni := c.victimNodes[v.Spec.NodeName]
			if ni == nil {
				orig, err := c.nodes.Get(v.Spec.NodeName)
				if err != nil {
					continue // the node is gone: nothing to free there
				}
				ni = orig.Snapshot()
				c.victimNodes[v.Spec.NodeName] = ni
			}
			if err := ni.RemovePod(logger, v); err != nil {
				return nil, err
			}
			info, err := framework.NewPodInfo(v)
			if err != nil {
				return nil, err
			}
			c.victims[v.Spec.NodeName] = append(c.victims[v.Spec.NodeName], info)
		}
	}
	return c, nil
}

// nodeInfo is the snapshot's NodeInfo of node, without the victims.
func (c *filterCheck) nodeInfo(name string) (fwk.NodeInfo, error) {
	if ni := c.victimNodes[name]; ni != nil {
		return ni, nil
	}
	return c.nodes.Get(name)
}

// Trial starts one placement attempt.
func (c *filterCheck) Trial() gang.Trial {
	return &filterTrial{c: c, states: map[types.UID]*memberTrial{}, nodes: map[string]fwk.NodeInfo{}}
}

func (c *filterCheck) memberBase(member *framework.PodInfo) *memberBase {
	pod := member.Pod
	if b := c.base[pod.UID]; b != nil {
		return b
	}
	state := framework.NewCycleState()
	state.Write(dryRunKey, dryRunMarker{})
	run := c.dryRunMember(member)
	result, status, _ := c.fw.RunPreFilterPlugins(c.ctx, state, run.pod)
	b := &memberBase{dryRunMember: run, state: state, result: result, status: status}
	if status.IsSkip() {
		b.status = nil
	}
	// As DefaultPreemption's dry run: the victims leave each member's state.
	for node, infos := range c.victims {
		for _, info := range infos {
			if b.status.IsSuccess() {
				b.status = c.fw.RunPreFilterExtensionRemovePod(c.ctx, state, run.pod, info, c.victimNodes[node])
			}
		}
	}
	c.base[pod.UID] = b
	return b
}

// placedInfo is the member as placed on node, for the trial's NodeInfo
// copies and the other members' states: a shallow copy of its PodInfo
// (affinity terms parsed and requests summed once per plan) with the node
// set. Nothing the framework's filters do writes to an added pod.
func placedInfo(member *framework.PodInfo, node string) *framework.PodInfo {
	placedPod := *member.Pod
	placedPod.Spec.NodeName = node
	info := *member
	info.Pod = &placedPod
	return &info
}

// refuse remembers the first refusal of node, by what.
func (c *filterCheck) refuse(node, by string) {
	if _, seen := c.refusedBy[node]; !seen {
		c.refusedBy[node] = by
	}
}

// refuser is refusedBy as a function; a nil check refused nothing.
func (c *filterCheck) refuser() func(string) string {
	if c == nil {
		return nil
	}
	return func(node string) string { return c.refusedBy[node] }
}

func (c *filterCheck) reject(pod *v1.Pod, node string, why string) {
	c.rejected[memberNode{pod.UID, node}] = true
	if _, seen := c.rejections[pod.Name]; !seen {
		if node != "" {
			why = "on " + node + ": " + why
		}
		c.rejections[pod.Name] = why
	}
}

// Explain summarises what the filters rejected, for the Unschedulable
// message; "" when they rejected nothing.
func (c *filterCheck) Explain() string {
	if len(c.rejected) == 0 {
		return ""
	}
	names := slices.Sorted(maps.Keys(c.rejections))
	var parts []string
	for i, name := range names {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more members", len(names)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s", name, c.rejections[name]))
	}
	return fmt.Sprintf("the scheduler's filters rejected %d placements (%s)", len(c.rejected), strings.Join(parts, "; "))
}

// filterTrial is one placement attempt: its own copies of the node infos
// and member states, so attempts in other domains start clean.
type filterTrial struct {
	c      *filterCheck
	placed []placedPod
	states map[types.UID]*memberTrial
	nodes  map[string]fwk.NodeInfo
	// The trial's DRA devices: taken by placed members, the claims they
	// allocated, and each member's devices from its last draFits.
	draTaken  sets.Set[structured.DeviceID]
	draClaims map[types.UID]*v1.NodeSelector // where each claim's allocation is available
	draChosen map[types.UID]draChoice
}

type placedPod struct {
	info fwk.PodInfo
	node string
}

type memberTrial struct {
	state   fwk.CycleState
	applied int // how many of the trial's placed pods state includes
}

func (t *filterTrial) nodeInfo(name string) (fwk.NodeInfo, error) {
	if ni := t.nodes[name]; ni != nil {
		return ni, nil
	}
	return t.c.nodeInfo(name)
}

// Fits runs the member's filters on node with the trial's placed members.
func (t *filterTrial) Fits(m *gang.Member, node *v1.Node) bool {
	c := t.c
	member := c.pods[m.UID]
	if member == nil {
		return true // not a pod this check knows: nothing to ask
	}
	pod := member.Pod
	c.checks++
	if c.avoid[m.UID][node.Name] {
		c.refuse(node.Name, "LastCycle")
		c.reject(pod, node.Name, "it failed there in its last scheduling cycle")
		return false
	}
	base := c.memberBase(member)
	if !base.status.IsSuccess() {
		c.reject(pod, "", base.status.Message())
		return false
	}
	if base.result != nil && !base.result.AllNodes() && !base.result.NodeNames.Has(node.Name) {
		c.refuse(node.Name, "PreFilterResult")
		c.reject(pod, node.Name, "excluded by a PreFilter plugin")
		return false
	}
	ni, err := t.nodeInfo(node.Name)
	if err != nil {
		c.reject(pod, node.Name, err.Error())
		return false
	}
	mt := t.states[m.UID]
	if mt == nil {
		mt = &memberTrial{state: base.state.Clone()}
		t.states[m.UID] = mt
	}
	for ; mt.applied < len(t.placed); mt.applied++ {
		added := t.placed[mt.applied]
		addedNode, err := t.nodeInfo(added.node)
		if err != nil {
			c.reject(pod, node.Name, err.Error())
			return false
		}
		if st := c.fw.RunPreFilterExtensionAddPod(c.ctx, mt.state, base.pod, added.info, addedNode); !st.IsSuccess() {
			c.reject(pod, node.Name, st.Message())
			return false
		}
	}
	nominated := t.nominated(pod, node.Name)
	status := t.filterWithNominated(base.pod, mt.state, ni, nominated)
	overridden := false
	if !status.IsSuccess() && c.draOverrides && status.Plugin() == dynamicresources.Name {
		// A dry run with victims: DynamicResources cannot see their
		// devices free. Every other Filter decides (DynamicResources
		// skipped), then the per-trial view, which sees them free.
		withoutDRA := mt.state.Clone()
		withoutDRA.SetSkipFilterPlugins(withoutDRA.GetSkipFilterPlugins().Clone().Insert(dynamicresources.Name))
		status, overridden = t.filterWithNominated(base.pod, withoutDRA, ni, nominated), true
	}
	if !status.IsSuccess() {
		c.refusedNodes[node.Name] = true
		c.refuse(node.Name, status.Plugin())
		c.reject(pod, node.Name, status.Message())
		return false
	}
	if why, plugin := base.screen(ni, nominated); why != "" {
		c.screened++
		c.refusedNodes[node.Name] = true
		c.refuse(node.Name, plugin)
		c.reject(pod, node.Name, why)
		return false
	}
	needed, err := t.draFits(member, ni)
	if err != nil {
		c.reject(pod, node.Name, err.Error())
		return false
	}
	if overridden && !needed {
		// DynamicResources refused for a reason the view does not cover.
		c.refusedNodes[node.Name] = true
		c.refuse(node.Name, dynamicresources.Name)
		c.reject(pod, node.Name, "refused by "+dynamicresources.Name)
		return false
	}
	return true
}

// draFits allocates the devices member needs on ni in the trial's DRA view
// and keeps them for Place; needed is false when it needs none there.
func (t *filterTrial) draFits(member *framework.PodInfo, ni fwk.NodeInfo) (needed bool, err error) {
	c := t.c
	if !c.draGPUs.enabled() {
		return false, nil
	}
	pod := member.Pod
	extended := c.draGPUs.extendedClaim(pod, member.CalculateResource().Resource.GetScalarResources(), ni)
	if len(pod.Spec.ResourceClaims) == 0 && extended == nil {
		return false, nil
	}
	if c.dra == nil {
		if c.dra, err = c.draGPUs.newDRACheck(c.ctx, c.victimPods); err != nil {
			return true, err
		}
	}
	claims, err := c.dra.toAllocate(pod, ni.Node(), extended, t.draClaims)
	if err != nil {
		return true, err
	}
	if len(claims) == 0 {
		// A claim allocated for an earlier member in this trial serves
		// this one too: the trial, not DynamicResources, answers for it.
		return c.dra.sharesTrialClaim(pod, t.draClaims), nil
	}
	devices, results, err := c.dra.allocate(c.ctx, ni.Node(), claims, t.draTaken)
	if err != nil {
		return true, err
	}
	if t.draChosen == nil {
		t.draChosen = map[types.UID]draChoice{}
	}
	t.draChosen[pod.UID] = draChoice{node: ni.Node().Name, devices: devices, claims: claims, results: results}
	return true, nil
}

// draChoice is the devices a member was given on a node by draFits.
type draChoice struct {
	node    string
	devices []structured.DeviceID
	claims  []*resourceapi.ResourceClaim
	results []resourceapi.AllocationResult // claims[i]'s is results[i]
}

// nominated are the pods nominated to node that count as placed for pod,
// as in RunFilterPluginsWithNominatedPods: those of equal or higher
// priority, but not the gang's own members.
func (t *filterTrial) nominated(pod *v1.Pod, node string) []fwk.PodInfo {
	c := t.c
	var nominated []fwk.PodInfo
	for _, pi := range c.fw.NominatedPodsForNode(node) {
		other := pi.GetPod()
		if k, ok := gang.KeyOf(other); ok && k == c.key {
			continue
		}
		if other.UID != pod.UID && corev1helpers.PodPriority(other) >= corev1helpers.PodPriority(pod) {
			nominated = append(nominated, pi)
		}
	}
	return nominated
}

// filterWithNominated is RunFilterPluginsWithNominatedPods with nominated
// (see nominated): with them added, and, when there are any, without them.
func (t *filterTrial) filterWithNominated(pod *v1.Pod, state fwk.CycleState, ni fwk.NodeInfo, nominated []fwk.PodInfo) *fwk.Status {
	c := t.c
	if len(nominated) > 0 {
		withState, withNode := state.Clone(), ni.Snapshot()
		for _, pi := range nominated {
			withNode.AddPodInfo(pi)
			if st := c.fw.RunPreFilterExtensionAddPod(c.ctx, withState, pod, pi, withNode); !st.IsSuccess() {
				return st
			}
		}
		if st := c.fw.RunFilterPlugins(c.ctx, withState, pod, withNode); !st.IsSuccess() {
			return st
		}
	}
	return c.fw.RunFilterPlugins(c.ctx, state, pod, ni)
}

// Assign adds the member to the trial: to a copy of its node's NodeInfo and,
// lazily, to every other member's state.
func (t *filterTrial) Assign(m *gang.Member, node *v1.Node) {
	member := t.c.pods[m.UID]
	if member == nil {
		return
	}
	ni, err := t.nodeInfo(node.Name)
	if err != nil {
		return // Fits said no in that case
	}
	if t.nodes[node.Name] == nil {
		ni = ni.Snapshot()
		t.nodes[node.Name] = ni
	}
	info := placedInfo(member, node.Name)
	ni.AddPodInfo(info)
	if chosen, ok := t.draChosen[m.UID]; ok && chosen.node == node.Name {
		if t.draTaken == nil {
			t.draTaken, t.draClaims = sets.New[structured.DeviceID](), map[types.UID]*v1.NodeSelector{}
		}
		t.draTaken.Insert(chosen.devices...)
		for i, claim := range chosen.claims {
			t.draClaims[claim.UID] = chosen.results[i].NodeSelector
		}
	}
	// A member is placed once per trial, so its own state never needs it.
	t.placed = append(t.placed, placedPod{info: info, node: node.Name})
}
