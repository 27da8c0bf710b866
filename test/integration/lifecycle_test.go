package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// The life of a job after its start: workers fail and are replaced, members
// finish, the scheduler restarts mid-bind. Each plan must agree with the
// framework's own filters and with the members that already run.

// oneWorkerPerNode gives the Job's pods the usual MultiWorkerMirroredStrategy
// anti-affinity: at most one worker of the job per node.
func oneWorkerPerNode(job *batchv1.Job) {
	job.Spec.BackoffLimit = ptr.To[int32](3)
	job.Spec.Template.Labels = map[string]string{"app": job.Name}
	job.Spec.Template.Spec.Affinity = testobj.OnePerNode(map[string]string{"app": job.Name})
}

// setPhase ends a pod as the kubelet would report it.
func (c *cluster) setPhase(pod corev1.Pod, phase corev1.PodPhase) {
	c.t.Helper()
	pod.Status.Phase = phase
	if _, err := c.Client.CoreV1().Pods(c.ns).UpdateStatus(c.ctx, &pod, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("setting pod %s %s: %v", pod.Name, phase, err)
	}
}

// live drops pods that finished.
func live(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			out = append(out, p)
		}
	}
	return out
}

// waitLiveBound waits until the job has want live pods, all bound.
func (c *cluster) waitLiveBound(job string, want int) []corev1.Pod {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			for _, p := range c.jobPods(job) {
				c.t.Logf("pod %s: phase %s node %q nominated %q conditions %+v", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.NominatedNodeName, p.Status.Conditions)
			}
		}
	}()
	return c.waitAllBound(fmt.Sprintf("live pods of job %s", job), want, func() []corev1.Pod { return live(c.jobPods(job)) })
}

// failOneAndWaitReplaced fails the job's pod on node and waits until the
// Job controller's replacement and the other workers are all bound.
func (c *cluster) failOneAndWaitReplaced(job string, workers int, node string) []corev1.Pod {
	c.t.Helper()
	var failed *corev1.Pod
	for _, p := range c.jobPods(job) {
		if p.Spec.NodeName == node {
			failed = &p
		}
	}
	if failed == nil {
		c.t.Fatalf("no pod of job %s on node %s", job, node)
	}
	before := len(c.jobPods(job))
	c.setPhase(*failed, corev1.PodFailed)
	c.waitFor("the replacement worker", 30*time.Second, func() (bool, error) {
		return len(c.jobPods(job)) == before+1, nil
	})
	return c.waitLiveBound(job, workers)
}

func TestReplacementWorkerHonoursAntiAffinityWithRunningSibling(t *testing.T) {
	for _, nodes := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			c := startCluster(t, gpuNodes(nodes, 8)...)
			c.addBackground(4, gpuNodes(nodes, 8)...)
			c.createJob(jobSpec{name: "mwms", workers: int32(nodes), gpus: 4, mutate: oneWorkerPerNode})
			pods := c.waitJobBound("mwms", nodes)
			if got := nodesOf(pods); len(got) != nodes {
				t.Fatalf("workers share nodes: %v", got)
			}
			// The worker on node-1 fails; node-1 is the only node without a
			// worker, and the replacement must go there, not next to a
			// running sibling (4 GPUs are free on every node).
			pods = c.failOneAndWaitReplaced("mwms", nodes, "node-1")
			if got := nodesOf(pods); len(got) != nodes || got["node-1"] != 1 {
				t.Errorf("after the replacement, workers on %v; want one on each of %d nodes", got, nodes)
			}
		})
	}
}

// hardSpreadOver gives the Job's pods a hard topology spread (maxSkew 1,
// DoNotSchedule) over the node label key.
func hardSpreadOver(key string) func(*batchv1.Job) {
	return func(job *batchv1.Job) {
		job.Spec.Template.Labels = map[string]string{"app": job.Name}
		job.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: key, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": job.Name}},
		}}
	}
}

func TestHardTopologySpreadIsHonoured(t *testing.T) {
	c := startCluster(t, gpuNodes(2, 8)...)
	c.createJob(jobSpec{name: "spread", workers: 2, gpus: 4, mutate: hardSpreadOver(configv1.LabelHostname)})
	pods := c.waitJobBound("spread", 2)
	if got := nodesOf(pods); len(got) != 2 {
		t.Errorf("spread workers on %v, want one per node", got)
	}
}

