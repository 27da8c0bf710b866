package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

func TestPlanUsesFrameworkFiltersAroundRunningSibling(t *testing.T) {
	// j-0 runs on n1; its replacement j-2 (for a failed j-1) is pending. The
	// planner's best fit is n1 (4 GPUs free, the least room that fits), but
	// InterPodAffinity rejects a second worker there: the plan says n2.
	running := worker("j", 0, 4, "n1")
	replacement := worker("j", 2, 4, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{running, replacement})

	state, status := f.preFilter(t, replacement)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	key, _ := gang.KeyOf(replacement)
	plan := f.plugin.gangs.Plan(key)
	if plan == nil || plan.Slots[replacement.UID] != "n2" {
		t.Fatalf("plan %+v, want the replacement on n2", plan)
	}
	if plan.CountsOn.Len() != 1 {
		t.Errorf("plan counted %d running members, want 1", plan.CountsOn.Len())
	}
	// Filter keeps it there.
	for _, ni := range f.nodes {
		st := f.fw.RunFilterPlugins(context.Background(), state, replacement, ni)
		if got, want := st.IsSuccess(), ni.Node().Name == "n2"; got != want {
			t.Errorf("Filter on %s: %v", ni.Node().Name, st)
		}
	}
	// Reserve and Permit complete the one-member plan at once.
	if st := f.fw.RunReservePluginsReserve(context.Background(), state, replacement, "n2"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	if _, st := f.fw.RunPermitPlugins(context.Background(), state, replacement, "n2"); !st.IsSuccess() {
		t.Fatalf("Permit: %v", st)
	}
	if f.plugin.gangs.Plan(key) != nil {
		t.Error("the completed plan still holds capacity")
	}
}

func TestNoPlanWhenFiltersRejectEveryNode(t *testing.T) {
	// Both nodes run a worker of the job; the replacement fits by GPUs on
	// either, but anti-affinity rejects both: no plan, nothing held, and the
	// message carries the framework's reason.
	pods := []*v1.Pod{worker("j", 0, 4, "n1"), worker("j", 1, 4, "n2"), worker("j", 3, 4, "")}
	f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, pods)
	_, status := f.preFilter(t, pods[2])
	if status.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter: %v, want UnschedulableAndUnresolvable", status)
	}
	for _, want := range []string{"gang ns/j", "filters rejected", "anti-affinity"} {
		if !contains(status.Message(), want) {
			t.Errorf("message %q does not contain %q", status.Message(), want)
		}
	}
	key, _ := gang.KeyOf(pods[2])
	if f.plugin.gangs.Plan(key) != nil || len(f.plugin.gangs.Held(gang.AnyPriority)) != 0 {
		t.Error("a gang without a plan holds capacity")
	}
}

func TestDryRunSkipsMusterGang(t *testing.T) {
	p := &Plugin{}
	state := framework.NewCycleState()
	state.Write(dryRunKey, dryRunMarker{})
	if _, st := p.PreFilter(context.Background(), state, worker("j", 0, 1, ""), nil); !st.IsSkip() {
		t.Errorf("PreFilter in a dry run = %v, want Skip", st)
	}
}

// TestMembersThatDisagreeArePlannedNever: members of one gang asking for
// different placement (a TFJob's templates each carry annotations) are
// reported GangInvalid and hold nothing, whichever member comes first.
func TestMembersThatDisagreeArePlannedNever(t *testing.T) {
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	b.Annotations = map[string]string{gang.AnnotationPreemptible: "forbid"}
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	for _, first := range []*v1.Pod{a, b} {
		_, status := f.preFilter(t, first)
		assert.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "member %s", first.Name)
		assert.Contains(t, status.Message(), "ask for different placement")
		assert.Nil(t, f.plugin.gangs.Plan(key))
		assert.Empty(t, f.plugin.gangs.Held(gang.AnyPriority))
		outcome, _ := f.plugin.gangs.LastNotice(key)
		assert.Equal(t, gang.OutcomeInvalid, outcome)
	}
}

func TestMemberWithUnparsableAffinityMakesTheGangInvalid(t *testing.T) {
	// j-1's anti-affinity selector cannot be parsed, so the framework can
	// never place it. j-0's cycle plans the gang: it is reported invalid,
	// naming j-1, and holds nothing.
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	b.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector = &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}},
	}
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	_, status := f.preFilter(t, a)
	assert.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code())
	assert.Contains(t, status.Message(), "member j-1")
	assert.Nil(t, f.plugin.gangs.Plan(key))
	assert.Empty(t, f.plugin.gangs.Held(gang.AnyPriority))
	outcome, _ := f.plugin.gangs.LastNotice(key)
	assert.Equal(t, gang.OutcomeInvalid, outcome)
}

