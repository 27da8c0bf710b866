package mustergang

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

// lowGang is a running gang of Job name at priority 1, one 8-GPU member on
// each of nodes.
func lowGang(name string, nodes ...string) []*v1.Pod {
	var pods []*v1.Pod
	for i, n := range nodes {
		p := worker(name, i, 8, n)
		p.Spec.Priority = ptr.To[int32](1)
		pods = append(pods, p)
	}
	return pods
}

// cpuPods are n lone CPU pods at priority 0 on node, as node agents and
// CPU services run on every node of a real cluster.
func cpuPods(node string, n int) []*v1.Pod {
	var pods []*v1.Pod
	for i := range n {
		name := fmt.Sprintf("agent-%s-%d", node, i)
		pods = append(pods, testobj.MakePod("ns", name).UID(name).Label("app", "agent").Created(t0).Node(node).Priority(0).
			Container(testobj.MakeContainer("a").Request(v1.ResourceCPU, resource.MustParse("100m")).Obj()).Obj())
	}
	return pods
}

// preemptFor runs pod's failed PreFilter and PostFilter and returns the
// plan its gang got (nil: no preemption).
func (f *testFramework) preemptFor(t *testing.T, pod *v1.Pod) *gang.ActivePlan {
	t.Helper()
	state, status := f.preFilter(t, pod)
	if status.IsSuccess() {
		t.Fatalf("PreFilter of %s succeeded; the test wants a full cluster", pod.Name)
	}
	f.fw.RunPostFilterPlugins(context.Background(), state, pod, framework.NewDefaultNodeToStatus())
	key, _ := gang.KeyOf(pod)
	return f.plugin.gangs.Plan(key)
}

func victimNames(plan *gang.ActivePlan, pods []*v1.Pod) sets.Set[string] {
	out := sets.New[string]()
	for _, p := range pods {
		if plan.Evicted.Has(p.UID) {
			out.Insert(p.Name)
		}
	}
	return out
}

// TestPreemptionLooksOnlyAtUnitsThatFreeGPUs: two nodes each run a member
// of a low 2x8 gang and 10 priority-0 CPU pods. The high 2x8 gang evicts the
// low gang whole and no CPU pod. Ordering zero-GPU sets first never reached
// the low gang with 9 or more CPU pods.
func TestPreemptionLooksOnlyAtUnitsThatFreeGPUs(t *testing.T) {
	pods := lowGang("low", "n1", "n2")
	pods = append(pods, cpuPods("n1", 10)...)
	pods = append(pods, cpuPods("n2", 10)...)
	high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	for _, p := range high {
		p.Spec.Priority = ptr.To[int32](100)
	}
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(pods, high...))
	plan := f.preemptFor(t, high[0])
	if plan == nil {
		t.Fatal("no preemption")
	}
	if got, want := victimNames(plan, pods), sets.New("low-0", "low-1"); !got.Equal(want) {
		t.Errorf("victims %v, want %v", sets.List(got), sets.List(want))
	}
}

// TestPreemptionKeepsBudgetsAsASet: a budget allows one disruption over two
// 8-GPU pods; a 3x8 low gang no budget covers runs elsewhere. Evicting both
// budget pods (16 GPUs, two disruptions) breaks the budget: the gang goes.
// The budget names the pods by a selector, or, in a namespace of their own,
// by an empty selector: under policy/v1 that covers every pod of the
// namespace (a nil one covers none).
func TestPreemptionKeepsBudgetsAsASet(t *testing.T) {
	for _, tc := range []struct {
		name, namespace string
		selector        *metav1.LabelSelector
	}{
		{"selector naming the pods", "ns", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		{"empty selector over their namespace", "db", &metav1.LabelSelector{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*v1.Pod
			for i, n := range []string{"n1", "n2"} {
				name := fmt.Sprintf("db-%d", i)
				pods = append(pods, testobj.MakePod(tc.namespace, name).UID(name).Label("app", "db").Created(t0).Node(n).Priority(1).
					Container(testobj.MakeContainer("db").GPUs(8).Obj()).Obj())
			}
			pods = append(pods, lowGang("low", "n3", "n4", "n5")...)
			high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
			for _, p := range high {
				p.Spec.Priority = ptr.To[int32](100)
			}
			pdb := &policyv1.PodDisruptionBudget{
				ObjectMeta: metav1.ObjectMeta{Namespace: tc.namespace, Name: "db"},
				Spec:       policyv1.PodDisruptionBudgetSpec{Selector: tc.selector},
				Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1},
			}
			nodes := []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8), gpuNode("n4", 8), gpuNode("n5", 8)}
			f := newTestFrameworkWith(t, 2, nodes, append(pods, high...), pdb)
			plan := f.preemptFor(t, high[0])
			if plan == nil {
				t.Fatal("no preemption")
			}
			if got, want := victimNames(plan, pods), sets.New("low-0", "low-1", "low-2"); !got.Equal(want) {
				t.Errorf("victims %v, want %v (the budget allows one of db-0, db-1)", sets.List(got), sets.List(want))
			}
		})
	}
}

