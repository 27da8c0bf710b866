package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

func TestRejectedMemberDropsPlanAndNextPlanAvoidsThePair(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, plan := f.planAndWait(t, a)
	slotA := plan.Slots[a.UID]
	if len(f.queue.activated) == 0 {
		t.Error("planning did not wake the sibling")
	}

	// b's planned node is rejected by another plugin in b's own cycle
	// (something changed since the plan): PostFilter drops the plan at once.
	bState, status := f.preFilter(t, b)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of b: %v", status)
	}
	slotB := plan.Slots[b.UID]
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set(slotB, fwk.NewStatus(fwk.Unschedulable, "node(s) had volume node affinity conflict"))
	result, st := f.fw.RunPostFilterPlugins(context.Background(), bState, b, statuses)
	if st.IsSuccess() || result == nil || result.NominatingInfo == nil || result.NominatedNodeName != "" {
		t.Errorf("PostFilter = %+v, %v; want Unschedulable clearing the nomination", result, st)
	}
	if f.plugin.gangs.Plan(key) != nil {
		t.Fatal("the broken plan was not dropped")
	}
	// Unreserve of the waiting member (rejected by the drop) is idempotent.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, slotA)

	// After the backoff, the next plan keeps b off the node it failed on.
	f.clock.Step(time.Minute - time.Second)
	if _, status := f.preFilter(t, a); !status.IsSuccess() {
		t.Fatalf("PreFilter after backoff: %v", status)
	}
	next := f.plugin.gangs.Plan(key)
	if next == nil || next.Slots[b.UID] == slotB {
		t.Errorf("next plan %+v puts %s on %s again", next, b.Name, slotB)
	}
}

// lowGangAndPreemptor are the two 8-GPU members of Job "low" (priority 1)
// filling n1 and n2, and a member of Job "j" (priority 100) that must
// preempt them.
func lowGangAndPreemptor() (low0, low1, high *v1.Pod) {
	low0, low1 = worker("low", 0, 8, "n1"), worker("low", 1, 8, "n2")
	for _, p := range []*v1.Pod{low0, low1} {
		p.Spec.Priority = ptr.To[int32](1)
		p.OwnerReferences[0].Name = "low"
	}
	high = worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	return low0, low1, high
}

