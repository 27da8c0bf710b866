package kubectlmuster

import (
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// The tests' clock: objects are made relative to it.
var testNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const testNS = "team-a"

// rackNodes is racks × perRack Ready nodes of gpus GPUs, r<rack>-n<node>, all
// in zone z1.
func rackNodes(racks, perRack int, gpus int64) []corev1.Node {
	var out []corev1.Node
	for _, n := range testobj.Cluster(racks, perRack, 1, gpus) {
		out = append(out, *n)
	}
	return out
}

// job is an Indexed Job of muster workers of gpus GPUs each.
func job(name string, workers int32, gpus int64) *testobj.JobWrapper {
	return testobj.MakeJob(testNS, name).UID("uid-" + name).Indexed().Workers(workers).
		PodSpec(testobj.WorkerPodSpec("muster", gpus)).Created(testNow.Add(-time.Hour))
}

// members are the Job's pods 0..n-1, pending; bind puts member i on
// nodes[i] when given.
func members(j *batchv1.Job, n int, nodes ...string) []corev1.Pod {
	var out []corev1.Pod
	for i := range n {
		p := testobj.MakePod(j.Namespace, fmt.Sprintf("%s-%d", j.Name, i)).UID(fmt.Sprintf("%s-uid-%d", j.Name, i)).
			JobMember(j, i).PodSpec(*j.Spec.Template.Spec.DeepCopy()).Created(testNow.Add(-time.Hour))
		for k, v := range j.Spec.Template.Annotations {
			p.Annotation(k, v)
		}
		if i < len(nodes) {
			p.Node(nodes[i])
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(testNow.Add(-30 * time.Minute))}}
		}
		if j.Spec.Template.Spec.Priority != nil {
			p.Priority(*j.Spec.Template.Spec.Priority)
		}
		out = append(out, *p.Obj())
	}
	return out
}

// nominated nominates pod i to nodes[i], as a member allowed at Permit
// and binding is.
func nominated(pods []corev1.Pod, nodes ...string) []corev1.Pod {
	for i := range pods {
		if i < len(nodes) {
			pods[i].Status.NominatedNodeName = nodes[i]
		}
	}
	return pods
}

// unschedulable marks pods PodScheduled=False with msg since at.
func unschedulable(pods []corev1.Pod, msg string, at time.Time) []corev1.Pod {
	for i := range pods {
		pods[i].Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: msg, LastTransitionTime: metav1.NewTime(at)}}
	}
	return pods
}

// gangEvent is an Event of muster's about a Job.
func gangEvent(jobName, reason, note string, at time.Time) eventsv1.Event {
	return eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: jobName + "." + reason, CreationTimestamp: metav1.NewTime(at)},
		EventTime:  metav1.NewMicroTime(at),
		Regarding:  corev1.ObjectReference{APIVersion: "batch/v1", Kind: "Job", Namespace: testNS, Name: jobName},
		Reason:     reason, Note: note, ReportingController: "muster", Action: "Scheduling", Type: corev1.EventTypeWarning,
	}
}

// podGroup is a scheduler-plugins PodGroup and pods of gpus GPUs in it.
func podGroup(name string, minMember int32, pods int, gpus int64) (v1alpha1.PodGroup, []corev1.Pod) {
	pg := v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID("uid-" + name)},
		Spec: v1alpha1.PodGroupSpec{MinMember: minMember}}
	var out []corev1.Pod
	for i := range pods {
		out = append(out, *testobj.MakePod(testNS, fmt.Sprintf("%s-%d", name, i)).UID(fmt.Sprintf("%s-uid-%d", name, i)).
			Label(v1alpha1.PodGroupLabel, name).PodSpec(testobj.WorkerPodSpec("muster", gpus)).Created(testNow.Add(-time.Minute)).Obj())
	}
	return pg, out
}

// snapshot assembles a snapshot read at testNow; PVCs count as read.
func snapshot(nodes []corev1.Node, pods []corev1.Pod, jobs ...*batchv1.Job) *Snapshot {
	s := &Snapshot{Now: testNow, Nodes: nodes, Pods: pods, AllPods: true, PVCsRead: true}
	for _, j := range jobs {
		s.Jobs = append(s.Jobs, *j)
	}
	return s
}

func concat(lists ...[]corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}