// TestGangPreemptsWithItsLowestMember: a gang whose members have
// priorities 100 and 5 may not evict a gang of priority 10, whichever
// member's cycle asks.
func TestGangPreemptsWithItsLowestMember(t *testing.T) {
	low := lowGang("low", "n1", "n2")
	for _, p := range low {
		p.Spec.Priority = ptr.To[int32](10)
	}
	high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	high[0].Spec.Priority = ptr.To[int32](100)
	high[1].Spec.Priority = ptr.To[int32](5)
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(low, high...))
	if plan := f.preemptFor(t, high[0]); plan != nil {
		t.Errorf("preempted %v for a gang with a member of priority 5", plan.Evicted)
	}
}

// twoLowGangsOneHigh: two 8-GPU nodes, each running one member of a
// priority-1 gang (low, other) and priority-0 CPU pods (background), as on
// a real cluster; a priority-100 8-GPU worker (high) finds no room.
func twoLowGangsOneHigh(t *testing.T) (f *testFramework, low, background []*v1.Pod, high *v1.Pod) {
	low = append(lowGang("low", "n1"), lowGang("other", "n2")...)
	high = worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	background = append(cpuPods("n1", 5), cpuPods("n2", 5)...)
	f = newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(append(low, background...), high))
	return f, low, background, high
}

// A gang whose plan timed out while the pods it preempted were still
// terminating (a trainer's long grace period, to checkpoint) does not evict
// another gang on its next try: it waits for those pods, as
// DefaultPreemption waits for the victims on its nominated node.
//
// A victim whose node's kubelet was lost meanwhile may never finish, and
// its node takes no new pod: there the gang does not wait, it preempts
// elsewhere.
func TestNoSecondPreemptionWhileVictimsTerminate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		unreachable bool
	}{
		{name: "victim terminating"},
		{name: "its node unreachable since", unreachable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, low, background, high := twoLowGangsOneHigh(t)
			f.keepPodsInAPI()
			plan := f.preemptFor(t, high)
			require.NotNil(t, plan, "no preemption")
			first := victimNames(plan, low)
			require.Equal(t, 1, first.Len(), "victims %v", sets.List(first))
			// The victim takes its grace period: the snapshot shows it terminating.
			for _, p := range low {
				if first.Has(p.Name) {
					p.DeletionTimestamp = &metav1.Time{Time: f.clock.Now()}
					for _, ni := range f.nodes {
						if node := ni.Node(); tc.unreachable && node.Name == p.Spec.NodeName {
							node.Spec.Taints = append(node.Spec.Taints, v1.Taint{Key: v1.TaintNodeUnreachable, Effect: v1.TaintEffectNoSchedule})
						}
					}
				}
			}
			key, _ := gang.KeyOf(high)
			f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()})
			f.clock.Step(time.Minute) // past the backoff and the preemption interval

			second := f.preemptFor(t, high)
			if tc.unreachable {
				require.NotNil(t, second, "no preemption elsewhere while the victim on the lost node terminates")
				assert.Equal(t, sets.New("low-0", "other-0").Difference(first), victimNames(second, low))
				return
			}
			assert.Nil(t, second, "a second preemption while the first one's victim terminates")
			for _, p := range append(low, background...) {
				assert.False(t, f.plugin.gangs.IsVictim(p.UID), "%s chosen again", p.Name)
			}
		})
	}
}

