package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/controlplane"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
	"github.com/muster-sched/muster/pkg/kubectlmuster"
)

// kubectlMuster runs `kubectl muster args` in process against the cluster
// behind kubeconfig, in the test's namespace.
func (c *cluster) kubectlMuster(kubeconfig string, args ...string) (stdout string, err error) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	cmd := kubectlmuster.NewCommand(genericiooptions.IOStreams{Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig, "--namespace", c.ns}, args...))
	err = cmd.ExecuteContext(c.ctx)
	if err != nil {
		err = fmt.Errorf("%w (stderr: %s)", err, errOut.String())
	}
	return out.String(), err
}

// waitExplained polls `kubectl muster explain ref -o json` until the gang is
// in phase (any, when empty) and has a finding of each reason containing its
// text.
func (c *cluster) waitExplained(ref string, phase gang.Phase, findings map[string]string) *kubectlmuster.Explanation {
	c.t.Helper()
	var ex kubectlmuster.Explanation
	var last string
	defer func() {
		if c.t.Failed() {
			c.t.Logf("last explanation of %s:\n%s", ref, last)
		}
	}()
	c.waitFor(fmt.Sprintf("explain %s: phase %s with %v", ref, phase, findings), 60*time.Second, func() (bool, error) {
		out, err := c.kubectlMuster(c.Kubeconfig, "explain", ref, "-o", "json")
		if err != nil {
			return false, err
		}
		last = out
		ex = kubectlmuster.Explanation{}
		if err := json.Unmarshal([]byte(out), &ex); err != nil {
			return false, err
		}
		if phase != "" && ex.Gang.Phase != phase {
			return false, nil
		}
		for reason, text := range findings {
			if !hasFinding(ex.Findings, reason, text) {
				return false, nil
			}
		}
		return true, nil
	})
	return &ex
}

// waitFailedPlan waits until explain shows the scheduler's record of the
// gang's last failed plan with these node counts by reason.
func (c *cluster) waitFailedPlan(ref string, want map[string]int) {
	c.t.Helper()
	var last string
	c.waitFor(fmt.Sprintf("explain %s: the scheduler's failed plan counts %v", ref, want), 30*time.Second, func() (bool, error) {
		out, err := c.kubectlMuster(c.Kubeconfig, "explain", ref, "-o", "json")
		if err != nil {
			return false, err
		}
		last = out
		var ex kubectlmuster.Explanation
		if err := json.Unmarshal([]byte(out), &ex); err != nil {
			return false, err
		}
		if ex.LastFailedPlan == nil {
			return false, nil
		}
		got := map[string]int{}
		for _, n := range ex.LastFailedPlan.Nodes {
			got[n.Reason] += n.Nodes
		}
		return maps.Equal(got, want), nil
	})
	if c.t.Failed() {
		c.t.Logf("last explanation of %s:\n%s", ref, last)
	}
}

func hasFinding(findings []kubectlmuster.Finding, reason, text string) bool {
	for _, f := range findings {
		if f.Reason == reason && strings.Contains(f.Message, text) {
			return true
		}
	}
	return false
}

