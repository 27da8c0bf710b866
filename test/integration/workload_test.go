package integration

// Kubernetes' own gang API (scheduling.k8s.io/v1beta1 PodGroup, the
// GenericWorkload gate) with muster: the core runs its pod-group cycle, and
// muster's profile (GangScheduling, TopologyPlacementGenerator and
// PodGroupPodsCount disabled) decides the plan.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

// startWorkloadCluster is startCluster with the workload API on: the gates
// GenericWorkload, WorkloadWithJob and TopologyAwareWorkloadScheduling for
// the API server, the Job controller and the scheduler of this test (the
// process's gates are restored when it ends), and scheduling.k8s.io/v1beta1
// served. The nodes carry a real cluster's background.
func startWorkloadCluster(t *testing.T, nodes ...*corev1.Node) *cluster {
	t.Helper()
	featuregatetesting.SetFeatureGatesDuringTest(t, utilfeature.DefaultFeatureGate, featuregatetesting.FeatureOverrides{
		features.GenericWorkload:                 true,
		features.WorkloadWithJob:                 true,
		features.TopologyAwareWorkloadScheduling: true,
	})
	c := startClusterWithFlags(t, []string{"--runtime-config=scheduling.k8s.io/v1beta1=true"}, nodes...)
	c.addBackground(4, nodes...)
	c.startScheduler()
	return c
}

// createPodGroup creates a gang PodGroup of minCount; mutate adjusts it.
func (c *cluster) createWorkloadGroup(name string, minCount int32, mutate ...func(*schedulingv1beta1.PodGroup)) {
	c.t.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount},
		}},
	}
	for _, m := range mutate {
		m(pg)
	}
	_, err := c.Client.SchedulingV1beta1().PodGroups(c.ns).Create(c.ctx, pg, metav1.CreateOptions{})
	require.NoError(c.t, err, "creating PodGroup %s", name)
}

// inGroup makes a Job's pods members of the PodGroup group.
func inGroup(group string) func(*batchv1.Job) {
	return func(job *batchv1.Job) {
		job.Spec.Template.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}
	}
}

// requireHoldsNothing checks that none of the namespace's pods is bound or
// nominated.
func (c *cluster) requireHoldsNothing(what string) {
	c.t.Helper()
	require.Empty(c.t, c.holdingPods(), "%s: pods bound or nominated", what)
}

// requireGroupScheduled checks the PodGroupInitiallyScheduled condition the
// core writes when the group's cycle succeeded.
func (c *cluster) requireGroupScheduled(name string) {
	c.t.Helper()
	c.waitFor("PodGroup "+name+" InitiallyScheduled", 30*time.Second, func() (bool, error) {
		pg, err := c.Client.SchedulingV1beta1().PodGroups(c.ns).Get(c.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return apimeta.IsStatusConditionTrue(pg.Status.Conditions, schedulingv1beta1.PodGroupInitiallyScheduled), nil
	})
}

func TestWorkloadGroupWholeOrNothing(t *testing.T) {
	nodes := gpuNodes(4, 8)
	c := startWorkloadCluster(t, nodes[:3]...)
	c.createWorkloadGroup("train", 4)
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: inGroup("train")})

	gangKey := c.ns + "/podgroup.scheduling.k8s.io/train"
	c.waitJobUnschedulable("train", 4, gangKey)
	c.requireHoldsNothing("4 x 8 GPUs on 3 nodes")

	c.addNodes(nodes[3])
	c.addBackground(4, nodes[3])
	pods := c.waitJobBound("train", 4)
	require.Len(t, nodesOf(pods), 4, "one 8-GPU member per node: %v", nodesOf(pods))
	c.requireGroupScheduled("train")
}