func TestPreemptionPlansWithVictimsGoneAndWaitsForThem(t *testing.T) {
	low0, low1, high := lowGangAndPreemptor()
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{low0, low1, high})
	f.keepPodsInAPI()
	key, _ := gang.KeyOf(high)

	state, status := f.preFilter(t, high)
	if status.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter on a full cluster: %v", status)
	}
	result, status := f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	plan := f.plugin.gangs.Plan(key)
	if plan == nil || plan.Victims.Len() != 2 {
		t.Fatalf("plan %+v after PostFilter (%v), want one waiting for the whole low gang (2 pods)", plan, status)
	}
	if result == nil || result.NominatedNodeName != plan.Slots[high.UID] {
		t.Errorf("PostFilter result %+v, want the preemptor nominated to its slot %s", result, plan.Slots[high.UID])
	}
	// The slot is held: a pod scheduled alone may not take it.
	if held := f.plugin.gangs.Held(gang.AnyPriority); len(held) != 1 {
		t.Errorf("held %v, want the preemptor's slot", held)
	}
	// Until the victims are gone, the member waits.
	heldState, status := f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "2 of them still terminating") {
		t.Errorf("PreFilter while victims terminate: %v", status)
	}
	f.plugin.onPodDelete(low0)
	f.plugin.onPodDelete(low1)
	if plan := f.plugin.gangs.Plan(key); plan == nil || plan.Victims.Len() != 0 {
		t.Fatalf("plan %+v after the victims went", plan)
	}
	if !slicesContain(f.queue.activated, "ns/j-0") {
		t.Errorf("the preemptor was not woken when its victims were gone (activated %v)", f.queue.activated)
	}

	// The plugin's informer can see the victims go before the scheduler's
	// cache does. A member that muster's PreFilter held back just before the
	// last victim went, or that meets a victim still in its cycle's
	// snapshot (here: the snapshot still has both), keeps the plan.
	slot := plan.Slots[high.UID]
	heldBack := framework.NewDefaultNodeToStatus()
	heldBack.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "gang ns/j preempted pods to make room and waits for them; 1 of them still terminating").WithPlugin(Name))
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), heldState, high, heldBack); f.plugin.gangs.Plan(key) == nil ||
		result == nil || result.NominatedNodeName != slot {
		t.Errorf("PostFilter after muster's own wait dropped the plan or the nomination (result %+v)", result)
	}
	// The snapshot still shows the victims: every member waits for the
	// cache (a member steered now would be refused there and break the
	// plan), and the PostFilter wakes the gang again after the cache lag.
	cachedState, status := f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "waits for them to leave") {
		t.Fatalf("PreFilter while the snapshot still shows the victims: %v", status)
	}
	f.takeActivated()
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), cachedState, high, framework.NewDefaultNodeToStatus()); f.plugin.gangs.Plan(key) == nil ||
		result == nil || result.NominatedNodeName != slot {
		t.Errorf("PostFilter while the cache lags dropped the plan or the nomination (result %+v)", result)
	}
	if woken := f.takeActivated(); len(woken) != 0 {
		t.Errorf("woken before the cache lag passed: %v", woken)
	}
	f.clock.Step(cacheLag)
	if woken := f.takeActivated(); !slicesContain(woken, "ns/j-0") {
		t.Errorf("not woken after the cache lag (activated %v)", woken)
	}

	// Once the cache has dropped them, the member goes to its slot.
	for _, victim := range []*v1.Pod{low0, low1} {
		ni, err := f.fw.SnapshotSharedLister().NodeInfos().Get(victim.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		if err := ni.RemovePod(klog.Background(), victim); err != nil {
			t.Fatal(err)
		}
	}
	steered, status := f.preFilter(t, high)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter once the victims are gone: %v", status)
	}
	stale := framework.NewDefaultNodeToStatus()
	stale.Set(slot, fwk.NewStatus(fwk.Unschedulable, "Insufficient nvidia.com/gpu").WithPlugin("NodeResourcesFit"))
	if result, _ := f.fw.RunPostFilterPlugins(context.Background(), steered, high, stale); f.plugin.gangs.Plan(key) != nil || result == nil || result.NominatedNodeName != "" {
		t.Errorf("a real refusal at the slot once the victims are gone kept the plan (result %+v)", result)
	}
}

func TestPlannedNodeGoneFromTheSnapshotIsANodeChange(t *testing.T) {
	// b's cycle finds its planned node already gone from the snapshot,
	// before muster's node handler dropped the plan: the plan is dropped
	// as for that node change, without backing the gang off.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	plan := &gang.ActivePlan{
		Plan:     gang.Plan{Slots: map[types.UID]string{a.UID: "n1", b.UID: "gone"}, Nodes: 2},
		Requests: map[types.UID]gang.Resources{},
		Reserved: sets.New[types.UID](), Victims: sets.New[types.UID](), Evicted: sets.New[types.UID](),
		Profile: "muster", Created: f.clock.Now(), Deadline: f.clock.Now().Add(time.Minute),
	}
	_, ok := f.plugin.gangs.Install(key, plan, a.UID, "planned", f.clock.Now(), nil, 0)
	require.True(t, ok)

	state, _ := f.preFilter(t, b)
	_, st := f.fw.RunPostFilterPlugins(context.Background(), state, b, framework.NewDefaultNodeToStatus())
	assert.Contains(t, st.Message(), "planned node gone was deleted")
	assert.Nil(t, f.plugin.gangs.Plan(key))
	assert.Equal(t, gang.PhaseDropped, f.plugin.gangs.Phase(key), "dropped, not backing off")
	assert.False(t, f.clock.Now().Before(f.plugin.gangs.Admit(key, t0, f.clock.Now()).BackoffUntil), "no backoff")
}