func TestMemberRequestIsWhatTheNodeCounts(t *testing.T) {
	// A plan subtracts each member's request from the node's free
	// resources; the framework adds the pod's CalculateResource to the
	// node's requested ones. They must be the same amount, including for a
	// running pod whose resize is still in progress (the larger of spec and
	// status counts), as preemption frees.
	resizing := worker("j", 1, 2, "n1")
	resizing.Status.ContainerStatuses = []v1.ContainerStatus{{
		Name:               "w",
		AllocatedResources: v1.ResourceList{v1.ResourceCPU: resource.MustParse("3")},
		Resources: &v1.ResourceRequirements{Requests: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("3"),
		}},
	}}
	withInit := worker("j", 2, 1, "")
	withInit.Spec.InitContainers = []v1.Container{testobj.MakeContainer("init").Request(v1.ResourceCPU, resource.MustParse("4")).Obj()}
	withInit.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}

	for name, pod := range map[string]*v1.Pod{"worker": worker("j", 0, 8, ""), "resizing": resizing, "init and overhead": withInit} {
		t.Run(name, func(t *testing.T) {
			ni := framework.NewNodeInfo()
			ni.SetNode(gpuNode("n1", 8))
			before := freeOnNode(ni)
			ni.AddPod(pod)
			counted := before
			counted.Sub(freeOnNode(ni))
			assert.Equal(t, counted, (&Plugin{}).requestOf(pod))
		})
	}
}

func TestGangEndedDuringItsCycleIsForgotten(t *testing.T) {
	// Both workers are deleted while a's cycle runs: their deletions forget
	// the gang before the cycle refuses it (no node fits the two). What the
	// cycle records must not outlive the gang, or a new Job of the same
	// name would inherit its backoff.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	for _, pod := range []*v1.Pod{a, b} {
		if err := f.plugin.source.pods.Delete(pod); err != nil {
			t.Fatal(err)
		}
		f.plugin.onPodDelete(pod)
	}
	_, status := f.preFilter(t, a)
	assert.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "PreFilter: %v", status)
	assert.Equal(t, gang.PhasePending, f.plugin.gangs.Phase(key), "the gang ended during its cycle and is forgotten")
}

func TestHigherPriorityGangDisplacesALowerPlan(t *testing.T) {
	// A low-priority gang's plan holds both nodes while its members come
	// to Permit. A high-priority gang is planned over that room, as the
	// framework counts lower-priority nominated pods as free, and the low
	// plan gives way at once, without backoff.
	low := []*v1.Pod{worker("low", 0, 8, ""), worker("low", 1, 8, "")}
	for _, p := range low {
		p.Spec.Priority = ptr.To[int32](1)
	}
	high := worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	// Priority-0 CPU pods run on both nodes, as on a real cluster.
	background := append(cpuPods("n1", 5), cpuPods("n2", 5)...)
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(append(low, high), background...))
	job, err := f.plugin.handle.ClientSet().BatchV1().Jobs("ns").Get(context.Background(), "j", metav1.GetOptions{})
	require.NoError(t, err)
	job = job.DeepCopy()
	job.Name, job.Spec.Parallelism = "low", ptr.To[int32](2)
	require.NoError(t, f.plugin.handle.SharedInformerFactory().Batch().V1().Jobs().Informer().GetIndexer().Add(job))

	_, status := f.preFilter(t, low[0])
	require.True(t, status.IsSuccess(), "PreFilter of low-0: %v", status)
	lowKey, _ := gang.KeyOf(low[0])
	require.NotNil(t, f.plugin.gangs.Plan(lowKey))

	_, status = f.preFilter(t, high)
	require.True(t, status.IsSuccess(), "PreFilter of the high worker: %v", status)
	highKey, _ := gang.KeyOf(high)
	assert.NotNil(t, f.plugin.gangs.Plan(highKey))
	assert.Nil(t, f.plugin.gangs.Plan(lowKey), "the low plan gave way")
	assert.Equal(t, gang.PhaseDropped, f.plugin.gangs.Phase(lowKey), "dropped, not backing off")
}