func TestWorkloadGroupInOneRack(t *testing.T) {
	var nodes []*corev1.Node
	for i, rack := range []string{"r1", "r1", "r1", "r2", "r2", "r2", "r2"} {
		nodes = append(nodes, testobj.MakeNode(fmt.Sprintf("%s-n%d", rack, i)).GPUs(8).Rack(rack).Zone("z1").Ready().Obj())
	}
	// Six nodes, three per rack: room for the gang only across racks.
	c := startWorkloadCluster(t, nodes[:6]...)
	c.createWorkloadGroup("train", 4, func(pg *schedulingv1beta1.PodGroup) {
		pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
			Topology: []schedulingv1beta1.TopologyConstraint{{Key: configv1.LabelRack}},
		}
	})
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: inGroup("train")})
	c.waitJobUnschedulable("train", 4, "rack")
	c.requireHoldsNothing("no rack holds 4 x 8 GPUs")

	c.addNodes(nodes[6])
	c.addBackground(4, nodes[6])
	pods := c.waitJobBound("train", 4)
	require.Equal(t, map[string]int{"r2": 4}, racksOf(c, pods))
}

// A Job with spec.scheduling: the Job controller creates the Workload and
// the PodGroup and puts its pods in the group; muster places them whole.
func TestWorkloadJobScheduling(t *testing.T) {
	nodes := gpuNodes(4, 8)
	c := startWorkloadCluster(t, nodes[:3]...)
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: func(job *batchv1.Job) {
		job.Spec.Scheduling = &batchv1.JobSchedulingConfiguration{
			SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{
				Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{MinCount: ptr.To[int32](4)},
			},
		}
	}})
	pods := c.waitJobUnschedulable("train", 4, "podgroup.scheduling.k8s.io")
	for _, p := range pods {
		require.NotNil(t, p.Spec.SchedulingGroup, "pod %s joins the Job's PodGroup", p.Name)
	}
	c.requireHoldsNothing("4 x 8 GPUs on 3 nodes")

	c.addNodes(nodes[3])
	c.addBackground(4, nodes[3])
	pods = c.waitJobBound("train", 4)
	require.Len(t, nodesOf(pods), 4)
}

// With WorkloadWithJob every Job gets a PodGroup, of the basic policy when
// the Job asks for none; muster keeps such a Job a gang (as with the gate
// off) instead of placing its pods one by one.
func TestWorkloadBasicGroupOfJobStaysAGang(t *testing.T) {
	nodes := gpuNodes(3, 8)
	c := startWorkloadCluster(t, nodes[:2]...)
	c.createJob(jobSpec{name: "train", workers: 3, gpus: 8})
	pods := c.waitJobUnschedulable("train", 3, "gang")
	for _, p := range pods {
		require.NotNil(t, p.Spec.SchedulingGroup, "with WorkloadWithJob the Job controller puts pod %s in a PodGroup", p.Name)
	}
	c.requireHoldsNothing("3 x 8 GPUs on 2 nodes")

	c.addNodes(nodes[2])
	c.addBackground(4, nodes[2])
	c.waitJobBound("train", 3)
}

// A higher-priority group evicts a lower-priority group (disruptionMode
// all) whole, and nothing of the background.
func TestWorkloadGroupPreemption(t *testing.T) {
	nodes := gpuNodes(4, 8)
	c := startWorkloadCluster(t, nodes...)
	c.createPriorityClasses()
	k := c.startKubelet()
	background := c.backgroundLeft()

	for _, g := range []struct{ name, class string }{{"low", "low"}, {"high", "high"}} {
		c.createWorkloadGroup(g.name, 4, func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.PriorityClassName = g.class
			pg.Spec.DisruptionMode = &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}
		})
		c.createJob(jobSpec{name: g.name, workers: 4, gpus: 8, mutate: withPriority(g.class, inGroup(g.name))})
		if g.name == "low" {
			c.waitJobBound("low", 4)
		}
	}
	c.waitFor("the high group bound whole", 60*time.Second, func() (bool, error) { return c.liveBound("high") == 4, nil })

	removed := k.removedPods()
	var lowRemoved []string
	for name, disrupted := range removed {
		require.True(t, disrupted, "victim %s carries DisruptionTarget", name)
		lowRemoved = append(lowRemoved, name)
	}
	slices.Sort(lowRemoved)
	require.Len(t, lowRemoved, 4, "the whole low group is evicted: %v", lowRemoved)
	for _, name := range lowRemoved {
		require.Contains(t, name, "low-", "only the low group's pods are evicted")
	}
	require.Equal(t, background, c.backgroundLeft(), "no background pod is evicted")
}

