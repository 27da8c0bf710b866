package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
)

// What a plan's dry run screens itself (hostname anti-affinity, DRA GPUs:
// pkg/plugins/mustergang/dryrun.go) must agree with what each member's own
// cycle decides: these tests place gangs where those screens matter, on a
// real cluster's background, and check both the placements and that no
// member's own cycle refused its planned slot.

// plansBroken is muster_gang_rejections_total{cause="plan_broken"} of the
// scheduler running in this process: the plans a member's own cycle refused.
func plansBroken(t *testing.T) float64 {
	return counterOf(t, "muster_gang_rejections_total", "cause", "plan_broken")
}

// counterOf is the counter name{label="value"} of the scheduler running in
// this process (0 until it is first counted).
func counterOf(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// noisyLabel marks CPU pods a job keeps away from.
const noisyLabel = "muster.test/noisy"

// antiAffineTo adds to a Job's pods a required anti-affinity on
// kubernetes.io/hostname to the pods with labels, in every namespace when
// allNamespaces.
func antiAffineTo(job *batchv1.Job, labels map[string]string, allNamespaces bool) {
	term := corev1.PodAffinityTerm{LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname}
	if allNamespaces {
		term.NamespaceSelector = &metav1.LabelSelector{}
	}
	anti := job.Spec.Template.Spec.Affinity.PodAntiAffinity
	anti.RequiredDuringSchedulingIgnoredDuringExecution = append(anti.RequiredDuringSchedulingIgnoredDuringExecution, term)
}

// Three gangs on 8 nodes that carry CPU pods: each gang one worker per
// node; "b" also never beside "a" nor on the node whose running guard pod
// forbids it (an existing pod's anti-affinity); "c" never beside the noisy
// CPU service of another namespace (on node-1..3 only). "a" runs first, then
// "b" and "c" come at once. Every worker lands where its terms allow, and
// no member's own cycle refused its slot. (Two gangs anti-affine to each
// other planned at the same moment can break a plan: a gang's members
// planned but not yet bound are invisible to the other gang's dry run, as
// to the framework's. That break is counted as plan_broken; it is not what
// this test is about.)
func TestAntiAffinityBurstOnABusyCluster(t *testing.T) {
	nodes := gpuNodes(8, 8)
	c := startCluster(t, nodes...)
	c.addBackground(4, nodes...)
	// CPU pods of a noisy service on node-1..3: c keeps away from them.
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		noisy := testobj.MakePod(c.backgroundNS, "noisy-"+n).Node(n).Label(noisyLabel, "true").PodSpec(corev1.PodSpec{
			SchedulerName: "default-scheduler",
			Containers:    []corev1.Container{testobj.MakeContainer("noisy").Image(testobj.WorkerImage).Obj()},
		}).Obj()
		_, err := c.Client.CoreV1().Pods(c.backgroundNS).Create(c.ctx, noisy, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	guard := testobj.MakePod(c.backgroundNS, "guard").Node("node-8").PodSpec(corev1.PodSpec{
		SchedulerName: "default-scheduler",
		Containers:    []corev1.Container{testobj.MakeContainer("guard").Image(testobj.WorkerImage).Obj()},
		Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
			NamespaceSelector: &metav1.LabelSelector{},
			TopologyKey:       corev1.LabelHostname,
		}}}},
	}).Obj()
	_, err := c.Client.CoreV1().Pods(c.backgroundNS).Create(c.ctx, guard, metav1.CreateOptions{})
	require.NoError(t, err)
	broken := plansBroken(t)

	obs := c.observeGangs(map[string]int{"a": 3, "b": 3, "c": 2})
	c.createJob(jobSpec{name: "a", workers: 3, gpus: 2, mutate: oneWorkerPerNode})
	c.waitJobBound("a", 3)
	c.createJob(jobSpec{name: "b", workers: 3, gpus: 2, mutate: func(job *batchv1.Job) {
		oneWorkerPerNode(job)
		antiAffineTo(job, map[string]string{"app": "a"}, false)
	}})
	c.createJob(jobSpec{name: "c", workers: 2, gpus: 2, mutate: func(job *batchv1.Job) {
		oneWorkerPerNode(job)
		antiAffineTo(job, map[string]string{noisyLabel: "true"}, true)
	}})
	a, b, cc := nodesOf(c.waitJobBound("a", 3)), nodesOf(c.waitJobBound("b", 3)), nodesOf(c.waitJobBound("c", 2))
	assert.Len(t, a, 3, "a: one worker per node: %v", a)
	assert.Len(t, b, 3, "b: one worker per node: %v", b)
	assert.Len(t, cc, 2, "c: one worker per node: %v", cc)
	for n := range b {
		assert.NotContains(t, a, n, "b beside a on %s", n)
		assert.NotEqual(t, "node-8", n, "b on the node whose guard pod forbids it")
	}
	for n := range cc {
		assert.NotContains(t, []string{"node-1", "node-2", "node-3"}, n, "c beside the noisy service")
	}
	assert.Zero(t, plansBroken(t)-broken, "plans a member's own cycle refused")
	obs.check(t, 10*time.Second)
}