// After a restart the manager has forgotten what a gang preempted. The
// nomination the scheduler wrote for its preemptor still names the node
// where the victim terminates: the gang waits for it, as DefaultPreemption
// does, keeps its nomination, and evicts no other gang. A node whose
// kubelet is lost may never see its victim finish: there the gang
// preempts elsewhere.
func TestNoSecondPreemptionAfterARestartWhileVictimsTerminate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		unreachable bool
		cordoned    bool
	}{
		{name: "victim terminating"},
		{name: "its node unreachable", unreachable: true},
		{name: "its node cordoned", cordoned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			low := append(lowGang("low", "n1"), lowGang("other", "n2")...)
			terminatingByPreemption(low[0], t0)
			high := worker("j", 0, 8, "")
			high.Spec.Priority = ptr.To[int32](100)
			high.Status.NominatedNodeName = "n1"
			background := append(cpuPods("n1", 5), cpuPods("n2", 5)...)
			n1 := gpuNode("n1", 8)
			if tc.unreachable {
				n1.Spec.Taints = append(n1.Spec.Taints, v1.Taint{Key: v1.TaintNodeUnreachable, Effect: v1.TaintEffectNoSchedule})
			}
			n1.Spec.Unschedulable = tc.cordoned
			f := newTestFramework(t, 1, []*v1.Node{n1, gpuNode("n2", 8)}, append(append(low, background...), high))
			f.keepPodsInAPI()

			state, status := f.preFilter(t, high)
			require.False(t, status.IsSuccess(), "PreFilter of %s succeeded; the test wants a full cluster", high.Name)
			result, status := f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
			key, _ := gang.KeyOf(high)
			if tc.unreachable || tc.cordoned {
				plan := f.plugin.gangs.Plan(key)
				require.NotNil(t, plan, "no preemption: %v", status)
				assert.Equal(t, sets.New("other-0"), victimNames(plan, low))
				return
			}
			assert.Contains(t, status.Message(), "waits for 1 pods it preempted to terminate")
			require.NotNil(t, result)
			assert.Equal(t, "n1", result.NominatedNodeName, "the preemptor keeps its nomination")
			assert.Nil(t, f.plugin.gangs.Plan(key), "a second preemption while the first one's victim terminates")
			for _, p := range append(low, background...) {
				assert.False(t, f.plugin.gangs.IsVictim(p.UID), "%s chosen", p.Name)
			}
		})
	}
}

// A preemptor whose plan timed out while its victim terminates keeps its
// nomination through the cycles that refuse it for another reason (its
// backoff), so a restart later still finds where the victim is.
func TestNominationKeptWhileVictimsTerminate(t *testing.T) {
	f, low, _, high := twoLowGangsOneHigh(t)
	f.keepPodsInAPI()
	plan := f.preemptFor(t, high)
	require.NotNil(t, plan, "no preemption")
	slot := plan.Slots[high.UID]
	for _, p := range low {
		if plan.Evicted.Has(p.UID) {
			terminatingByPreemption(p, f.clock.Now())
		}
	}
	high.Status.NominatedNodeName = slot // as the scheduler writes the PostFilter's nomination
	key, _ := gang.KeyOf(high)
	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()})

	state, status := f.preFilter(t, high)
	require.Contains(t, status.Message(), "backs off")
	result, _ := f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	require.NotNil(t, result)
	assert.Equal(t, slot, result.NominatedNodeName)
}

// terminatingByPreemption marks pod as deleted by a scheduler's
// preemption and still terminating.
func terminatingByPreemption(pod *v1.Pod, at time.Time) {
	pod.DeletionTimestamp = &metav1.Time{Time: at}
	pod.Status.Conditions = append(pod.Status.Conditions,
		v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: v1.PodReasonPreemptionByScheduler})
}

// A victim whose deletion failed runs on, not terminating: once its plan
// is gone it holds nothing back, and the gang may preempt again.
func TestFailedEvictionDoesNotBlockTheNextPreemption(t *testing.T) {
	f, _, _, high := twoLowGangsOneHigh(t)
	f.keepPodsInAPI() // every deletion fails
	plan := f.preemptFor(t, high)
	require.NotNil(t, plan, "no preemption")
	key, _ := gang.KeyOf(high)
	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()})
	f.clock.Step(time.Minute)

	assert.NotNil(t, f.preemptFor(t, high), "the gang preempts again")
}

// allocatable is n's allocatable with name set to q.
func allocatable(n *v1.Node, name v1.ResourceName, q string) v1.ResourceList {
	out := n.Status.Allocatable.DeepCopy()
	out[name] = resource.MustParse(q)
	return out
}

