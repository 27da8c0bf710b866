package kubectlmuster

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

func TestGangsPhase(t *testing.T) {
	nodes := rackNodes(2, 4, 8)
	bigJob := job("big", 4, 8).Obj()
	suspended := job("queued", 2, 8).Label(KueueQueueLabel, "gpu").Obj()
	suspended.Spec.Suspend = ptr.To(true)
	gatedJob := job("gated", 3, 8).Obj()
	gatedPods := members(gatedJob, 3)
	gatedPods[2].Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/quota"}}
	done := job("done", 1, 8).Obj()
	done.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	pg, pgPods := podGroup("pg", 4, 3, 8)
	other := job("other", 2, 8).SchedulerName("default-scheduler").Obj()

	unschedulableMsg := "gang team-a/big needs 4 members of 8 nvidia.com/gpu; at most 3 fit"
	cases := []struct {
		name    string
		snap    *Snapshot
		gang    string
		phase   gang.Phase
		bound   string // bound/quorum
		gpus    int64
		domain  string
		message string
	}{{
		name: "bound in one rack",
		snap: snapshot(nodes, members(bigJob, 4, "r1-n1", "r1-n2", "r1-n3", "r1-n4"), bigJob),
		gang: "job/big", phase: gang.PhaseBound, bound: "4/4", gpus: 32, domain: "rack r1", message: "4 of 4 members bound on 4 nodes in rack r1",
	}, {
		name: "bound over two racks of one zone",
		snap: snapshot(nodes, members(bigJob, 4, "r1-n1", "r1-n2", "r2-n1", "r2-n2"), bigJob),
		gang: "job/big", phase: gang.PhaseBound, bound: "4/4", gpus: 32, domain: "zone z1",
	}, {
		name: "unschedulable: the pods' message",
		snap: snapshot(nodes, unschedulable(members(bigJob, 4), unschedulableMsg, testNow.Add(-time.Minute)), bigJob),
		gang: "job/big", phase: gang.PhaseUnschedulable, bound: "0/4", gpus: 32, message: unschedulableMsg,
	}, {
		name: "suspended by Kueue, no pods",
		snap: snapshot(nodes, nil, suspended),
		gang: "job/queued", phase: gang.PhaseSuspended, bound: "0/2", message: "label kueue.x-k8s.io/queue-name=gpu",
	}, {
		name: "a gated member keeps the quorum from being schedulable",
		snap: snapshot(nodes, gatedPods, gatedJob),
		gang: "job/gated", phase: gang.PhaseWaitingForMembers, bound: "0/3", gpus: 24, message: "held by scheduling gates",
	}, {
		name: "finished Job",
		snap: snapshot(nodes, nil, done),
		gang: "job/done", phase: gang.PhaseFinished, bound: "0/1",
	}, {
		name: "PodGroup with fewer pods than minMember",
		snap: func() *Snapshot {
			s := snapshot(nodes, pgPods)
			s.PodGroups = []v1alpha1.PodGroup{pg}
			return s
		}(),
		gang: "podgroup/pg", phase: gang.PhaseWaitingForMembers, bound: "0/4", gpus: 24, message: "3 of 4 members exist",
	}, {
		name: "a newer Event beats an older pod message",
		snap: func() *Snapshot {
			s := snapshot(nodes, unschedulable(members(bigJob, 4), unschedulableMsg, testNow.Add(-time.Minute)), bigJob)
			s.Events = []eventsv1.Event{gangEvent("big", "GangPreempting", "gang team-a/big preempts 2 pods", testNow.Add(-time.Second))}
			return s
		}(),
		gang: "job/big", phase: gang.PhasePreempting, bound: "0/4", gpus: 32, message: "preempts 2 pods",
	}, {
		name: "the autoscaler's answer is no phase: the gang stays unschedulable",
		snap: func() *Snapshot {
			s := snapshot(nodes, unschedulable(members(bigJob, 4), unschedulableMsg, testNow.Add(-time.Minute)), bigJob)
			s.Events = []eventsv1.Event{gangEvent("big", gang.ReasonProvisioned, "cluster-autoscaler provisioned the nodes", testNow.Add(-time.Second))}
			return s
		}(),
		gang: "job/big", phase: gang.PhaseUnschedulable, bound: "0/4", gpus: 32, message: unschedulableMsg,
	}, {
		name: "every member reserved and binding: Permitted",
		snap: func() *Snapshot {
			s := snapshot(nodes, nominated(members(bigJob, 4), "r1-n1", "r1-n2", "r1-n3", "r1-n4"), bigJob)
			s.Events = []eventsv1.Event{gangEvent("big", "GangScheduled", "job team-a/big: all 4 planned members reserved on 4 nodes in rack r1; binding", testNow.Add(-time.Second))}
			return s
		}(),
		gang: "job/big", phase: gang.PhasePermitted, bound: "0/4", gpus: 32, domain: "rack r1", message: "binding",
	}, {
		name: "a plan dropped by a node change is planned again at once: Dropped",
		snap: func() *Snapshot {
			s := snapshot(nodes, members(bigJob, 4), bigJob)
			s.Events = []eventsv1.Event{gangEvent("big", "GangRejected", "job team-a/big: planned node r1-n1 was deleted; released all 4 planned members "+gang.PlannedAgainAtOnce, testNow.Add(-time.Second))}
			return s
		}(),
		gang: "job/big", phase: gang.PhaseDropped, bound: "0/4", gpus: 32, message: "planned again at once",
	}, {
		name: "a plan dropped by a timeout: BackingOff",
		snap: func() *Snapshot {
			s := snapshot(nodes, members(bigJob, 4), bigJob)
			s.Events = []eventsv1.Event{gangEvent("big", "GangScheduleTimeout", "job team-a/big: timed out after 1m0s with 3 of 4 members reserved; released all 4 planned members (retry in 5s)", testNow.Add(-time.Second))}
			return s
		}(),
		gang: "job/big", phase: gang.PhaseBackingOff, bound: "0/4", gpus: 32, message: "retry in 5s",
	}, {
		name: "backing off, from the pods' message",
		snap: snapshot(nodes, unschedulable(members(bigJob, 4), "gang team-a/big backs off until 2026-12-02T12:00:05Z after: timed out", testNow), bigJob),
		gang: "job/big", phase: gang.PhaseBackingOff, bound: "0/4", gpus: 32,
	}, {
		name: "Kubernetes PodGroup: the Job's pods are its members, the Job is no gang of its own",
		snap: func() *Snapshot {
			j := job("train", 2, 8).Obj()
			j.Spec.Template.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("train")}
			s := snapshot(nodes, members(j, 2), j)
			s.WorkloadGroups = []schedulingv1beta1.PodGroup{{
				ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "train"},
				Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
					Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}}},
			}}
			return s
		}(),
		gang: "podgroup.scheduling.k8s.io/train", phase: gang.PhasePending, bound: "0/2", gpus: 16,
	}, {
		name: "Job whose pods are another scheduler's is no gang of muster's",
		snap: snapshot(nodes, members(other, 2), other),
		gang: "",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gangs := Gangs(tc.snap, Scope{Namespace: testNS}, DefaultOptions())
			if tc.gang == "" {
				assert.Empty(t, gangs, "no gang expected")
				return
			}
			require.Len(t, gangs, 1, "gangs: %+v", gangs)
			g := gangs[0]
			assert.Equal(t, tc.gang, g.Ref())
			assert.Equal(t, tc.phase, g.Phase, "phase (message %q)", g.Message)
			assert.Equal(t, tc.bound, fmtBound(g), "bound/quorum")
			assert.Equal(t, tc.gpus, g.GPUs, "GPUs")
			assert.Equal(t, tc.domain, g.Domain, "domain")
			assert.Contains(t, g.Message, tc.message)
		})
	}
}

func fmtBound(g Gang) string { return fmt.Sprintf("%d/%d", g.Bound, g.Quorum) }

// Gangs of every namespace are listed namespace by namespace; -n keeps to one.
func TestGangsScope(t *testing.T) {
	a := job("a", 1, 8).Obj()
	b := testobj.MakeJob("team-b", "b").UID("uid-b").Workers(1).PodSpec(testobj.WorkerPodSpec("muster", 8)).Obj()
	snap := snapshot(rackNodes(1, 1, 8), concat(members(a, 1), members(b, 1)), a, b)
	all := Gangs(snap, Scope{AllNamespaces: true}, DefaultOptions())
	require.Len(t, all, 2)
	assert.Equal(t, []string{"team-a", "team-b"}, []string{all[0].Namespace, all[1].Namespace})
	one := Gangs(snap, Scope{Namespace: "team-b"}, DefaultOptions())
	require.Len(t, one, 1)
	assert.Equal(t, "job/b", one[0].Ref())
}