// minCount is mutable in 1.37: a group waiting for a fifth member goes
// ahead when its minCount drops to the four it has, and nothing is held
// meanwhile.
func TestWorkloadGroupMinCountChangeWakesTheGang(t *testing.T) {
	c := startWorkloadCluster(t, gpuNodes(4, 8)...)
	c.createWorkloadGroup("train", 5)
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: inGroup("train")})
	c.waitForEvent("PodGroup", "train", "GangWaitingForMembers", "has 4 of 5 members")
	c.requireHoldsNothing("4 of 5 members")

	pg, err := c.Client.SchedulingV1beta1().PodGroups(c.ns).Get(c.ctx, "train", metav1.GetOptions{})
	require.NoError(t, err)
	pg.Spec.SchedulingPolicy.Gang.MinCount = 4
	_, err = c.Client.SchedulingV1beta1().PodGroups(c.ns).Update(c.ctx, pg, metav1.UpdateOptions{})
	require.NoError(t, err)
	c.waitJobBound("train", 4)
}

// The shipped RBAC is enough with the workload API on: the scheduler, as
// its ServiceAccount, watches the PodGroups, plans the group, and writes
// the group's PodGroupInitiallyScheduled condition.
func TestWorkloadGroupLeastPrivilege(t *testing.T) {
	featuregatetesting.SetFeatureGatesDuringTest(t, utilfeature.DefaultFeatureGate, featuregatetesting.FeatureOverrides{
		features.GenericWorkload:                 true,
		features.WorkloadWithJob:                 true,
		features.TopologyAwareWorkloadScheduling: true,
	})
	admin := controlplane.Start(t, "--authorization-mode=RBAC", "--runtime-config=scheduling.k8s.io/v1beta1=true")
	applyManifests(t, admin)
	sched, err := admin.ServiceAccount("muster-system", "muster-scheduler")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	nodes := gpuNodes(4, 8)
	require.NoError(t, controlplane.CreateNodes(ctx, admin.Client, nodes...))
	c := &cluster{ControlPlane: admin, t: t, ctx: ctx, ns: admin.Namespace(t, "rbac")}
	c.addBackground(4, nodes...)
	done, err := sched.StartScheduler(ctx)
	require.NoError(t, err, "scheduler as its ServiceAccount")
	t.Cleanup(func() { cancel(); <-done })

	c.createWorkloadGroup("train", 4)
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: inGroup("train")})
	c.waitJobBound("train", 4)
	c.requireGroupScheduled("train")
}

