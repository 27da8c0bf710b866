package kubectlmuster

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// withPriority gives the Job's pods a priority (and preemption policy).
func withPriority(j *batchv1.Job, priority int32, never bool) *batchv1.Job {
	j.Spec.Template.Spec.Priority = ptr.To(priority)
	if never {
		j.Spec.Template.Spec.PreemptionPolicy = ptr.To(corev1.PreemptNever)
	}
	return j
}

func TestExplain(t *testing.T) {
	nodes := rackNodes(2, 2, 8) // r1-n1 r1-n2 | r2-n1 r2-n2, 8 GPUs each
	all := []string{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}
	pending := func(j *batchv1.Job, n int) []corev1.Pod {
		return unschedulable(members(j, n), "gang "+testNS+"/"+j.Name+" needs more", testNow.Add(-time.Minute))
	}

	big := job("big", 5, 8).Obj()
	topo := job("topo", 3, 8).PodAnnotation(gang.AnnotationTopologyRequired, "rack").Obj()
	low := withPriority(job("low", 4, 8).Obj(), 10, false)
	highNever := withPriority(job("urgent", 2, 8).Obj(), 1000, false)
	highNever.Spec.Template.Spec.PreemptionPolicy = ptr.To(corev1.PreemptNever)
	equal := withPriority(job("peer", 2, 8).Obj(), 10, false)
	high := withPriority(job("boss", 2, 8).Obj(), 1000, false)
	ckpt := job("ckpt", 1, 8).Obj()
	ckpt.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt"}}}}
	onDemand := job("on-demand", 3, 8).PodAnnotation(gang.AnnotationPreemptible, "forbid").Obj()
	spotNodes := rackNodes(2, 2, 8)
	spotNodes[2].Labels = testobj.MakeNode("r2-n1").GPUs(8).Rack("r2").Zone("z1").Spot().Obj().Labels
	spotNodes[3].Labels = testobj.MakeNode("r2-n2").GPUs(8).Rack("r2").Zone("z1").Spot().Obj().Labels
	boundJob := job("done-placing", 2, 8).Obj()
	queued := job("queued", 2, 8).Label(KueueQueueLabel, "gpu").Obj()
	queued.Spec.Suspend = ptr.To(true)
	pg, pgPods := podGroup("pg", 4, 3, 8)

	type finding struct{ reason, part string }
	cases := []struct {
		name     string
		snap     *Snapshot
		kind     gang.Kind
		gangName string
		findings []finding
		nodes    map[string]int
	}{{
		name: "too big for the cluster: one node short",
		snap: snapshot(nodes, pending(big, 5), big), kind: gang.KindJob, gangName: "big",
		findings: []finding{
			{FindingCapacity, "needs 1 more node with 8 free nvidia.com/gpu; the cluster has room for 4 of 5 members"},
			{FindingPlanner, "at most 4 fit"},
		},
		nodes: map[string]int{NodeHasRoom: 4},
	}, {
		name: "topology-required rack: names the closest rack",
		snap: snapshot(nodes, pending(topo, 3), topo), kind: gang.KindJob, gangName: "topo",
		findings: []finding{{FindingCapacity, "needs 1 more node with 8 free nvidia.com/gpu in one rack; rack r1 has room for 2 of 3 members"}},
		nodes:    map[string]int{NodeHasRoom: 2, NodeOutsideDomain: 2},
	}, {
		name: "behind a lower-priority gang, preemptionPolicy Never",
		snap: snapshot(nodes, concat(members(low, 4, all...), pending(highNever, 2)), low, highNever), kind: gang.KindJob, gangName: "urgent",
		findings: []finding{
			{FindingCapacity, "needs 2 more nodes with 8 free nvidia.com/gpu; the cluster has room for 0 of 2 members"},
			{FindingPreemptBlocked, "would fit if gang team-a/job/low (priority 10, 32 nvidia.com/gpu) were preempted: this gang's priority 1000 is higher, but its preemptionPolicy is Never"},
		},
		nodes: map[string]int{NodeInsufficientGPUs: 4},
	}, {
		name: "behind a gang of equal priority",
		snap: snapshot(nodes, concat(members(low, 4, all...), pending(equal, 2)), low, equal), kind: gang.KindJob, gangName: "peer",
		findings: []finding{{FindingPreemptBlocked, "this gang's priority 10 does not allow it"}},
	}, {
		name: "behind a lower-priority gang it may preempt",
		snap: snapshot(nodes, concat(members(low, 4, all...), pending(high, 2)), low, high), kind: gang.KindJob, gangName: "boss",
		findings: []finding{{FindingPreemptPossible, "gang team-a/job/low (priority 10, 32 nvidia.com/gpu) were preempted, and this gang's priority 1000 allows it"}},
	}, {
		name: "a member waits for a PVC that does not exist",
		snap: snapshot(nodes, pending(ckpt, 1), ckpt), kind: gang.KindJob, gangName: "ckpt",
		findings: []finding{{FindingPVC, "member ckpt-0 waits for PVC ckpt: it does not exist"}, {FindingFitsNow, "places the 1 pending members"}},
	}, {
		name: "spot nodes a forbid policy excludes",
		snap: snapshot(spotNodes, pending(onDemand, 3), onDemand), kind: gang.KindJob, gangName: "on-demand",
		findings: []finding{{FindingCapacity, "needs 1 more node with 8 free nvidia.com/gpu; the cluster has room for 2 of 3 members"}},
		nodes:    map[string]int{NodeHasRoom: 2, NodePolicy: 2},
	}, {
		name: "bound: where it landed",
		snap: snapshot(nodes, members(boundJob, 2, "r2-n1", "r2-n2"), boundJob), kind: gang.KindJob, gangName: "done-placing",
		findings: []finding{{FindingBound, "bound: 2 members on 2 nodes in rack r2"}},
	}, {
		name: "suspended by Kueue: would fit once resumed",
		snap: snapshot(nodes, nil, queued), kind: gang.KindJob, gangName: "queued",
		findings: []finding{{FindingSuspended, "kueue.x-k8s.io/queue-name=gpu"}, {FindingFitsNow, "once resumed"}},
	}, {
		name: "PodGroup waiting for a member",
		snap: func() *Snapshot {
			s := snapshot(nodes, pgPods)
			s.PodGroups = []v1alpha1.PodGroup{pg}
			return s
		}(),
		kind: gang.KindPodGroup, gangName: "pg",
		findings: []finding{{FindingWaitingMembers, "waiting for 1 more member (3 of 4 exist)"}, {FindingFitsNow, "once its 1 missing or gated members"}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := Explain(tc.snap, testNS, tc.kind, tc.gangName, DefaultOptions())
			require.NoError(t, err)
			for _, want := range tc.findings {
				found := false
				for _, f := range ex.Findings {
					if f.Reason == want.reason && strings.Contains(f.Message, want.part) {
						found = true
					}
				}
				assert.True(t, found, "no finding %s containing %q in %+v", want.reason, want.part, ex.Findings)
			}
			if tc.nodes != nil {
				got := map[string]int{}
				for _, n := range ex.Nodes {
					got[n.Reason] = n.Nodes
				}
				assert.Equal(t, tc.nodes, got, "nodes by reason")
			}
		})
	}
}