// TestNodeChangeDropsAWaitingPlan: a member waits at Permit on a node that
// is then deleted, cordoned, tainted for reclaim or with a taint the member
// does not tolerate: the plan is dropped at once, the waiting member
// rejected (never bound there), every member avoids the node, and the gang
// is not backed off (it plans again at once). A change that breaks nothing
// (a label nobody asks for) keeps the plan.
func TestNodeChangeDropsAWaitingPlan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(*v1.Node)
		deleted bool
		policy  gang.Policy // the members' preemptible policy; "" none
		want    string      // "" keeps the plan
	}{
		{name: "deleted", deleted: true, want: "was deleted"},
		{name: "cordoned", change: func(n *v1.Node) { n.Spec.Unschedulable = true }, want: "was cordoned"},
		{name: "reclaim notice", change: func(n *v1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "cloud.google.com/impending-node-termination", Effect: v1.TaintEffectNoSchedule})
		}, want: "is being reclaimed"},
		{name: "untolerated taint", change: func(n *v1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "maintenance", Effect: v1.TaintEffectNoSchedule})
		}, want: "no longer fits member"},
		{name: "unrelated label", change: func(n *v1.Node) { n.Labels["team"] = "a" }},
		{name: "moved to another rack", change: func(n *v1.Node) { n.Labels[configv1.LabelRack] = "r2" }, want: "left rack r1"},
		{name: "became spot under forbid", policy: gang.PolicyForbid, change: func(n *v1.Node) { n.Labels[configv1.LabelGKESpot] = "true" },
			want: "preemptible policy forbid excludes"},
		{name: "became spot under avoid", policy: gang.PolicyAvoid, change: func(n *v1.Node) { n.Labels[configv1.LabelGKESpot] = "true" }},
		{name: "lost a GPU", change: func(n *v1.Node) { n.Status.Allocatable = allocatable(n, "nvidia.com/gpu", "7") },
			want: "lost allocatable nvidia.com/gpu (7, was 8), which member j-0 asks for"},
		{name: "lost memory nobody asks for", change: func(n *v1.Node) { n.Status.Allocatable = allocatable(n, v1.ResourceMemory, "256Gi") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
			if tc.policy != "" {
				for _, m := range []*v1.Pod{a, b} {
					m.Annotations = map[string]string{gang.AnnotationPreemptible: string(tc.policy)}
				}
			}
			rackNode := func(name string) *v1.Node { return testobj.MakeNode(name).GPUs(8).Rack("r1").Obj() }
			f := newTestFramework(t, 2, []*v1.Node{rackNode("n1"), rackNode("n2"), rackNode("n3")}, []*v1.Pod{a, b})
			key, _ := gang.KeyOf(a)
			_, plan := f.planAndWait(t, a)
			slot := plan.Slots[a.UID]
			node, err := f.plugin.handle.SnapshotSharedLister().NodeInfos().Get(slot)
			if err != nil {
				t.Fatal(err)
			}
			changed := node.Node().DeepCopy()
			if tc.change != nil {
				tc.change(changed)
			}
			if tc.deleted {
				f.plugin.nodeHandler().OnDelete(changed)
			} else {
				f.plugin.nodeHandler().OnUpdate(node.Node(), changed)
			}
			if tc.want == "" {
				if f.plugin.gangs.Plan(key) == nil {
					t.Fatal("a change that breaks nothing dropped the plan")
				}
				return
			}
			if f.plugin.gangs.Plan(key) != nil {
				t.Fatal("the plan survived")
			}
			if st := f.fw.WaitOnPermit(context.Background(), a); st.IsSuccess() || !contains(st.Message(), tc.want) {
				t.Errorf("waiting member ended with %v, want a rejection saying the node %s", st, tc.want)
			}
			avoided := f.plugin.gangs.Avoided(key, f.clock.Now())
			if !avoided[a.UID][slot] || !avoided[b.UID][slot] {
				t.Errorf("avoided %v, want both members off %s", avoided, slot)
			}
			if until := f.plugin.gangs.Admit(key, t0, f.clock.Now()).BackoffUntil; until.After(f.clock.Now()) {
				t.Errorf("the gang backs off until %v; a node change is not its fault", until)
			}
		})
	}
}

