package mustergang

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// newCheck is a filter check of pods' gang on f's snapshot.
func newCheck(t *testing.T, f *testFramework, pods ...*v1.Pod) *filterCheck {
	t.Helper()
	key, _ := gang.KeyOf(pods[0])
	// As a plan does first: index the DRA slices.
	if _, err := f.plugin.dra.snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	check, err := f.plugin.newFilterCheck(context.Background(), key, podInfos(t, pods...), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return check
}

func member(pod *v1.Pod) *gang.Member { return &gang.Member{UID: pod.UID, Name: pod.Name} }

func TestDryRunScreensHostnameAntiAffinity(t *testing.T) {
	// Workers avoid each other and any pod labelled app=j on their node.
	// The framework is shown them without that term; the screen refuses
	// the node where a sibling was placed in the trial, where such a pod
	// runs and where one is nominated, as InterPodAffinity would.
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	other := testobj.MakePod("ns", "stray").UID("stray").Label("app", "j").Node("n2").Obj()
	nominated := testobj.MakePod("ns", "incoming").UID("incoming").Label("app", "j").Priority(10).Obj()
	nominated.Status.NominatedNodeName = "n3"
	nodes := []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8), gpuNode("n4", 8)}
	f := newTestFramework(t, 2, nodes, []*v1.Pod{a, b, other})
	info, err := framework.NewPodInfo(nominated)
	if err != nil {
		t.Fatal(err)
	}
	f.queue.AddNominatedPod(klog.Background(), info, nil)
	check := newCheck(t, f, a, b)

	base := check.memberBase(check.pods[a.UID])
	if n := len(base.hostAntiAffinity); n != 1 {
		t.Fatalf("the screen checks %d terms, want the one hostname term", n)
	}
	if aa := base.pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution; len(aa) != 0 {
		t.Errorf("the framework is shown %d required anti-affinity terms, want 0", len(aa))
	}
	if len(a.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Error("the dry run changed the member itself")
	}

	trial := check.Trial().(*filterTrial)
	if !trial.Fits(member(a), nodes[0]) {
		t.Fatalf("a does not fit on the empty n1: %v", check.Explain())
	}
	trial.Assign(member(a), nodes[0])
	for _, n := range nodes[:3] {
		if trial.Fits(member(b), n) {
			t.Errorf("b fits on %s, where a pod it avoids is placed, runs or is nominated", n.Name)
		}
		if got := check.refusedBy[n.Name]; got != "InterPodAffinity" {
			t.Errorf("%s refused by %q, want InterPodAffinity", n.Name, got)
		}
	}
	if !trial.Fits(member(b), nodes[3]) {
		t.Errorf("b does not fit on n4, which runs nothing it avoids: %v", check.Explain())
	}
	if check.screened != 3 {
		t.Errorf("the screen refused %d pairs, want 3", check.screened)
	}
}

func TestDryRunLeavesOtherTermsAndExistingPodsToTheFramework(t *testing.T) {
	// What the screen does not model stays with InterPodAffinity: a
	// hostname term with a namespace selector, a term on another topology
	// key, and the anti-affinity of pods already running against the
	// member's own labels (read per member: b carries a label a lacks).
	a, b := worker("j", 0, 1, ""), worker("j", 1, 1, "")
	a.Spec.Affinity, b.Spec.Affinity = nil, nil
	b.Labels["team"] = "x"
	guard := testobj.MakePod("ns", "guard").UID("guard").Node("n1").
		Affinity(testobj.OnePerNode(map[string]string{"team": "x"})).Obj()
	nodes := []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}
	f := newTestFramework(t, 2, nodes, []*v1.Pod{a, b, guard})
	check := newCheck(t, f, a, b)
	trial := check.Trial().(*filterTrial)
	if !trial.Fits(member(a), nodes[0]) {
		t.Errorf("a fits nowhere beside the guard, which avoids only team=x: %v", check.Explain())
	}
	if trial.Fits(member(b), nodes[0]) {
		t.Error("b (team=x) fits beside a running pod that avoids team=x")
	}
	if got := check.refusedBy["n1"]; got != "InterPodAffinity" {
		t.Errorf("n1 refused by %q, want InterPodAffinity itself", got)
	}

	kept := []v1.PodAffinityTerm{
		{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "j"}}, TopologyKey: v1.LabelHostname, NamespaceSelector: &metav1.LabelSelector{}},
		{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "j"}}, TopologyKey: v1.LabelTopologyZone},
	}
	c := worker("j", 2, 1, "")
	c.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: kept}}
	run := check.dryRunMember(podInfos(t, c)[0])
	if len(run.hostAntiAffinity) != 0 {
		t.Errorf("the screen took %d terms it does not model", len(run.hostAntiAffinity))
	}
	if run.pod != c {
		t.Error("the framework is not shown the member as it is")
	}
}

