package integration

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
)

// The tests here run on a real cluster's background, not a clean one:
// priority-0 CPU pods on every node, a PodDisruptionBudget over some of
// them, a PS without GPU, nodes that change while a plan waits.

// Labels of the background pods: node agents (a DaemonSet's pods) and a
// CPU service under a PodDisruptionBudget.
const (
	agentLabel   = "muster.test/agent"
	serviceLabel = "muster.test/cpu-service"
)

// addBackground puts what every real node runs beside the GPU workloads on
// each of nodes: perNode CPU pods at priority 0 (no PriorityClass), bound
// directly as a DaemonSet's or a Deployment's would be, every other one a
// replica of a CPU service that a PodDisruptionBudget covers (allowing one
// disruption, as the disruption controller would report it). They live in
// a namespace of their own, as agents and services do, so what a test
// counts in its namespace is only its workload.
func (c *cluster) addBackground(perNode int, nodes ...*corev1.Node) {
	c.t.Helper()
	if c.backgroundNS == "" {
		c.backgroundNS = c.Namespace(c.t, "background")
	}
	service := 0
	for _, node := range nodes {
		for i := range perNode {
			w := testobj.MakePod(c.backgroundNS, fmt.Sprintf("bg-%s-%d", node.Name, i)).Node(node.Name).PodSpec(corev1.PodSpec{
				SchedulerName: "default-scheduler",
				Containers: []corev1.Container{testobj.MakeContainer("agent").Image(testobj.WorkerImage).
					Request(corev1.ResourceCPU, resource.MustParse("100m")).Request(corev1.ResourceMemory, resource.MustParse("128Mi")).Obj()},
			})
			if i%2 == 0 {
				w.Label(agentLabel, "true")
			} else {
				w.Label(serviceLabel, "true")
				service++
			}
			created, err := c.Client.CoreV1().Pods(c.backgroundNS).Create(c.ctx, w.Obj(), metav1.CreateOptions{})
			if err != nil {
				c.t.Fatal(err)
			}
			if created.Spec.NodeName != node.Name {
				c.t.Fatalf("background pod %s is not bound to %s", created.Name, node.Name)
			}
		}
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.backgroundNS, GenerateName: "cpu-service-"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(int32(max(service-1, 0)))),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{serviceLabel: "true"}},
		},
	}
	c.createBudget(pdb, int32(service), 1)
}