// TestReclaimRefusalIsNotAWaitForVictims: muster's Filter refusing the
// planned node because it is being reclaimed drops the plan (and avoids the
// pair); only muster's wait for preempted pods keeps it.
func TestReclaimRefusalIsNotAWaitForVictims(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, status := f.preFilter(t, a)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	slot := f.plugin.gangs.Plan(key).Slots[a.UID]
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set(slot, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node is being reclaimed").WithPlugin(Name))
	f.fw.RunPostFilterPlugins(context.Background(), state, a, statuses)
	if f.plugin.gangs.Plan(key) != nil {
		t.Fatal("the plan stayed on a reclaiming node")
	}
	if !f.plugin.gangs.Avoided(key, f.clock.Now())[a.UID][slot] {
		t.Error("the refused pair is not avoided")
	}
}

// TestLonePodPreemptsBesideItsNode: 200 nodes of 4 CPUs each run four
// priority-0 pods of 900m. A pod alone of priority 10 asking 3 CPUs needs
// three of them gone from one node, as DefaultPreemption would choose; the
// search once ran out of checks reprieving from all 800 and evicted
// nearly every pod of the cluster.
func TestLonePodPreemptsBesideItsNode(t *testing.T) {
	var nodes []*v1.Node
	var pods []*v1.Pod
	for i := range 200 {
		name := fmt.Sprintf("n%03d", i)
		nodes = append(nodes, testobj.MakeNode(name).CPU(resource.MustParse("4")).Obj())
		for j := range 4 {
			pod := fmt.Sprintf("low-%s-%d", name, j)
			pods = append(pods, testobj.MakePod("ns", pod).UID(pod).Created(t0).Node(name).Priority(0).
				Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("900m")).Obj()).Obj())
		}
	}
	high := testobj.MakePod("ns", "high").UID("high").Created(t0).SchedulerName("muster").Priority(10).
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("3")).Obj()).Obj()
	f := newTestFramework(t, 1, nodes, append(pods, high))
	// A pod alone passes PreFilter; every node's Filter refuses it.
	state, _ := f.preFilter(t, high)
	f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	plan := f.plugin.gangs.Plan(gang.LoneKey(high))
	if plan == nil {
		t.Fatal("no preemption")
	}
	victims := victimNames(plan, pods)
	onNodes := sets.New[string]()
	for _, p := range pods {
		if victims.Has(p.Name) {
			onNodes.Insert(p.Spec.NodeName)
		}
	}
	if victims.Len() != 3 || onNodes.Len() != 1 || !onNodes.Has(plan.Slots[high.UID]) {
		t.Errorf("evicted %d pods on nodes %v for a pod planned on %s; want 3 on its node", victims.Len(), sets.List(onNodes), plan.Slots[high.UID])
	}
}

// A pod scheduled alone that preempts is a gang of itself: every outcome
// of its plan is an Event on the pod, its drop as well as its preemption.
func TestLonePreemptorsOutcomesAreEventsOnThePod(t *testing.T) {
	node := testobj.MakeNode("n1").CPU(resource.MustParse("4")).Obj()
	var pods []*v1.Pod
	for j := range 4 {
		name := fmt.Sprintf("low-%d", j)
		pods = append(pods, testobj.MakePod("ns", name).UID(name).Created(t0).Node("n1").Priority(0).
			Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("900m")).Obj()).Obj())
	}
	high := testobj.MakePod("ns", "high").UID("high").Created(t0).SchedulerName("muster").Priority(10).
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("3")).Obj()).Obj()
	f := newTestFramework(t, 1, []*v1.Node{node}, append(pods, high))
	f.keepPodsInAPI()
	state, _ := f.preFilter(t, high)
	f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	plan := f.plugin.gangs.Plan(gang.LoneKey(high))
	require.NotNil(t, plan, "no preemption")
	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: gang.LoneKey(high), PlanID: plan.ID, Due: f.plugin.now()})

	var onPod []string
	for _, e := range f.takeEvents() {
		if strings.Contains(e, "pod ns/high") && strings.Contains(e, "{kind=Pod,apiVersion=v1}") {
			onPod = append(onPod, e)
		}
	}
	require.Len(t, onPod, 2, "Events on the preemptor: %q", onPod)
	assert.True(t, strings.HasPrefix(onPod[0], "Normal GangPreempting Scheduling pod ns/high preempts 3 pods"), onPod[0])
	assert.True(t, strings.HasPrefix(onPod[1], "Warning GangScheduleTimeout Scheduling pod ns/high: timed out"), onPod[1])
}

func TestNoPreemptionOfEqualPriorityOrWhenNever(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*v1.Pod)
	}{
		{"equal priority", func(p *v1.Pod) { p.Spec.Priority = ptr.To[int32](1) }},
		{"preemptionPolicy Never", func(p *v1.Pod) {
			p.Spec.Priority = ptr.To[int32](100)
			p.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			low := worker("low", 0, 8, "n1")
			low.Spec.Priority = ptr.To[int32](1)
			low.OwnerReferences[0].Name = "low"
			pod := worker("j", 0, 8, "")
			tc.mutate(pod)
			f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{low, pod})
			state, _ := f.preFilter(t, pod)
			f.fw.RunPostFilterPlugins(context.Background(), state, pod, framework.NewDefaultNodeToStatus())
			key, _ := gang.KeyOf(pod)
			if f.plugin.gangs.Plan(key) != nil {
				t.Error("preempted")
			}
		})
	}
}