func TestExplainBadInput(t *testing.T) {
	mnist := job("mnist", 1, 8).Obj()
	other := job("web", 1, 0).SchedulerName("default-scheduler").Obj()
	snap := snapshot(rackNodes(1, 1, 8), members(mnist, 1), mnist, other)

	_, err := Explain(snap, testNS, gang.KindJob, "mnsit", DefaultOptions())
	require.ErrorIs(t, err, ErrNotFound)
	assert.EqualError(t, err, `not found: job "mnsit" in namespace "team-a"; did you mean job/mnist?`)

	_, err = Explain(snap, testNS, gang.KindJob, "web", DefaultOptions())
	assert.EqualError(t, err, `job team-a/web is not scheduled by muster (its pods' schedulerName is "default-scheduler")`)

	ex, err := Explain(snap, testNS, gang.KindPod, "mnist-0", DefaultOptions())
	require.NoError(t, err, "a pod argument explains its gang")
	assert.Equal(t, "job/mnist", ex.Gang.Ref())

	_, _, err = ParseRef("jbo/mnist")
	assert.ErrorContains(t, err, `unknown kind "jbo"; did you mean job?`)
	_, _, err = ParseRef("mnist")
	assert.ErrorContains(t, err, "want <kind>/<name>")
	assert.False(t, errors.Is(err, ErrNotFound))
}