// The plugin against the real scheduler, on one cluster of two racks of two
// 8-GPU nodes, gang after gang: each explanation is checked on the live
// state the gangs before it left.
func TestKubectlMusterExplains(t *testing.T) {
	var nodes []*corev1.Node
	for _, name := range []string{"r1-n1", "r1-n2", "r2-n1", "r2-n2"} {
		nodes = append(nodes, gpuNode(name, 8).Rack(name[:2]).Zone("z1").Obj())
	}
	c := startCluster(t, nodes...)
	// A real cluster's background: priority-0 CPU pods on every node, half
	// of them under a PodDisruptionBudget.
	c.addBackground(4, nodes...)
	c.createPriorityClasses()
	rackRequired := map[string]string{gang.AnnotationTopologyRequired: "rack"}

	// Bound: where it landed (best fit, ties by name: rack r1).
	c.createJob(jobSpec{name: "placed", workers: 2, gpus: 8, annotations: rackRequired})
	c.waitJobBound("placed", 2)
	ex := c.waitExplained("job/placed", gang.PhaseBound, map[string]string{
		kubectlmuster.FindingBound: "bound: 2 members on 2 nodes in rack r1"})
	require.Len(t, ex.Members, 2)
	for _, m := range ex.Members {
		assert.Contains(t, []string{"r1-n1", "r1-n2"}, m.Node, "member %s", m.Name)
	}

	// Too big: 5 × 8 GPUs where 2 nodes are free.
	c.createJob(jobSpec{name: "huge", workers: 5, gpus: 8})
	c.waitExplained("job/huge", gang.PhaseUnschedulable, map[string]string{
		kubectlmuster.FindingCapacity: "needs 3 more nodes with 8 free nvidia.com/gpu; the cluster has room for 2 of 5 members",
		kubectlmuster.FindingPlanner:  "at most 2 fit"})
	// The scheduler's own count, recorded on the Job: rack r1 is full.
	c.waitFailedPlan("job/huge", map[string]int{gang.NodeInsufficientGPUs: 2, gang.NodeHasRoom: 2})

	// Blocked by topology: 3 in one rack; rack r2 comes closest.
	c.createJob(jobSpec{name: "topo", workers: 3, gpus: 8, annotations: rackRequired})
	ex = c.waitExplained("job/topo", gang.PhaseUnschedulable, map[string]string{
		kubectlmuster.FindingCapacity: "needs 1 more node with 8 free nvidia.com/gpu in one rack; rack r2 has room for 2 of 3 members"})
	assert.Contains(t, nodeReasons(ex), kubectlmuster.NodeInsufficientGPUs+"=2", "rack r1 is full")

	// Waiting for members: a PodGroup of 3 with 2 pods.
	c.createPodGroup("pg", 3, nil)
	c.createGroupPod("pg", "pg-0", 1)
	c.createGroupPod("pg", "pg-1", 1)
	c.waitExplained("podgroup/pg", gang.PhaseWaitingForMembers, map[string]string{
		kubectlmuster.FindingWaitingMembers: "waiting for 1 more member (2 of 3 exist)"})

	// Suspended for Kueue: no Kueue runs here, so the Job stays suspended
	// and the plugin has only its label (TestE2EKubectlMusterKueue runs
	// the real Kueue).
	c.createJob(jobSpec{name: "queued", workers: 2, gpus: 8, labels: map[string]string{kubectlmuster.KueueQueueLabel: "gpu"},
		mutate: func(j *batchv1.Job) { j.Spec.Suspend = ptr.To(true) }})
	c.waitExplained("job/queued", gang.PhaseSuspended, map[string]string{
		kubectlmuster.FindingSuspended: "Kueue has not admitted it yet (label kueue.x-k8s.io/queue-name=gpu; Kueue's Workloads are not read here)",
		kubectlmuster.FindingFitsNow:   "once resumed"})

	// A member waits for a PVC that does not exist.
	c.createJob(jobSpec{name: "ckpt", workers: 1, gpus: 8, mutate: func(j *batchv1.Job) {
		j.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt-data"}}}}
	}})
	// (Unschedulable, or backing off if a plan was refused by VolumeBinding.)
	c.waitExplained("job/ckpt", "", map[string]string{
		kubectlmuster.FindingPVC: "waits for PVC ckpt-data: it does not exist"})

	// Behind a lower-priority gang it may not preempt: rack r2 filled at
	// priority 10, then a gang of priority 1000 with preemptionPolicy Never.
	c.createJob(jobSpec{name: "low", workers: 2, gpus: 8, mutate: withPriority("low")})
	c.waitJobBound("low", 2)
	c.createJob(jobSpec{name: "urgent", workers: 2, gpus: 8, mutate: withPriority("high-never")})
	c.waitExplained("job/urgent", gang.PhaseUnschedulable, map[string]string{
		kubectlmuster.FindingPreemptBlocked: "would fit if gang " + c.ns + "/job/low (priority 10, 16 nvidia.com/gpu) were preempted: this gang's priority 1000 is higher, but its preemptionPolicy is Never",
		kubectlmuster.FindingCapacity:       "needs 2 more nodes with 8 free nvidia.com/gpu; the cluster has room for 0 of 2 members"})

	// gangs lists them all, one line each.
	out, err := c.kubectlMuster(c.Kubeconfig, "gangs")
	require.NoError(t, err)
	for _, want := range []string{
		`job/placed\s+2/2\s+Bound\s+16\s+rack r1`,
		`job/huge\s+0/5\s+Unschedulable\s+40\s+-`,
		`podgroup/pg\s+0/3\s+WaitingForMembers\s+2`,
		`job/queued\s+0/2\s+Suspended\s+0`,
		`job/low\s+2/2\s+Bound\s+16\s+rack r2`,
	} {
		assert.Regexp(t, want, out)
	}
	var list kubectlmuster.GangList
	out, err = c.kubectlMuster(c.Kubeconfig, "gangs", "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	assert.Len(t, list.Items, 8, "placed, huge, topo, pg, queued, ckpt, low, urgent")

	// top: the cluster is full but for nothing.
	out, err = c.kubectlMuster(c.Kubeconfig, "top")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^cluster\s+4\s+32\s+32\s+0\s+0\s+0\s+0\s+0$`, out)
}

func nodeReasons(ex *kubectlmuster.Explanation) []string {
	var out []string
	for _, n := range ex.Nodes {
		out = append(out, fmt.Sprintf("%s=%d", n.Reason, n.Nodes))
	}
	return out
}

// The plugin works with ClusterRole muster-viewer alone, run as a
// ServiceAccount bound to it on an API server that enforces RBAC: it sees
// what an admin sees, byte for byte in -o json. A ServiceAccount without
// the role is told which list is missing.
func TestKubectlMusterViewerRole(t *testing.T) {
	admin := controlplane.Start(t, "--authorization-mode=RBAC")
	applyManifests(t, admin)
	c := &cluster{ControlPlane: admin, t: t, ns: admin.Namespace(t, "viewer")}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.ctx = ctx
	c.addNodes(gpuNodes(2, 8)...)
	c.startScheduler()
	for _, name := range []string{"gang-viewer", "nobody"} {
		_, err := admin.Client.CoreV1().ServiceAccounts(c.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err := admin.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gang-viewer-views-gangs"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "muster-viewer"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: c.ns, Name: "gang-viewer"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	viewer, err := admin.ServiceAccount(c.ns, "gang-viewer")
	require.NoError(t, err)
	nobody, err := admin.ServiceAccount(c.ns, "nobody")
	require.NoError(t, err)

	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8})
	c.waitJobBound("mnist", 2)
	// RBAC takes the new binding from its informer: poll until it applies.
	c.waitFor("gangs as the viewer", 30*time.Second, func() (bool, error) {
		out, err := c.kubectlMuster(viewer.Kubeconfig, "gangs", "-A")
		return err == nil && strings.Contains(out, "job/mnist"), nil
	})
	pod := c.jobPods("mnist")[0].Name
	for _, args := range [][]string{{"explain", "job/mnist"}, {"explain", "pod/" + pod}, {"top", "-o", "wide"}, {"gangs"}} {
		_, err := c.kubectlMuster(viewer.Kubeconfig, args...)
		assert.NoError(t, err, "%v as a muster-viewer", args)
	}
	// -o json is the same for the viewer as for the admin, and run after
	// run while nothing changes.
	c.waitFor("gangs -o json: the viewer sees what the admin sees", 30*time.Second, func() (bool, error) {
		asAdmin, err := c.kubectlMuster(admin.Kubeconfig, "gangs", "-o", "json")
		if err != nil {
			return false, err
		}
		asViewer, err := c.kubectlMuster(viewer.Kubeconfig, "gangs", "-o", "json")
		if err != nil {
			return false, err
		}
		again, err := c.kubectlMuster(viewer.Kubeconfig, "gangs", "-o", "json")
		return err == nil && asViewer == asAdmin && again == asViewer && strings.Contains(asViewer, `"phase": "Bound"`), err
	})

	_, err = c.kubectlMuster(nobody.Kubeconfig, "gangs")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `forbidden: you may not list nodes (verb "list" on resource "nodes"; ClusterRole muster-viewer grants it)`)
}

// Kubernetes' own PodGroup (scheduling.k8s.io/v1beta1), rack required by its
// schedulingConstraints: the plugin finds the gang through the pods'
// schedulingGroup and names the rack that comes closest.
func TestKubectlMusterWorkloadPodGroup(t *testing.T) {
	var nodes []*corev1.Node
	for i, rack := range []string{"r1", "r1", "r1", "r2", "r2", "r2"} {
		nodes = append(nodes, gpuNode(fmt.Sprintf("%s-n%d", rack, i), 8).Rack(rack).Zone("z1").Obj())
	}
	c := startWorkloadCluster(t, nodes...)
	c.createWorkloadGroup("train", 4, func(pg *schedulingv1beta1.PodGroup) {
		pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
			Topology: []schedulingv1beta1.TopologyConstraint{{Key: configv1.LabelRack}},
		}
	})
	c.createJob(jobSpec{name: "train", workers: 4, gpus: 8, mutate: inGroup("train")})
	ex := c.waitExplained("podgroup.scheduling.k8s.io/train", gang.PhaseUnschedulable, map[string]string{
		kubectlmuster.FindingCapacity: "needs 1 more node with 8 free nvidia.com/gpu in one rack; rack r1 has room for 3 of 4 members"})
	assert.Equal(t, "rack", ex.Constraints.TopologyRequired, "from the PodGroup's schedulingConstraints")
	assert.Equal(t, 4, ex.Gang.Quorum, "gang.minCount")

	out, err := c.kubectlMuster(c.Kubeconfig, "gangs")
	require.NoError(t, err)
	assert.Regexp(t, `podgroup.scheduling.k8s.io/train\s+0/4\s+Unschedulable\s+32`, out)
}