// TestPreemptingGangWithAPSLosesItsNodeMidway: the life of a preemption on
// a real cluster's background. A TFJob-shaped gang (two 8-GPU workers and a
// PS without GPU) preempts a lower-priority 2x8 gang on nodes that also run
// priority-0 CPU pods: only the low gang goes, and the PS is planned beside
// the workers. While the victims are still terminating, a planned node gets
// a reclaim notice: the plan is dropped at once, nothing stays held, its
// victims are no longer protected (a later preemption may choose them), every
// member avoids the node, and the gang is not backed off.
func TestPreemptingGangWithAPSLosesItsNodeMidway(t *testing.T) {
	pods := lowGang("low", "n1", "n2")
	pods = append(pods, cpuPods("n1", 5)...)
	pods = append(pods, cpuPods("n2", 5)...)
	// The workers keep one per node (worker's anti-affinity); the PS, with
	// a label of its own, may run beside either.
	ps := testobj.MakePod("ns", "j-ps").UID("j-ps").Label("app", "j-ps").Created(t0).OwnedByJob("j", jobUID).SchedulerName("muster").
		Container(testobj.MakeContainer("ps").Request(v1.ResourceCPU, resource.MustParse("2")).Obj()).Obj()
	high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, ""), ps}
	for _, p := range high {
		p.Spec.Priority = ptr.To[int32](100)
	}
	f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(pods, high...))
	f.keepPodsInAPI() // the victims stay until the test says they went
	key, _ := gang.KeyOf(high[0])

	state, status := f.preFilter(t, high[0])
	if status.IsSuccess() {
		t.Fatal("PreFilter succeeded; the test wants a full cluster")
	}
	_, postStatus := f.fw.RunPostFilterPlugins(context.Background(), state, high[0], framework.NewDefaultNodeToStatus())
	plan := f.plugin.gangs.Plan(key)
	if plan == nil {
		t.Fatalf("no preemption: PreFilter %v; PostFilter %v", status, postStatus)
	}
	if got, want := victimNames(plan, pods), sets.New("low-0", "low-1"); !got.Equal(want) {
		t.Errorf("victims %v, want %v", sets.List(got), sets.List(want))
	}
	if len(plan.Slots) != 3 {
		t.Fatalf("plan %v, want every member planned, the PS too", plan.Slots)
	}
	if f.plugin.gangs.Phase(key) != gang.PhasePreempting || !f.plugin.gangs.IsVictim(pods[0].UID) {
		t.Fatalf("phase %v, victim protected %v; want a plan waiting for its victims", f.plugin.gangs.Phase(key), f.plugin.gangs.IsVictim(pods[0].UID))
	}

	slot := plan.Slots[high[0].UID]
	node, err := f.plugin.handle.SnapshotSharedLister().NodeInfos().Get(slot)
	if err != nil {
		t.Fatal(err)
	}
	reclaimed := node.Node().DeepCopy()
	reclaimed.Spec.Taints = append(reclaimed.Spec.Taints, v1.Taint{Key: "cloud.google.com/impending-node-termination", Effect: v1.TaintEffectNoSchedule})
	f.plugin.onNodeChange(node.Node(), reclaimed, false)

	if f.plugin.gangs.Plan(key) != nil {
		t.Fatal("the plan survived its node's reclaim notice")
	}
	if held := f.plugin.gangs.Held(gang.AnyPriority); len(held) != 0 {
		t.Errorf("held after the drop: %v", held)
	}
	for _, v := range pods[:2] {
		if f.plugin.gangs.IsVictim(v.UID) {
			t.Errorf("%s is still protected as a victim of a dropped plan", v.Name)
		}
	}
	avoided := f.plugin.gangs.Avoided(key, f.clock.Now())
	for _, m := range high {
		if !avoided[m.UID][slot] {
			t.Errorf("member %s does not avoid the reclaimed %s: %v", m.Name, slot, avoided)
		}
	}
	if until := f.plugin.gangs.Admit(key, t0, f.clock.Now()).BackoffUntil; until.After(f.clock.Now()) {
		t.Errorf("the gang backs off until %v; a reclaim is not its fault", until)
	}
	if phase := f.plugin.gangs.Phase(key); phase != gang.PhaseDropped {
		t.Errorf("phase %v, want Dropped (planned again at once)", phase)
	}
}