// A burst of three DRA gangs on 5 nodes of 8 devices (CPU pods on each);
// then a node carrying a worker is lost (node, slice and pods gone, as the
// node lifecycle and pod garbage collectors leave it) and a new node
// arrives: the replacement binds there. After each step every bound
// worker's claim holds exactly its GPUs on its own node, no device is
// allocated twice, no claim is allocated that no live pod holds, and no
// member's own cycle refused its slot.
func TestDRABurstAndNodeLossKeepEveryAllocationExact(t *testing.T) {
	c := startDRACluster(t, draNodes(5), 8)
	require.NoError(t, c.StartGarbageCollector())
	broken := plansBroken(t)
	replaceable := func(job *batchv1.Job) { job.Spec.BackoffLimit = ptr.To[int32](3) }
	gpus := map[string]int{"a": 8, "b": 4, "c": 2}
	workers := map[string]int{"a": 2, "b": 2, "c": 4}
	obs := c.observeGangs(workers)
	for _, name := range []string{"a", "b", "c"} {
		c.createJob(jobSpec{name: name, workers: int32(workers[name]), gpus: int64(gpus[name]), mutate: replaceable})
	}
	exact := func(step string) {
		t.Helper()
		c.eventually(step+": every live worker's claim allocated its GPUs on its node, and only those claims", 30*time.Second, func() error {
			held := map[string]bool{}
			for name, n := range gpus {
				for _, p := range live(c.jobPods(name)) {
					if p.DeletionTimestamp != nil {
						continue
					}
					if err := c.extendedClaimAllocated(&p, n); err != nil {
						return err
					}
					held[p.Namespace+"/"+p.Status.ExtendedResourceClaimStatus.ResourceClaimName] = true
				}
			}
			for _, claim := range c.allocatedClaims() {
				if !held[claim] {
					return fmt.Errorf("claim %s is allocated but no live worker holds it", claim)
				}
			}
			return nil
		})
		c.requireNoDeviceTwice()
	}
	for name, n := range workers {
		c.waitJobBound(name, n)
	}
	exact("after the burst")

	// node of a's first worker is lost.
	var lost string
	for _, p := range c.jobPods("a") {
		lost = p.Spec.NodeName
		break
	}
	require.NotEmpty(t, lost)
	require.NoError(t, c.Client.CoreV1().Nodes().Delete(c.ctx, lost, metav1.DeleteOptions{}))
	published, err := c.Client.ResourceV1().ResourceSlices().List(c.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, s := range published.Items {
		if s.Spec.Pool.Name == lost {
			require.NoError(t, c.Client.ResourceV1().ResourceSlices().Delete(c.ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	for name := range workers {
		for _, p := range c.jobPods(name) {
			if p.Spec.NodeName == lost {
				require.NoError(t, c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
			}
		}
	}
	c.addDRANode("node-6", 8)
	for name, n := range workers {
		running := func() []corev1.Pod {
			var out []corev1.Pod
			for _, p := range live(c.jobPods(name)) {
				if p.DeletionTimestamp == nil {
					out = append(out, p)
				}
			}
			return out
		}
		for _, p := range c.waitAllBound("workers of "+name, n, running) {
			assert.NotEqual(t, lost, p.Spec.NodeName, "worker %s on the lost node", p.Name)
		}
	}
	exact("after the node loss")
	for _, claim := range c.claims() {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			assert.NotEqual(t, lost, r.Pool, "claim %s holds a device of the lost node", claim.Name)
		}
	}
	assert.Zero(t, plansBroken(t)-broken, "plans a member's own cycle refused")
	obs.check(t, 10*time.Second)
}

// A node with 8 device-plugin GPUs and a ResourceSlice of 8 DRA devices
// (mix-1), beside a DRA node (dra-1). A plain nvidia.com/gpu request on
// mix-1 is served by the device plugin only, a claim by its DRA devices
// only: a gang of 2 × 8 plain GPUs gets one worker on mix-1 (no claim) and
// one on dra-1 (its extended resource from dra-1's devices), and then a pod
// claiming 8 devices gets mix-1's. muster never offers mix-1's 16 GPUs to
// one kind: no member's own cycle refused its slot.
func TestDRAMixedNodeServesEachRequestKindFromItsOwnPool(t *testing.T) {
	c := startDRACluster(t, []*corev1.Node{draNode("dra-1")}, 8, gpuNode("mix-1", 8).Rack("r1").Obj())
	c.publishGPUs("mix-1", 8)
	broken := plansBroken(t)

	obs := c.observeGangs(map[string]int{"plain": 2})
	c.createJob(jobSpec{name: "plain", workers: 2, gpus: 8})
	pods := c.waitJobBound("plain", 2)
	require.Equal(t, map[string]int{"mix-1": 1, "dra-1": 1}, nodesOf(pods))
	c.eventually("the worker on dra-1 allocated its devices, the one on mix-1 none", 30*time.Second, func() error {
		for _, p := range c.jobPods("plain") {
			if p.Spec.NodeName == "dra-1" {
				if err := c.extendedClaimAllocated(&p, 8); err != nil {
					return err
				}
			} else if p.Status.ExtendedResourceClaimStatus != nil {
				return fmt.Errorf("pod %s on mix-1 has an extended-resource claim: its device plugin serves it", p.Name)
			}
		}
		return nil
	})

	c.createPodGroup("claims", 1, nil)
	_, err := c.Client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, testobj.GPUClaim(c.ns, "claimer-gpu", 8), metav1.CreateOptions{})
	require.NoError(t, err)
	c.createClaimPod("claims", "claimer", "claimer-gpu")
	list := func() []corev1.Pod { return c.groupPods("claims") }
	claimers := c.waitAllBound("the claiming pod", 1, list)
	assert.Equal(t, "mix-1", claimers[0].Spec.NodeName, "the claim's devices are mix-1's")
	c.eachClaimAllocated("the claim allocated mix-1's 8 devices", list, func(p *corev1.Pod) error { return c.podClaimAllocated(p, 8) })
	c.requireNoDeviceTwice()
	assert.Len(t, c.allocatedClaims(), 2, "claims allocated: dra-1's worker's and the claiming pod's")
	assert.Zero(t, plansBroken(t)-broken, "plans a member's own cycle refused")
	obs.check(t, 10*time.Second)
}
