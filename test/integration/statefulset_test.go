package integration

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/internal/testobj"
)

const stsLabel = "muster.test/statefulset"

// createStatefulSet creates a StatefulSet of GPU workers for muster, run by
// the real StatefulSet controller.
func (c *cluster) createStatefulSet(name string, replicas int32, gpus int64, policy appsv1.PodManagementPolicyType) {
	c.t.Helper()
	sts := testobj.MakeStatefulSet(c.ns, name).Replicas(replicas).ServiceName(name).PodManagementPolicy(policy).
		SelectPods(map[string]string{stsLabel: name}).
		PodSpec(testobj.WorkerPodSpec(schedulerName, gpus)).RestartPolicy(corev1.RestartPolicyAlways).Obj()
	if _, err := c.Client.AppsV1().StatefulSets(c.ns).Create(c.ctx, sts, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("creating StatefulSet %s: %v", name, err)
	}
}

func (c *cluster) scaleStatefulSet(name string, replicas int32) {
	c.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := c.Client.AppsV1().StatefulSets(c.ns).Patch(c.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) setPods(name string) []corev1.Pod {
	c.t.Helper()
	return c.podsLabelled(stsLabel, name)
}

// waitSetBound waits until the StatefulSet has want pods, all bound.
func (c *cluster) waitSetBound(name string, want int) []corev1.Pod {
	c.t.Helper()
	return c.waitAllBound(fmt.Sprintf("pods of StatefulSet %s", name), want, func() []corev1.Pod { return c.setPods(name) })
}

// A Parallel StatefulSet is a gang of spec.replicas: three 8-GPU workers on
// two 8-GPU nodes hold nothing (a pod-by-pod scheduler would bind two), and
// bind together once a third node comes.
func TestParallelStatefulSetIsAGang(t *testing.T) {
	c := startCluster(t, gpuNodes(2, 8)...)
	c.createStatefulSet("tf", 3, 8, appsv1.ParallelPodManagement)
	c.waitFor("3 pods of StatefulSet tf, unschedulable as a gang", 60*time.Second, func() (bool, error) {
		pods := c.setPods("tf")
		if len(pods) != 3 {
			return false, nil
		}
		for i := range pods {
			if !unschedulableWith(&pods[i], "gang", "needs 3 members") {
				return false, nil
			}
		}
		return true, nil
	})
	if n := countBound(c.setPods("tf")); n != 0 || len(c.holdingPods()) != 0 {
		t.Fatalf("%d pods bound, holding %v; a gang that cannot fit holds nothing", n, c.holdingPods())
	}
	c.addNodes(gpuNode("node-3", 8).Obj())
	if got := nodesOf(c.waitSetBound("tf", 3)); len(got) != 3 {
		t.Errorf("workers on %v, want one per node", got)
	}
}

// OrderedReady creates one pod at a time and waits for it to be Ready, so
// no gang can form: muster says so on the StatefulSet and the pod, and
// places each pod as it comes (next to its running sibling).
func TestOrderedReadyStatefulSetIsExplainedAndPlacedAlone(t *testing.T) {
	c := startCluster(t, gpuNodes(2, 8)...)
	c.createStatefulSet("ordered", 2, 4, appsv1.OrderedReadyPodManagement)
	first := c.waitSetBound("ordered", 1)[0]
	c.waitForEvent("StatefulSet", "ordered", "GangNotPossible", "podManagementPolicy OrderedReady")
	c.waitForEvent("Pod", first.Name, "GangNotPossible", "Set podManagementPolicy: Parallel")

	// Play the kubelet: the first pod runs and is Ready, so the controller
	// creates the second.
	first.Status.Phase = corev1.PodRunning
	first.Status.Conditions = append(first.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	if _, err := c.Client.CoreV1().Pods(c.ns).UpdateStatus(c.ctx, &first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(c.waitSetBound("ordered", 2)); len(got) != 1 {
		t.Errorf("workers on %v, want both on the first one's node", got)
	}
}

// Scaling a Parallel StatefulSet up grows the gang; the new member goes into
// the domain its running siblings share when it fits there, even where
// bin-packing alone would pick a tighter node elsewhere.
func TestScaledStatefulSetJoinsItsDomain(t *testing.T) {
	c := startClusterWithoutScheduler(t,
		gpuNode("a-1", 8).Rack("rack-a").Obj(),
		gpuNode("a-2", 8).Rack("rack-a").Obj(),
		gpuNode("b-1", 8).Rack("rack-b").Obj(),
	)
	// b-1 has exactly 4 GPUs free: the best fit for one 4-GPU worker.
	filler := testobj.MakePod(c.ns, "filler").PodSpec(testobj.WorkerPodSpec(schedulerName, 4)).Node("b-1").Obj()
	if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, filler, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.startScheduler()
	c.createStatefulSet("grow", 2, 4, appsv1.ParallelPodManagement)
	before := c.waitSetBound("grow", 2)
	rackOf := map[string]string{"a-1": "rack-a", "a-2": "rack-a", "b-1": "rack-b"}
	for _, p := range before {
		if rackOf[p.Spec.NodeName] != "rack-a" {
			t.Fatalf("first members on %v, want rack-a (b-1 has room for one only)", nodesOf(before))
		}
	}
	c.scaleStatefulSet("grow", 3)
	after := c.waitSetBound("grow", 3)
	for _, p := range after {
		if rackOf[p.Spec.NodeName] != "rack-a" {
			t.Errorf("member %s on %s: the gang runs in rack-a and there is room there", p.Name, p.Spec.NodeName)
		}
	}
}