func TestPreemptionFreesTheCPUBesideTheGPUs(t *testing.T) {
	// Each node's 8 GPUs run a low gang's member, and priority-0 CPU pods
	// take the rest of its 8 CPUs. The high gang's members need 8 GPUs and
	// 2 CPUs: evicting the low gang frees the GPUs but not enough CPU, so
	// a CPU pod on each node goes too.
	nodes := []*v1.Node{
		testobj.MakeNode("n1").GPUs(8).CPU(resource.MustParse("8")).Obj(),
		testobj.MakeNode("n2").GPUs(8).CPU(resource.MustParse("8")).Obj(),
	}
	pods := lowGang("low", "n1", "n2") // 1 CPU each
	for _, n := range []string{"n1", "n2"} {
		for i := range 7 {
			name := fmt.Sprintf("cpu-%s-%d", n, i)
			pods = append(pods, testobj.MakePod("ns", name).UID(name).Created(t0).Node(n).Priority(0).
				Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj()).Obj())
		}
	}
	high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
	for _, p := range high {
		p.Spec.Priority = ptr.To[int32](100)
		p.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("2")
	}
	f := newTestFramework(t, 2, nodes, append(pods, high...))
	plan := f.preemptFor(t, high[0])
	require.NotNil(t, plan, "no preemption")
	victims := victimNames(plan, pods)
	assert.True(t, victims.HasAll("low-0", "low-1"), "victims %v", sets.List(victims))
	cpuVictims := map[string]int{}
	for name := range victims {
		if name != "low-0" && name != "low-1" {
			cpuVictims[name[len("cpu-"):len("cpu-n1")]]++
		}
	}
	assert.Equal(t, map[string]int{"n1": 1, "n2": 1}, cpuVictims, "one CPU pod per node, victims %v", sets.List(victims))
}

func TestPreemptionBesideTheGPUsEvictsTheFewestCPUPods(t *testing.T) {
	// n1's GPUs run a low gang's member; a 16-CPU pod and seven 3-CPU pods
	// take most of its CPUs. The high worker needs the 8 GPUs and 18 CPUs:
	// the low gang and the 16-CPU pod make room, and the small pods stay.
	// Only sets that free the GPUs are tried: the CPU-only ones cannot be
	// enough, and there are more of them than exact checks.
	node := testobj.MakeNode("n1").GPUs(8).CPU(resource.MustParse("40")).Obj()
	pods := lowGang("low", "n1")
	cpuPod := func(name, cpu string, created time.Time) *v1.Pod {
		return testobj.MakePod("ns", name).UID(name).Created(created).Node("n1").Priority(0).
			Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse(cpu)).Obj()).Obj()
	}
	// The oldest: a greedy reprieve, which keeps the longest-running pods
	// first, would keep it and evict five small ones.
	pods = append(pods, cpuPod("big", "16", t0.Add(-time.Hour)))
	for i := range 7 {
		pods = append(pods, cpuPod(fmt.Sprintf("small-%d", i), "3", t0))
	}
	high := worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	high.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("18")
	f := newTestFramework(t, 1, []*v1.Node{node}, append(pods, high))
	plan := f.preemptFor(t, high)
	require.NotNil(t, plan, "no preemption")
	assert.Equal(t, []string{"big", "low-0"}, sets.List(victimNames(plan, pods)))
}

// A pod the disruption controller already lists among a budget's
// disrupted pods does not take from its allowance again, as
// DefaultPreemption counts it: evicting it breaks no budget, and it is
// chosen over a bigger gang no budget covers.
func TestPreemptionDoesNotCountADisruptedPodTwice(t *testing.T) {
	db := testobj.MakePod("ns", "db-0").UID("db-0").Label("app", "db").Created(t0).Node("n1").Priority(1).
		Container(testobj.MakeContainer("db").GPUs(8).Obj()).Obj()
	pods := append([]*v1.Pod{db}, lowGang("low", "n2", "n3")...)
	high := worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, DisruptedPods: map[string]metav1.Time{"db-0": metav1.NewTime(t0)}},
	}
	f := newTestFrameworkWith(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, append(pods, high), pdb)
	plan := f.preemptFor(t, high)
	require.NotNil(t, plan, "no preemption")
	assert.Equal(t, []string{"db-0"}, sets.List(victimNames(plan, pods)))
}

// A victim that left while the preemption was planned (it finished, or was
// deleted): its deletion's handler ran before the plan named it. The plan
// does not wait for it until its deadline.
func TestVictimGoneWhileThePlanIsMadeIsNotWaitedFor(t *testing.T) {
	low0, low1, high := lowGangAndPreemptor()
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{low0, low1, high})
	ctx := context.Background()
	info, _, err := f.plugin.source.resolve(high)
	require.NoError(t, err)
	gr, r := f.plugin.prepareGang(ctx, high, info, f.planning(t, info.Key))
	require.Nil(t, r)
	found, err := f.plugin.searchVictims(ctx, gr, 100, info.Constraints.Policy)
	require.NoError(t, err)
	require.Len(t, found.Pods, 2, "the whole low gang")

	require.NoError(t, f.plugin.source.pods.Delete(low0)) // low0 leaves the informer
	f.plugin.onPodDelete(low0)                            // before any plan names it

	_, status := f.plugin.installPlan(ctx, high, gr, found.Plan, found.Pods, "preempting")
	require.Nil(t, status)
	plan := f.plugin.gangs.Plan(info.Key)
	require.NotNil(t, plan)
	assert.Equal(t, []types.UID{low1.UID}, plan.Victims.UnsortedList(), "waits for a victim that is gone")
}