// The scheduler's record of a gang's last failed plan (its per-reason node
// counts, a filter's refusal by name) is shown while the gang waits, and
// left out once it is bound.
func TestExplainShowsTheSchedulersLastFailedPlan(t *testing.T) {
	nodes := rackNodes(1, 2, 8)
	record := &gang.FailedPlan{Time: testNow.Add(-2 * time.Minute), Message: "gang team-a/waiting: at most 1 of 2 members fit",
		Nodes: []gang.NodeReasonCount{{Reason: gang.NodeFilterRejected, Filter: "InterPodAffinity", Nodes: 1}, {Reason: gang.NodeHasRoom, Nodes: 1}}}
	waiting := job("waiting", 2, 8).Obj()
	placed := job("placed", 2, 8).Obj()
	for _, j := range []*batchv1.Job{waiting, placed} {
		j.Annotations = map[string]string{gang.FailedPlanAnnotation: record.Encode()}
	}
	pending := unschedulable(members(waiting, 2), "no plan", testNow.Add(-time.Minute))

	ex, err := Explain(snapshot(nodes, pending, waiting), testNS, gang.KindJob, "waiting", DefaultOptions())
	require.NoError(t, err)
	require.NotNil(t, ex.LastFailedPlan)
	assert.Equal(t, record.Nodes, ex.LastFailedPlan.Nodes)
	assert.Equal(t, record.Message, ex.LastFailedPlan.Message)
	var out strings.Builder
	require.NoError(t, printExplanation(&out, ex, "nvidia.com/gpu", testNow))
	assert.Contains(t, out.String(), "Nodes at the scheduler's last failed plan (2m ago):")
	assert.Regexp(t, `1\s+FilterRejected \(InterPodAffinity\)`, out.String())

	ex, err = Explain(snapshot(nodes, members(placed, 2, "r1-n1", "r1-n2"), placed), testNS, gang.KindJob, "placed", DefaultOptions())
	require.NoError(t, err)
	assert.Nil(t, ex.LastFailedPlan, "a bound gang's old failure")

	// An unreadable record is left out, not an error.
	waiting.Annotations[gang.FailedPlanAnnotation] = "{"
	ex, err = Explain(snapshot(nodes, pending, waiting), testNS, gang.KindJob, "waiting", DefaultOptions())
	require.NoError(t, err)
	assert.Nil(t, ex.LastFailedPlan)
}

// A gang that asked cluster-autoscaler for nodes shows the autoscaler's
// answer among its Events.
func TestExplainShowsTheAutoscalersAnswer(t *testing.T) {
	nodes := rackNodes(1, 2, 8)
	waiting := job("waiting", 3, 8).Obj()
	s := snapshot(nodes, unschedulable(members(waiting, 3), "gang team-a/waiting needs 3 members", testNow.Add(-time.Minute)), waiting)
	s.Events = []eventsv1.Event{
		gangEvent("waiting", gang.ReasonProvisioningRequested, "muster asked cluster-autoscaler for nodes", testNow.Add(-50*time.Second)),
		gangEvent("waiting", gang.ReasonProvisioningFailed, "node group gpu-pool is at its maximum size", testNow.Add(-10*time.Second)),
	}
	ex, err := Explain(s, testNS, gang.KindJob, "waiting", DefaultOptions())
	require.NoError(t, err)
	require.NotEmpty(t, ex.Events)
	assert.Equal(t, gang.ReasonProvisioningFailed, ex.Events[0].Reason)
	assert.Contains(t, ex.Events[0].Message, "at its maximum size")
	var out strings.Builder
	require.NoError(t, printExplanation(&out, ex, "nvidia.com/gpu", testNow))
	assert.Contains(t, out.String(), "node group gpu-pool is at its maximum size")
}