func TestDryRunScreensDRAGPUs(t *testing.T) {
	// GPUs from DRA: the framework is shown the members without their
	// claim and without the extended resource a DeviceClass serves, and
	// draFits allocates the devices, so two members never get one device.
	a, claimA := claimWorker(0, "")
	b := worker("j", 1, 1, "")
	b.Spec.Affinity = nil
	nodes := []*v1.Node{draNode("n1", "r1")}
	f := newTestFrameworkWith(t, 2, nodes, []*v1.Pod{a, b}, append(draObjects(gpuSlice("n1", "a100")), claimA)...)
	check := newCheck(t, f, a, b)
	for _, pod := range []*v1.Pod{a, b} {
		run := check.memberBase(check.pods[pod.UID]).dryRunMember
		if len(run.pod.Spec.ResourceClaims) != 0 || len(run.pod.Spec.Containers[0].Resources.Claims) != 0 {
			t.Errorf("%s: the framework is shown its claims", pod.Name)
		}
		if q := run.pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; !q.IsZero() {
			t.Errorf("%s: the framework is shown its DRA-served GPU", pod.Name)
		}
	}
	if q := b.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; q.IsZero() {
		t.Error("the dry run changed the member itself")
	}
	trial := check.Trial().(*filterTrial)
	if !trial.Fits(member(a), nodes[0]) {
		t.Fatalf("a does not fit on n1's one free device: %v", check.Explain())
	}
	trial.Assign(member(a), nodes[0])
	if trial.Fits(member(b), nodes[0]) {
		t.Error("b fits on the device a was given in this trial")
	}
}

func TestDryRunLeavesClaimsItCannotAnswerToDynamicResources(t *testing.T) {
	// A claim not created yet, or one whose allocation is in flight, is
	// DynamicResources' to explain: the framework is shown the member whole.
	a, claimA := claimWorker(0, "")
	b := worker("j", 1, 0, "")
	b.Spec.Affinity = nil
	b.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}}
	f := newTestFrameworkWith(t, 2, []*v1.Node{draNode("n1", "r1")}, []*v1.Pod{a, b}, append(draObjects(gpuSlice("n1", "a100")), claimA)...)
	if f.plugin.dra.screensDevices(b) {
		t.Error("a member whose claim is not created yet is screened")
	}
	if !f.plugin.dra.screensDevices(a) {
		t.Fatal("a member with a free claim of its own is not screened")
	}
	pending := claimA.DeepCopy()
	pending.Status.Allocation = &resourceapi.AllocationResult{}
	if err := f.plugin.dra.manager.ResourceClaims().SignalClaimPendingAllocation(claimA.UID, pending); err != nil {
		t.Fatal(err)
	}
	defer f.plugin.dra.manager.ResourceClaims().MaybeRemoveClaimPendingAllocation(claimA.UID, true)
	if f.plugin.dra.screensDevices(a) {
		t.Error("a member whose claim is being allocated is screened")
	}
}

func TestDryRunOffersAMixedNodeOnlyWhatItsPoolsServe(t *testing.T) {
	// n1 serves nvidia.com/gpu by device plugin (4) and also publishes 4
	// DRA devices. A plain request is served by the device plugin only,
	// as the framework decides: 4 fit, 8 do not, and a second 4 does not
	// fit beside the first. A claim is served by the DRA devices only.
	mixed := testobj.MakeNode("n1").Rack("r1").GPUs(4).Obj()
	small, big, second := worker("j", 0, 4, ""), worker("j", 1, 8, ""), worker("j", 2, 4, "")
	withClaim, claim := claimWorker(3, "")
	claim.Spec.Devices.Requests[0].Exactly.Count = 4
	for _, p := range []*v1.Pod{small, big, second} {
		p.Spec.Affinity = nil
	}
	f := newTestFrameworkWith(t, 4, []*v1.Node{mixed}, []*v1.Pod{small, big, second, withClaim},
		append(draObjects(gpuSlice("n1", "a100", "a100", "a100", "a100")), claim)...)
	check := newCheck(t, f, small, big, second, withClaim)
	trial := check.Trial().(*filterTrial)
	if trial.Fits(member(big), mixed) {
		t.Error("8 plain GPUs fit on a node whose device plugin serves 4")
	}
	if !trial.Fits(member(small), mixed) {
		t.Fatalf("4 plain GPUs do not fit on a node whose device plugin serves 4: %v", check.Explain())
	}
	trial.Assign(member(small), mixed)
	if trial.Fits(member(second), mixed) {
		t.Error("4 more plain GPUs fit beside 4 on a node whose device plugin serves 4 (its DRA devices were offered to them)")
	}
	if !trial.Fits(member(withClaim), mixed) {
		t.Errorf("a claim for 4 devices does not fit on the node's 4 free DRA devices: %v", check.Explain())
	}
}