// TestSingleDisruptionMemberIsNoVictimWhileItsGangIsPlaced: the members of
// a gang PodGroup with disruptionMode single are victims one by one, but
// not while their gang's plan is in progress: a member reserved and
// waiting at Permit is in the snapshot as if bound, and deleting it would
// break the plan its siblings wait in. Once the gang has no plan, the
// member may be preempted like a pod alone.
func TestSingleDisruptionMemberIsNoVictimWhileItsGangIsPlaced(t *testing.T) {
	for _, tc := range []struct {
		name    string
		planned bool
	}{
		{"its gang is being placed", true},
		{"its gang has no plan", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			member := testobj.MakePod("ns", "member").UID("member").PodGroup("single").SchedulerName("muster").Created(t0).Node("n1").Priority(1).
				Container(testobj.MakeContainer("w").Request(v1.ResourceCPU, resource.MustParse("1")).GPUs(8).Obj()).Obj()
			high := worker("j", 0, 8, "")
			high.Spec.Priority = ptr.To[int32](100)
			f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{member, high})
			f.plugin.source.handle = groupsHandle{Handle: f.plugin.source.handle,
				groups: map[string]*schedulingv1beta1.PodGroup{"ns/single": workloadGroup("single")}}
			unit, whole := f.plugin.source.victimKey(member)
			require.False(t, whole, "disruptionMode single: the member is a unit of its own, not %v", unit)
			if tc.planned {
				key := gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: "ns", Name: "single"}
				plan := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{member.UID: "n1"}}, Reserved: sets.New(member.UID),
					Victims: sets.New[types.UID](), Profile: f.plugin.handle.ProfileName(), Created: f.clock.Now(), Deadline: f.clock.Now().Add(time.Minute)}
				_, ok := f.plugin.gangs.Install(key, plan, member.UID, "planned", t0, nil, 0)
				require.True(t, ok)
			}
			plan := f.preemptFor(t, high)
			if tc.planned {
				assert.Nil(t, plan, "preempted a member waiting in its gang's plan")
				return
			}
			require.NotNil(t, plan, "no preemption")
			assert.Equal(t, sets.New("member"), victimNames(plan, []*v1.Pod{member}))
		})
	}
}

// TestChiefWithoutGPUPreemptsOnItsCPUPool: a TFJob-shaped gang of priority
// 100, an 8-GPU worker and a Chief without GPU. The GPU node is tainted for
// GPU pods only (the worker tolerates it, the Chief does not), so the Chief
// can only run on the CPU node, which a priority-0 pod fills. The GPUs are
// free: no unit that frees GPUs helps, and the search widens to the nodes
// where a member without GPUs may go but does not fit. The CPU pod is
// evicted, nothing on the GPU node.
func TestChiefWithoutGPUPreemptsOnItsCPUPool(t *testing.T) {
	taint := v1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: v1.TaintEffectNoSchedule}
	nodes := []*v1.Node{testobj.MakeNode("n-gpu").GPUs(8).Taint(taint).Obj(), testobj.MakeNode("n-cpu").Obj()}
	hog := testobj.MakePod("ns", "hog").UID("hog").Created(t0).Node("n-cpu").Priority(0).
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("64")).Obj()).Obj()
	chief := testobj.MakePod("ns", "j-chief").UID("j-chief").Label("app", "j-chief").Created(t0).OwnedByJob("j", jobUID).
		SchedulerName("muster").Priority(100).Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj()).Obj()
	w := worker("j", 0, 8, "")
	w.Spec.Priority = ptr.To[int32](100)
	w.Spec.Tolerations = []v1.Toleration{{Key: taint.Key, Operator: v1.TolerationOpExists, Effect: taint.Effect}}
	f := newTestFramework(t, 2, nodes, []*v1.Pod{hog, chief, w})
	plan := f.preemptFor(t, chief)
	require.NotNil(t, plan, "no preemption: the Chief waits for a CPU node forever")
	assert.Equal(t, sets.New("hog"), victimNames(plan, []*v1.Pod{hog}))
	assert.Equal(t, map[types.UID]string{chief.UID: "n-cpu", w.UID: "n-gpu"}, plan.Slots)
}