// A spread that cannot be met on this cluster leaves the gang unschedulable
// with the framework's own reason, and nothing held.
func TestImpossibleSpreadHoldsNothing(t *testing.T) {
	c := startCluster(t, gpuNodes(1, 8)...)
	c.createJob(jobSpec{name: "spread", workers: 2, gpus: 4, mutate: hardSpreadOver(configv1.LabelZone)})
	c.waitJobUnschedulable("spread", 2, "gang", "filters rejected", "didn't match pod topology spread constraints")
	if held := c.holdingPods(); len(held) != 0 {
		t.Errorf("pods hold capacity: %v", held)
	}
}

// checkpointClaim mounts PersistentVolumeClaim name.
func checkpointClaim(name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ckpt", MountPath: "/ckpt"}}
	}
}

// createBoundClaim creates a PersistentVolume and a claim bound to it, as
// the PV controller would leave them.
func (c *cluster) createBoundClaim(name string) {
	c.t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: c.ns + "-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/ckpt"}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: c.ns, Name: name},
		},
	}
	created, err := c.Client.CoreV1().PersistentVolumes().Create(c.ctx, pv, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	created.Status.Phase = corev1.VolumeBound
	if _, err := c.Client.CoreV1().PersistentVolumes().UpdateStatus(c.ctx, created, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  pv.Name,
		},
	}
	claim, err := c.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(c.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	claim.Status.Phase = corev1.ClaimBound
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(c.ns).UpdateStatus(c.ctx, claim, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// A chief whose checkpoint claim does not exist yet: the gang holds nothing
// (another gang takes the nodes meanwhile), and completes once the claim is
// created and bound.
func TestMissingClaimHoldsNothingAndGangCompletesWhenItArrives(t *testing.T) {
	c := startCluster(t, gpuNodes(2, 8)...)
	c.createPodGroup("ckpt", 2, nil)
	c.createGroupPod("ckpt", "ckpt-chief", 8, checkpointClaim("checkpoints"))
	c.createGroupPod("ckpt", "ckpt-worker", 8)
	c.waitFor("both members unschedulable, the worker naming the missing claim", 60*time.Second, func() (bool, error) {
		pods := c.groupPods("ckpt")
		if len(pods) != 2 {
			return false, nil
		}
		for _, p := range pods {
			want := []string{`persistentvolumeclaim "checkpoints" not found`}
			if p.Name == "ckpt-worker" {
				want = append(want, "gang", "ckpt-chief")
			}
			if !unschedulableWith(&p, want...) {
				return false, nil
			}
		}
		return true, nil
	})
	if held := c.holdingPods(); len(held) != 0 {
		t.Fatalf("pods hold capacity while the claim is missing: %v", held)
	}
	// Meanwhile another gang can use both nodes.
	c.createJob(jobSpec{name: "other", workers: 2, gpus: 8})
	c.waitJobBound("other", 2)
	c.deleteJob("other")

	c.createBoundClaim("checkpoints")
	c.waitFor("the checkpointed gang bound", 60*time.Second, func() (bool, error) {
		return countBound(c.groupPods("ckpt")) == 2, nil
	})
}

// A rack-required gang's replacement joins its rack, although a new rack
// with an exactly fitting node sorts first.
func TestReplacementJoinsTheGangsRack(t *testing.T) {
	// r2 (2 nodes) fits the 2 × 8-GPU gang exactly; r1 has 3 nodes.
	nodes := append(testobj.Cluster(1, 3, 1, 8), gpuNode("r2-n1", 8).Rack("r2").Obj(), gpuNode("r2-n2", 8).Rack("r2").Obj())
	c := startCluster(t, nodes...)
	c.addBackground(4, nodes...)
	c.createJob(jobSpec{name: "racked", workers: 2, gpus: 8, annotations: map[string]string{"muster.dev/topology-required": "rack"},
		mutate: func(job *batchv1.Job) { job.Spec.BackoffLimit = ptr.To[int32](3) }})
	pods := c.waitJobBound("racked", 2)
	if got := racksOf(c, pods); got["r2"] != 2 {
		t.Fatalf("gang in racks %v, want both in r2 (best fit)", got)
	}
	// A new rack whose one node fits a replacement exactly and sorts first.
	c.addNodes(gpuNode("a0-n1", 8).Rack("a0").Obj())
	pods = c.failOneAndWaitReplaced("racked", 2, "r2-n1")
	if got := racksOf(c, pods); got["r2"] != 2 {
		t.Errorf("after the replacement, gang in racks %v; want both in r2", got)
	}
}

// A scheduler that stopped after 2 of 4 members of a rack-required gang were
// bound completes the gang in that rack when it starts again.
func TestRestartedSchedulerCompletesGangInItsRack(t *testing.T) {
	// r1 fits the two remaining members exactly and sorts first; r2 holds
	// the two bound members and has room for the rest.
	nodes := append(testobj.Cluster(1, 2, 1, 8),
		gpuNode("r2-n1", 8).Rack("r2").Obj(), gpuNode("r2-n2", 8).Rack("r2").Obj(),
		gpuNode("r2-n3", 8).Rack("r2").Obj(), gpuNode("r2-n4", 8).Rack("r2").Obj())
	c := startClusterWithoutScheduler(t, nodes...)
	c.addBackground(4, nodes...)
	c.createJob(jobSpec{name: "resume", workers: 4, gpus: 8, annotations: map[string]string{"muster.dev/topology-required": "rack"}})
	c.waitFor("4 pods of job resume", 30*time.Second, func() (bool, error) { return len(c.jobPods("resume")) == 4, nil })
	// What the previous scheduler bound before it stopped.
	for i, p := range c.jobPods("resume")[:2] {
		binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: c.ns},
			Target: corev1.ObjectReference{Kind: "Node", Name: fmt.Sprintf("r2-n%d", i+1)}}
		if err := c.Client.CoreV1().Pods(c.ns).Bind(c.ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.startScheduler()
	pods := c.waitJobBound("resume", 4)
	if got := racksOf(c, pods); got["r2"] != 4 {
		t.Errorf("gang in racks %v, want all 4 in r2", got)
	}
}

// A pending member's nomination left from an earlier scheduler neither
// steers nor blocks its gang's plan.
func TestStaleNominationDoesNotBlockTheGang(t *testing.T) {
	c := startClusterWithoutScheduler(t, gpuNodes(2, 8)...)
	c.createJob(jobSpec{name: "stale", workers: 2, gpus: 8})
	c.waitFor("2 pods of job stale", 30*time.Second, func() (bool, error) { return len(c.jobPods("stale")) == 2, nil })
	// The plan puts worker 0 on node-1 (best fit, then name order); worker
	// 1 still carries a nomination for node-1. Counted as a nominated pod
	// there, it would make worker 0's own cycle reject the plan, forever.
	p := c.jobPods("stale")[1]
	p.Status.NominatedNodeName = "node-1"
	if _, err := c.Client.CoreV1().Pods(c.ns).UpdateStatus(c.ctx, &p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.startScheduler()
	if got := nodesOf(c.waitJobBound("stale", 2)); len(got) != 2 {
		t.Errorf("workers on %v, want one per node", got)
	}
}

// A gang waiting for room is requeued through its lead, the member whose
// cycle planned it and found no room. When the lead is deleted (and no
// replacement comes: a PodGroup's pods are the user's), an event that
// makes room requeues the remaining members themselves, and the gang binds
// at once, not at the five-minute flush of unschedulable pods.
func TestGangBindsWhenRoomComesAfterItsLeadWasDeleted(t *testing.T) {
	nodes := gpuNodes(4, 8)
	c := startClusterWithoutScheduler(t, nodes...)
	c.addBackground(4, nodes...) // priority-0 CPU pods under a budget on every node
	for i := 1; i <= 2; i++ {
		blocker := testobj.MakePod(c.ns, fmt.Sprintf("blocker-%d", i)).PodSpec(testobj.WorkerPodSpec(schedulerName, 8)).Obj()
		blocker.Spec.NodeName = fmt.Sprintf("node-%d", i)
		if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, blocker, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// All four members are queued before the scheduler's first cycle, so
	// the first in muster's queue order (by name) plans the gang: mnist-0
	// is its lead. Three are the quorum: the gang fits without the lead.
	c.createPodGroup("mnist", 3, nil)
	for i := range 4 {
		c.createGroupPod("mnist", fmt.Sprintf("mnist-%d", i), 8)
	}
	c.startScheduler()
	c.waitFor("4 members of mnist unschedulable", 60*time.Second, func() (bool, error) {
		pods := c.groupPods("mnist")
		for _, p := range pods {
			if !unschedulableWith(&p, "gang "+c.ns+"/podgroup/mnist") {
				return false, nil
			}
		}
		return len(pods) == 4, nil
	})
	for _, name := range []string{"mnist-0", "blocker-1"} {
		if err := c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	pods := c.waitAllBound("members of mnist", 3, func() []corev1.Pod { return c.groupPods("mnist") })
	if nodes := nodesOf(pods); len(nodes) != 3 {
		t.Errorf("members share nodes: %v", nodes)
	}
}

// Quorum counts members that finished: the rest are not held for them.
func TestQuorumCountsFinishedMembers(t *testing.T) {
	t.Run("Job: min-available equal to parallelism after a member succeeded", func(t *testing.T) {
		c := startCluster(t, gpuNodes(2, 8)...)
		c.createJob(jobSpec{name: "mwms", workers: 2, gpus: 8, annotations: map[string]string{"muster.dev/min-available": "2"},
			mutate: func(job *batchv1.Job) { job.Spec.BackoffLimit = ptr.To[int32](3) }})
		pods := c.waitJobBound("mwms", 2)
		c.setPhase(pods[0], corev1.PodSucceeded)
		c.waitFor("the Job to count the success", 30*time.Second, func() (bool, error) {
			job, err := c.Client.BatchV1().Jobs(c.ns).Get(c.ctx, "mwms", metav1.GetOptions{})
			return err == nil && job.Status.Succeeded == 1, err
		})
		c.failOneAndWaitReplaced("mwms", 1, pods[1].Spec.NodeName)
	})
	t.Run("Job: an index failed for good under backoffLimitPerIndex", func(t *testing.T) {
		c := startCluster(t, gpuNodes(1, 8)...)
		c.createJob(jobSpec{name: "perindex", workers: 2, gpus: 8, mutate: func(job *batchv1.Job) {
			job.Spec.BackoffLimit = nil
			job.Spec.BackoffLimitPerIndex = ptr.To[int32](0)
		}})
		pods := c.waitJobUnschedulable("perindex", 2, "gang")
		// Index 0 fails for good; index 1 alone is the gang now and fits.
		for _, p := range pods {
			if p.Annotations[batchv1.JobCompletionIndexAnnotation] == "0" {
				c.setPhase(p, corev1.PodFailed)
			}
		}
		c.waitLiveBound("perindex", 1)
	})
	t.Run("PodGroup: a member succeeded and another was replaced", func(t *testing.T) {
		c := startCluster(t, gpuNodes(3, 8)...)
		c.createPodGroup("trio", 3, nil)
		for i := range 3 {
			c.createGroupPod("trio", fmt.Sprintf("trio-%d", i), 8)
		}
		c.waitFor("3 members bound", 60*time.Second, func() (bool, error) { return countBound(c.groupPods("trio")) == 3, nil })
		pods := c.groupPods("trio")
		c.setPhase(pods[0], corev1.PodSucceeded)
		c.setPhase(pods[1], corev1.PodFailed)
		c.createGroupPod("trio", "trio-3", 8)
		c.waitFor("the replacement bound", 60*time.Second, func() (bool, error) {
			for _, p := range c.groupPods("trio") {
				if p.Name == "trio-3" {
					return p.Spec.NodeName != "", nil
				}
			}
			return false, nil
		})
	})
}

// A configuration with a second profile (the default scheduler's plugins
// beside muster's in one process) starts; both profiles schedule their own
// pods. kube-scheduler needs one QueueSort for all profiles, so MusterGang's
// serves both.
func TestSecondProfileStarts(t *testing.T) {
	c := startClusterWithoutScheduler(t, gpuNodes(2, 8)...)
	config := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: muster
  plugins:
    queueSort:
      enabled: [{name: MusterGang}]
      disabled: [{name: "*"}]
    postFilter:
      disabled: [{name: DefaultPreemption}]
    multiPoint:
      enabled: [{name: MusterGang}]
- schedulerName: second-default
  plugins:
    queueSort:
      enabled: [{name: MusterGang}]
      disabled: [{name: "*"}]
`
	ctx, cancel := context.WithCancel(c.ctx)
	done, err := c.StartSchedulerWithConfig(ctx, []byte(config))
	if err != nil {
		cancel()
		t.Fatalf("scheduler with two profiles did not start: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	c.createJob(jobSpec{name: "gang", workers: 2, gpus: 8})
	c.waitJobBound("gang", 2)
	c.deleteJob("gang")
	c.createJob(jobSpec{name: "plain", workers: 1, gpus: 8, scheduler: "second-default"})
	c.waitJobBound("plain", 1)
}