// createBudget creates a PodDisruptionBudget over expected pods with the
// status the disruption controller (not running here) would write.
func (c *cluster) createBudget(pdb *policyv1.PodDisruptionBudget, expected, allowed int32) {
	c.t.Helper()
	budgets := c.Client.PolicyV1().PodDisruptionBudgets(pdb.Namespace)
	created, err := budgets.Create(c.ctx, pdb, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	created.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: created.Generation, ExpectedPods: expected,
		CurrentHealthy: expected, DesiredHealthy: expected - allowed, DisruptionsAllowed: allowed}
	if _, err := budgets.UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// backgroundLeft counts the background pods not deleted (nothing finishes
// a deleted one there: a victim among them would stay terminating).
func (c *cluster) backgroundLeft() int {
	c.t.Helper()
	pods, err := c.Client.CoreV1().Pods(c.backgroundNS).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// A high-priority 2x8 gang evicts a low-priority 2x8 gang whole on two
// nodes that also carry 10 priority-0 CPU pods each; no CPU pod is evicted.
// Before the victim search looked only at units that free GPUs, it tried
// every set of CPU pods first and never reached the gang.
func TestPreemptionBesideCPUPods(t *testing.T) {
	c, k := startPreemptionCluster(t, 10, gpuNodes(2, 8)...)
	c.fillWithGangs("low", map[string]int32{"low": 2})

	c.createJob(jobSpec{name: "high", workers: 2, gpus: 8, mutate: withPriority("high")})
	c.waitJobBound("high", 2)
	if got := c.liveBound("low"); got != 0 {
		t.Errorf("the low gang has %d running pods, want 0 (evicted whole)", got)
	}
	removed := k.removedPods()
	if len(removed) != 2 {
		t.Errorf("removed %v, want exactly the 2 pods of the low gang", removed)
	}
	if got := c.backgroundLeft(); got != 20 {
		t.Errorf("%d of 20 CPU pods left; preemption evicted pods that free no GPU", got)
	}
}

// Two 8-GPU workers and a PS without GPU, rack required, land in the rack
// that has two free 8-GPU nodes; counted in GPU slots, the PS made that
// rack "too small" and the gang waited forever. A failed worker's
// replacement then joins the gang's rack. Some nodes have 4 GPUs, not 8.
func TestGPULessPSInRequiredRack(t *testing.T) {
	var nodes []*corev1.Node
	for _, rack := range []string{"r1", "r2"} {
		for i := 1; i <= 3; i++ {
			nodes = append(nodes, gpuNode(fmt.Sprintf("%s-n%d", rack, i), 8).Rack(rack).Obj())
		}
	}
	// Nodes of a second size: r2 then has as many free GPUs as the workers
	// need (8 + 4 + 4), but only one node that holds a worker, and it is
	// the tighter rack by free GPUs.
	nodes = append(nodes, gpuNode("r2-s1", 4).Rack("r2").Obj(), gpuNode("r2-s2", 4).Rack("r2").Obj(), gpuNode("r1-s1", 4).Rack("r1").Obj())
	c := startCluster(t, nodes...)
	c.addBackground(4, nodes...)
	c.fill("r1-n1", 8) // r1 keeps two free nodes
	c.fill("r2-n1", 8) // r2 only one
	c.fill("r2-n2", 8)
	c.createPodGroup("tf", 3, nil)
	rack := func(p *corev1.Pod) {
		p.Annotations = map[string]string{"muster.dev/topology-required": "rack"}
	}
	c.createGroupPod("tf", "tf-worker-0", 8, rack)
	c.createGroupPod("tf", "tf-worker-1", 8, rack)
	c.createGroupPod("tf", "tf-ps-0", 0, rack)
	pods := c.waitAllBound("members of tf", 3, func() []corev1.Pod { return c.groupPods("tf") })
	if racks := racksOf(c, pods); racks["r1"] != 3 {
		t.Errorf("placed in racks %v, want all 3 in r1", racks)
	}

	// A worker fails and the training operator creates its replacement; a
	// new rack whose one node fits it exactly sorts first. The replacement
	// joins the PS and the other worker in r1.
	c.addNodes(gpuNode("a0-n1", 8).Rack("a0").Obj())
	for _, p := range pods {
		if p.Name == "tf-worker-1" {
			c.setPhase(p, corev1.PodFailed)
		}
	}
	c.createGroupPod("tf", "tf-worker-1-retry", 8, rack)
	pods = c.waitAllBound("live members of tf", 3, func() []corev1.Pod { return live(c.groupPods("tf")) })
	if racks := racksOf(c, pods); racks["r1"] != 3 {
		t.Errorf("after the replacement, members in racks %v, want all 3 in r1", racks)
	}
}

// A budget allows one disruption over two 8-GPU pods; a 3x8 low gang runs
// elsewhere. Evicting both budgeted pods frees fewer GPUs but disrupts two:
// the gang is evicted and the budget kept.
func TestPreemptionKeepsTheBudget(t *testing.T) {
	c, k := startPreemptionCluster(t, 2, gpuNodes(5, 8)...)
	for i, node := range []string{"node-1", "node-2"} {
		pod := testobj.MakePod(c.ns, fmt.Sprintf("db-%d", i)).Label("app", "db").PodSpec(testobj.WorkerPodSpec("none", 8)).Node(node).Obj()
		pod.Spec.PriorityClassName = "low"
		if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.createBudget(&policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, 2, 1)
	c.fillWithGangs("low", map[string]int32{"low": 3})

	c.createJob(jobSpec{name: "high", workers: 2, gpus: 8, mutate: withPriority("high")})
	c.waitJobBound("high", 2)
	if got := c.liveBound("low"); got != 0 {
		t.Errorf("the low gang has %d running pods, want 0 (evicted whole)", got)
	}
	if got := len(c.podsLabelled("app", "db")); got != 2 {
		t.Errorf("%d of the 2 budgeted pods left; the budget allows one disruption", got)
	}
	if removed := k.removedPods(); len(removed) != 3 {
		t.Errorf("removed %v, want the 3 pods of the low gang", removed)
	}
	if got := c.backgroundLeft(); got != 10 {
		t.Errorf("%d of 10 CPU pods left", got)
	}
}

// A member waits at Permit on its planned node while its sibling's cycle is
// held; then the planned nodes start being reclaimed (a taint the members
// tolerate, so only muster's reclaim rule refuses them) or are deleted (a
// spot node gone). The plan is dropped at once, the waiting member released,
// and the gang placed on the other nodes within seconds, never on the
// changed ones.
func TestPlannedNodeChangesWhileMemberWaits(t *testing.T) {
	reclaim := corev1.Taint{Key: "cloud.google.com/impending-node-termination", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name   string
		change func(c *cluster, node string)
		reason string
	}{
		{"reclaim taint", func(c *cluster, node string) {
			n, err := c.Client.CoreV1().Nodes().Get(c.ctx, node, metav1.GetOptions{})
			if err != nil {
				c.t.Fatal(err)
			}
			n.Spec.Taints = append(n.Spec.Taints, reclaim)
			if _, err := c.Client.CoreV1().Nodes().Update(c.ctx, n, metav1.UpdateOptions{}); err != nil {
				c.t.Fatal(err)
			}
		}, "is being reclaimed"},
		{"deleted", func(c *cluster, node string) {
			if err := c.Client.CoreV1().Nodes().Delete(c.ctx, node, metav1.DeleteOptions{}); err != nil {
				c.t.Fatal(err)
			}
		}, "was deleted"},
		// The device plugin found a GPU unhealthy: the kubelet lowers the
		// node's allocatable, and a member bound there would be refused.
		{"lost a GPU", func(c *cluster, node string) {
			n, err := c.Client.CoreV1().Nodes().Get(c.ctx, node, metav1.GetOptions{})
			if err != nil {
				c.t.Fatal(err)
			}
			n.Status.Allocatable["nvidia.com/gpu"] = resource.MustParse("7")
			if _, err := c.Client.CoreV1().Nodes().UpdateStatus(c.ctx, n, metav1.UpdateOptions{}); err != nil {
				c.t.Fatal(err)
			}
		}, "lost allocatable nvidia.com/gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ext := startHoldingExtender(t, 1) // the second member to come is held
			nodes := gpuNodes(4, 8)
			c := startClusterWith(t, ext.Config(), nodes...)
			c.addBackground(4, nodes...)
			c.createPodGroup("pair", 2, ptr.To[int32](600))
			tolerate := func(p *corev1.Pod) {
				p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: reclaim.Key, Operator: corev1.TolerationOpExists})
			}
			c.createGroupPod("pair", "pair-0", 8, held, tolerate)
			c.createGroupPod("pair", "pair-1", 8, held, tolerate)
			defer func() {
				if t.Failed() {
					for _, p := range c.groupPods("pair") {
						t.Logf("pod %s: node %q conditions %+v", p.Name, p.Spec.NodeName, p.Status.Conditions)
					}
				}
			}()
			waiting := c.waitOneAtPermit(ext)
			// Empty equal nodes tie: the plan takes the first two by name.
			planned := []string{"node-1", "node-2"}
			start := time.Now()
			for _, node := range planned {
				tc.change(c, node)
			}
			c.waitForEvent("PodGroup", "pair", "GangRejected", "planned node")
			c.waitFor(waiting+" released", 30*time.Second, func() (bool, error) {
				p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, waiting, metav1.GetOptions{})
				return err == nil && p.Spec.NodeName == "" && unschedulableWith(p, tc.reason), err
			})
			ext.Release()
			pods := c.waitAllBound("members of pair", 2, func() []corev1.Pod { return c.groupPods("pair") })
			t.Logf("re-planned and bound %s after the change", time.Since(start).Round(100*time.Millisecond))
			for _, p := range pods {
				if p.Spec.NodeName == planned[0] || p.Spec.NodeName == planned[1] {
					t.Errorf("pod %s bound to %s, a node that changed under its plan", p.Name, p.Spec.NodeName)
				}
			}
		})
	}
}