// A PodGroup's plan waits for its victims; meanwhile the chief's volume
// claim is deleted. In the group's cycle VolumeBinding's PreFilter refuses
// the chief, the worker fits its slot, and the core counts the group as
// placed: muster breaks the plan at once, not when it times out, and the
// gang then holds nothing until the claim is back.
func TestWorkloadMemberRefusedByAnotherPreFilterBreaksThePlan(t *testing.T) {
	nodes := gpuNodes(2, 8)
	c := startWorkloadCluster(t, nodes...)
	c.createPriorityClasses()
	k := c.startKubelet()
	background := c.backgroundLeft()
	c.createJob(jobSpec{name: "low", workers: 2, gpus: 8, mutate: withPriority("low")})
	c.waitJobBound("low", 2)
	c.createBoundClaim("ckpt")

	// The victims stay terminating until the kubelet stand-in runs again.
	k.running.Store(false)
	c.createWorkloadGroup("high", 2, func(pg *schedulingv1beta1.PodGroup) { pg.Spec.PriorityClassName = "high" })
	withClaim := func(job *batchv1.Job) {
		spec := &job.Spec.Template.Spec
		spec.Volumes = []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt"}}}}
		spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ckpt", MountPath: "/ckpt"}}
	}
	c.createJob(jobSpec{name: "chief", workers: 1, gpus: 8, mutate: withPriority("high", inGroup("high"), withClaim)})
	c.createJob(jobSpec{name: "worker", workers: 1, gpus: 8, mutate: withPriority("high", inGroup("high"))})
	c.waitFor("the low gang preempted", 60*time.Second, func() (bool, error) {
		pods := c.jobPods("low")
		for _, p := range pods {
			if p.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return len(pods) == 2, nil
	})

	c.deleteClaim("ckpt")
	// A pod alone that mounts the claim is refused once the scheduler's
	// informer has seen the claim go: only then may the victims leave.
	canary := testobj.MakePod(c.ns, "canary").SchedulerName("muster").Obj()
	canary.Spec.Containers = []corev1.Container{{Name: "c", Image: "busybox"}}
	canary.Spec.Volumes = []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt"}}}}
	_, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, canary, metav1.CreateOptions{})
	require.NoError(t, err)
	c.waitFor("the canary refused for the deleted claim", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "canary", metav1.GetOptions{})
		return err == nil && unschedulableWith(p, `"ckpt"`), err
	})
	require.NoError(t, c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, "canary", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))

	k.running.Store(true)
	// Well within the plan's 120 s deadline.
	c.waitForEvent("PodGroup", "high", string(gang.OutcomeRejected), "was refused in the PodGroup's cycle before muster's PreFilter ran")
	c.waitFor("the chief refused for its claim, nothing of the gang held", 60*time.Second, func() (bool, error) {
		chief, worker := c.jobPods("chief"), c.jobPods("worker")
		if len(chief) != 1 || len(worker) != 1 || !unschedulableWith(&chief[0], `"ckpt"`) {
			return false, nil
		}
		for _, p := range append(chief, worker...) {
			if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
				return false, nil
			}
		}
		return true, nil
	})

	c.createBoundClaim("ckpt")
	c.waitFor("the gang bound whole", 60*time.Second, func() (bool, error) {
		return c.liveBound("chief") == 1 && c.liveBound("worker") == 1, nil
	})
	require.Equal(t, background, c.backgroundLeft(), "no background pod is evicted")
}

// deleteClaim deletes the claim createBoundClaim made, and its volume,
// lifting the protection finalizer no controller lifts here.
func (c *cluster) deleteClaim(name string) {
	c.t.Helper()
	claims := c.Client.CoreV1().PersistentVolumeClaims(c.ns)
	require.NoError(c.t, claims.Delete(c.ctx, name, metav1.DeleteOptions{}))
	_, err := claims.Patch(c.ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if !apierrors.IsNotFound(err) {
		require.NoError(c.t, err)
	}
	require.NoError(c.t, c.Client.CoreV1().PersistentVolumes().Delete(c.ctx, c.ns+"-"+name, metav1.DeleteOptions{}))
	_, err = c.Client.CoreV1().PersistentVolumes().Patch(c.ctx, c.ns+"-"+name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if !apierrors.IsNotFound(err) {
		require.NoError(c.t, err)
	}
	c.waitFor("claim "+name+" and its volume gone", 30*time.Second, func() (bool, error) {
		_, errClaim := claims.Get(c.ctx, name, metav1.GetOptions{})
		_, errVolume := c.Client.CoreV1().PersistentVolumes().Get(c.ctx, c.ns+"-"+name, metav1.GetOptions{})
		return apierrors.IsNotFound(errClaim) && apierrors.IsNotFound(errVolume), nil
	})
}