// TestChangedMemberIsPlannedAgain: a sibling's failed plan is reused only
// while no member changed; members given the toleration their nodes need
// (their generation grows) are planned again at once, not after the failed
// plan's reuse runs out.
func TestChangedMemberIsPlannedAgain(t *testing.T) {
	f, taint, a, b, status := refusedByATaint(t)
	assert.Contains(t, status.Message(), "2 of them no member may use")

	var tolerating []*v1.Pod
	for _, p := range []*v1.Pod{a, b} {
		p = p.DeepCopy()
		p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: taint.Key, Value: taint.Value, Effect: taint.Effect})
		p.Generation++
		require.NoError(t, f.plugin.source.pods.Update(p))
		tolerating = append(tolerating, p)
	}
	_, status = f.preFilter(t, tolerating[1])
	require.True(t, status.IsSuccess(), "PreFilter after the members changed: %v", status)
	key, _ := gang.KeyOf(b)
	assert.Len(t, f.plugin.gangs.Plan(key).Slots, 2)
}

// planWhile makes the plan of pod's gang as gang.Decisions.Place does, and runs
// meanwhile between reading the members (gr) and installing the plan; it
// returns installPlan's status.
func planWhile(t *testing.T, f *testFramework, pod *v1.Pod, meanwhile func(gr *gangRequest)) *fwk.Status {
	t.Helper()
	ctx := context.Background()
	info, _, err := f.plugin.source.resolve(pod)
	require.NoError(t, err)
	gr, r := f.plugin.prepareGang(ctx, pod, info, f.planning(t, info.Key))
	require.Nil(t, r)
	meanwhile(gr)
	views, _ := f.plugin.nodes.views(f.nodes, nil)
	plan, _, err := f.plugin.computePlan(ctx, gr, views, nil, nil)
	require.NoError(t, err)
	_, status := f.plugin.installPlan(ctx, pod, gr, plan, nil, "")
	return status
}

// A member deleted while its sibling's cycle made the plan: the deletion's
// handler ran before the plan existed and found nothing to drop. The plan
// installed with the member's slot is dropped at once instead of holding
// the siblings' GPUs until its deadline.
func TestMemberDeletedWhileThePlanIsMadeDropsThePlan(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	status := planWhile(t, f, a, func(*gangRequest) {
		require.NoError(t, f.plugin.source.pods.Delete(b)) // b leaves the informer
		f.plugin.onPodDelete(b)                            // before any plan exists
	})
	require.NotNil(t, status, "a plan placing a deleted member was kept")
	assert.Contains(t, status.Message(), "member j-1 left while the plan was made")
	assert.Nil(t, f.plugin.gangs.Plan(key))
	assert.Empty(t, f.plugin.gangs.Held(gang.AnyPriority), "capacity held for a member that is gone")
}

// A member allowed by an earlier plan and binding is counted on as bound
// by the plan its sibling makes; its binding fails meanwhile (Rejected
// finds no plan that counts on it yet). The new plan, a slot short of the
// quorum, is dropped at once.
func TestMemberThatFailedToBindWhileThePlanIsMadeDropsThePlan(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	first := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{a.UID: "n1"}}, Reserved: sets.New[types.UID](),
		Victims: sets.New[types.UID](), Created: f.clock.Now(), Deadline: f.clock.Now().Add(time.Minute)}
	_, ok := f.plugin.gangs.Install(key, first, a.UID, "planned", t0, nil, 0)
	require.True(t, ok)
	firstID := f.plugin.gangs.Plan(key).ID
	arrival, _, _ := f.plugin.gangs.Arrive(key, firstID, a.UID, f.clock.Now(), time.Second, nil)
	require.Equal(t, gang.ArrivalComplete, arrival) // a is allowed and binding

	status := planWhile(t, f, b, func(gr *gangRequest) {
		require.Equal(t, []types.UID{a.UID}, gr.set.boundUIDs, "a counts as bound while it binds")
		now := f.clock.Now()
		f.plugin.carryOut(context.Background(), f.plugin.gangs.Rejected(key, firstID, a.UID, a.Name, "n1", now, now.Add(time.Minute), time.Second), nil)
	})
	require.NotNil(t, status, "a plan counting on a member that failed to bind was kept")
	assert.Contains(t, status.Message(), "counted on as bound, failed to bind")
	assert.Nil(t, f.plugin.gangs.Plan(key))
}
