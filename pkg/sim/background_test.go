package sim

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

func parsePlan(t *testing.T, text string, seed uint64) *scenario.Plan {
	t.Helper()
	s, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Expand(seed)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustQuantity(t *testing.T, s string) resource.Quantity {
	t.Helper()
	q, err := resource.ParseQuantity(s)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// startHarness builds a run's harness (scheduler started, informers synced)
// without running its steps; the scheduler stops with the test.
func startHarness(t *testing.T, plan *scenario.Plan, scheduler string) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	waits := newPauser()
	t.Cleanup(func() { cancel(); waits.close() })
	h, err := newHarness(ctx, Options{Plan: plan, Scheduler: scheduler, SettleQuiet: time.Millisecond, StepTimeout: time.Minute}, waits)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// runHarness runs every step of plan and returns the harness to inspect.
func runHarness(t *testing.T, plan *scenario.Plan, scheduler string) *harness {
	t.Helper()
	h := startHarness(t, plan, scheduler)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.loop(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

const backgroundCache = `
name: bg-cache
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4}
background:
  pods: {agents: 2, services: 1, serviceReplicas: 2, pdbFraction: 1, cpu: 300m, memory: 1Gi}
  smallNodes: {fraction: 0.5, gpus: 2}
workload: {waves: [{duration: 1m, gangs: [1x1]}]}
`

// Before the first step, the scheduler's cache holds every background pod,
// bound to its node and counted in the node's requests (so every snapshot
// has it); small nodes have their GPUs and CPU and memory in proportion;
// the budgets' status is the disruption controller's.
func TestBackgroundIsInTheSchedulersCache(t *testing.T) {
	plan := parsePlan(t, backgroundCache, 1)
	h := startHarness(t, plan, Default)
	dump := h.driver.sched.Cache.Dump()
	if len(dump.AssumedPods) != 0 {
		t.Errorf("assumed pods %v; background pods are bound, not assumed", dump.AssumedPods)
	}
	onNode := map[string][]string{}
	for _, p := range plan.Background {
		onNode[p.Node] = append(onNode[p.Node], p.Name)
	}
	for _, n := range plan.Nodes {
		info := dump.Nodes[n.Name]
		if info == nil {
			t.Fatalf("node %s not in the cache", n.Name)
		}
		var names []string
		for _, pi := range info.GetPods() {
			pod := pi.GetPod()
			names = append(names, pod.Name)
			if pod.Namespace != backgroundNamespace || pod.Spec.Priority == nil || *pod.Spec.Priority != 0 || pod.Spec.PriorityClassName != "" {
				t.Errorf("pod %s/%s: want a background pod of priority 0 with no PriorityClass", pod.Namespace, pod.Name)
			}
		}
		sort.Strings(names)
		sort.Strings(onNode[n.Name])
		if strings.Join(names, ",") != strings.Join(onNode[n.Name], ",") {
			t.Errorf("node %s holds %v in the cache, want %v", n.Name, names, onNode[n.Name])
		}
		req, alloc := info.Requested, info.Allocatable
		if req.MilliCPU != 3*300 || req.Memory != 3<<30 || req.ScalarResources[configv1.DefaultGPUResourceName] != 0 {
			t.Errorf("node %s requested %dm CPU, %d bytes, %d GPUs; want the three pods' 900m, 3Gi, no GPU", n.Name, req.MilliCPU, req.Memory,
				req.ScalarResources[configv1.DefaultGPUResourceName])
		}
		wantCPU := int64(64000 * n.GPUs / 8)
		if alloc.ScalarResources[configv1.DefaultGPUResourceName] != n.GPUs || alloc.MilliCPU != wantCPU || alloc.Memory != (512<<30)*n.GPUs/8 {
			t.Errorf("node %s (%d GPUs) allocatable %+v; want CPU %dm and memory in proportion", n.Name, n.GPUs, alloc, wantCPU)
		}
	}
	if plan.SmallNodes() != 2 {
		t.Fatalf("%d small nodes, want 2", plan.SmallNodes())
	}
	// 4 service pods in 2 Deployments of 2, both with a budget of
	// maxUnavailable 1: one disruption allowed each.
	pdbs, err := h.driver.b.sched.Profiles[v1.DefaultSchedulerName].SharedInformerFactory().Policy().V1().PodDisruptionBudgets().Lister().List(labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	if len(pdbs) != 2 {
		t.Fatalf("the scheduler's informer lists %d budgets, want 2", len(pdbs))
	}
	for _, pdb := range pdbs {
		if s := pdb.Status; s.DisruptionsAllowed != 1 || s.CurrentHealthy != 2 || s.DesiredHealthy != 1 || s.ExpectedPods != 2 {
			t.Errorf("budget %s status %+v; want 1 disruption allowed of 2 healthy", pdb.Name, s)
		}
	}
}

// The background pods' CPU leaves no room for an 8-GPU worker of priority
// 10: the default profile's preemption must evict one of them. It is
// counted as a non-GPU pod evicted (and in pods evicted, not as a victim
// gang), its budget's status drops to no disruption allowed, and the job
// runs.
const cpuBound = `
name: cpu-bound
cluster: {nodes: 2, gpusPerNode: 8, nodesPerRack: 2}
background:
  pods: {agents: 0, services: 1, serviceReplicas: 2, pdbFraction: 1, cpu: "20", memory: 1Gi}
workload: {waves: [{duration: 1m, priority: 10, gangs: [1x8]}]}
`

func TestEvictedBackgroundIsCounted(t *testing.T) {
	plan := parsePlan(t, cpuBound, 1)
	h := runHarness(t, plan, Default)
	m, d, _, _ := h.rec.Result()
	p := d.Preemption
	if p == nil {
		t.Fatalf("no preemption record; end: %s", h.endReason)
	}
	if p.NonGPUPodsEvicted != 1 || p.PodsEvicted != 1 || p.GPUsEvicted != 0 || p.VictimGangs != 0 || p.CPUMembersWithGang != 0 {
		t.Errorf("preemption %+v; want one non-GPU pod evicted and nothing else", *p)
	}
	if m.GangsCompleted != 1 {
		t.Errorf("%d of 1 jobs completed (%s)", m.GangsCompleted, h.endReason)
	}
	if len(h.cluster.bg.pods) != 1 {
		t.Errorf("%d background pods left in the record, want 1", len(h.cluster.bg.pods))
	}
	obj, err := h.cluster.cs.PolicyV1().PodDisruptionBudgets(backgroundNamespace).Get(context.Background(), plan.PDBs[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := obj.Status; s.CurrentHealthy != 1 || s.DisruptionsAllowed != 0 || s.Conditions[0].Reason != policyv1.InsufficientPodsReason {
		t.Errorf("budget after the eviction: %+v; want 1 healthy, no disruption allowed", s)
	}
}

// A gang's CPU-only member holds no GPU: a gang is whole (running) only
// with it bound, and the GPUs it holds are its workers'.
func TestCPUOnlyMemberHoldsNoGPU(t *testing.T) {
	g := &gangState{job: &scenario.Job{Workers: 2, GPUs: 4, CPUMembers: 1}, bound: map[string]string{"w0": "a", "ps": "b"},
		cpuOnly: map[string]bool{"ps": true}}
	if g.heldGPUs() != 4 || g.podGPUs("ps") != 0 || g.podGPUs("w1") != 4 {
		t.Errorf("held %d GPUs, ps %d, w1 %d; want 4, 0, 4", g.heldGPUs(), g.podGPUs("ps"), g.podGPUs("w1"))
	}
	j := &scenario.Job{Name: "j0-2x4-ps1", Workers: 2, GPUs: 4, CPUMembers: 1}
	job := jobObject(j, "muster", 0)
	if *job.Spec.Parallelism != 3 || *job.Spec.Completions != 3 {
		t.Errorf("job parallelism %d, completions %d; want 3 (the PS is a member)", *job.Spec.Parallelism, *job.Spec.Completions)
	}
	member := v1.ResourceList{v1.ResourceCPU: mustQuantity(t, "4"), v1.ResourceMemory: mustQuantity(t, "16Gi")}
	b := &built{schedulerName: "muster"}
	worker, ps := podObject(j, job, b, 0, 1, 0, member, nil), podObject(j, job, b, 0, 2, 0, member, nil)
	if r := worker.Spec.Containers[0].Resources.Requests; r.Name(configv1.DefaultGPUResourceName, "").Value() != 4 {
		t.Errorf("worker requests %v, want 4 GPUs", r)
	}
	if r := ps.Spec.Containers[0].Resources.Requests; len(r) != 2 || r.Cpu().String() != "4" || r.Memory().String() != "16Gi" {
		t.Errorf("PS requests %v, want 4 CPUs, 16Gi and no GPU", r)
	}
}

// Through spot reclaims on a background: a reclaimed node's background
// pods are deleted with it and come back on its replacement, every budget's
// status matches the pods alive, and gangs with a CPU-only member run to
// completion under muster, never partly bound.
const churnBackground = `
name: churn-bg
tick: 10s
horizon: 6h
cluster: {nodes: 8, gpusPerNode: 8, nodesPerRack: 4, spotFraction: 0.5}
background:
  pods: {serviceReplicas: 2, pdbFraction: 1}
  smallNodes: {fraction: 0.25}
  cpuMembers: {fraction: 0.5}
workload:
  waves:
  - {at: 0s, duration: 10m, gangs: ["2x8", "2x4", "3x2", "1x4"]}
  - {at: 5m, duration: 10m, gangs: ["2x8", "4x2"]}
churn: {start: 1m, end: 20m, meanInterval: 3m, notice: 30s, replaceAfter: 1m}
`

func TestBackgroundThroughReclaims(t *testing.T) {
	plan := parsePlan(t, churnBackground, 1)
	if len(plan.Reclaims) == 0 || plan.CPUMemberJobs() == 0 {
		t.Fatalf("plan has %d reclaims and %d jobs with a CPU member; the test needs both", len(plan.Reclaims), plan.CPUMemberJobs())
	}
	h := runHarness(t, plan, Muster)
	m, d, _, _ := h.rec.Result()
	if m.GangsCompleted != m.GangsTotal || m.PartialGangs != 0 || d.StalledSteps != 0 || d.Preemption != nil {
		t.Errorf("muster: %d of %d done, %d partial, %d stalled, preemption %+v (%s)", m.GangsCompleted, m.GangsTotal, m.PartialGangs,
			d.StalledSteps, d.Preemption, h.endReason)
	}
	if d.PodsBound < plan.TotalPods() {
		t.Errorf("%d pods bound, fewer than the %d members of all jobs", d.PodsBound, plan.TotalPods())
	}
	nodes, err := h.cluster.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replaced := 0
	perNode := map[string]int{}
	for _, n := range nodes.Items {
		perNode[n.Name] = 0
		if strings.Contains(n.Name, "-g") {
			replaced++
		}
	}
	if replaced == 0 {
		t.Fatal("no replacement node at the end")
	}
	pods, err := h.cluster.cs.CoreV1().Pods(backgroundNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byApp := map[string]int{}
	for _, p := range pods.Items {
		if _, ok := perNode[p.Spec.NodeName]; !ok {
			t.Errorf("background pod %s is bound to %q, which does not exist", p.Name, p.Spec.NodeName)
		}
		perNode[p.Spec.NodeName]++
		byApp[p.Labels["app"]]++
		if h.cluster.bg.pods[p.Name] == nil {
			t.Errorf("background pod %s is not in the harness's record", p.Name)
		}
	}
	for node, n := range perNode {
		if n != 3 {
			t.Errorf("node %s has %d background pods, want 3 (nothing preempts here)", node, n)
		}
	}
	if len(pods.Items) != len(h.cluster.bg.pods) {
		t.Errorf("%d background pods in the cluster, %d in the record", len(pods.Items), len(h.cluster.bg.pods))
	}
	pdbs, err := h.cluster.cs.PolicyV1().PodDisruptionBudgets(backgroundNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pdb := range pdbs.Items {
		if int(pdb.Status.CurrentHealthy) != byApp[pdb.Spec.Selector.MatchLabels["app"]] {
			t.Errorf("budget %s counts %d healthy, %d pods alive", pdb.Name, pdb.Status.CurrentHealthy, byApp[pdb.Name])
		}
	}
}

// The background is part of the seed: muster places the priority
// scenario's gangs (two node sizes, CPU-only pods, parameter servers) the
// same way in two runs of a seed.
func TestSameSeedSamePlacementOnBackground(t *testing.T) {
	m1, g1, s1 := placement(run(t, benchPlan(t, "priority.yaml", 2), Muster))
	m2, g2, s2 := placement(run(t, benchPlan(t, "priority.yaml", 2), Muster))
	if !reflect.DeepEqual(m1, m2) || !reflect.DeepEqual(g1, g2) || !reflect.DeepEqual(s1, s2) {
		t.Errorf("two runs of priority seed 2 differ:\n%+v\n%+v", m1, m2)
	}
}
