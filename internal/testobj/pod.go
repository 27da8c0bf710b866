package testobj

import (
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// PodWrapper builds a Pod.
type PodWrapper struct {
	corev1.Pod
	objectMeta[*PodWrapper]
}

// MakePod starts pod namespace/name with an empty spec.
func MakePod(namespace, name string) *PodWrapper {
	p := &PodWrapper{Pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
	p.objectMeta = newObjectMeta(p, &p.ObjectMeta)
	return p
}

// Obj returns the Pod.
func (p *PodWrapper) Obj() *corev1.Pod { return &p.Pod }

// OwnedByJob sets the pod's one owner reference: a controller reference to
// Job name (uid may be empty), which makes it a member of the Job's gang.
func (p *PodWrapper) OwnedByJob(name string, uid types.UID) *PodWrapper {
	p.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "Job", Name: name, UID: uid, Controller: ptr.To(true),
	}}
	return p
}

// JobMember makes the pod worker index of job as the Job controller marks
// it: a blocking controller reference, the job-name and controller-uid
// labels and the completion-index annotation.
func (p *PodWrapper) JobMember(job *batchv1.Job, index int) *PodWrapper {
	p.OwnedByJob(job.Name, job.UID)
	p.OwnerReferences[0].BlockOwnerDeletion = ptr.To(true)
	return p.Label(batchv1.JobNameLabel, job.Name).Label(batchv1.ControllerUidLabel, string(job.UID)).
		Annotation(batchv1.JobCompletionIndexAnnotation, strconv.Itoa(index))
}

// PodSpec replaces the spec, but for a node set earlier by Node that spec
// leaves empty: MakePod(...).Node(n).PodSpec(s) is a pod bound to n. (It
// was not, and every "background" of the integration tests stayed pending
// and unscheduled until 2026-12-07.)
func (p *PodWrapper) PodSpec(spec corev1.PodSpec) *PodWrapper {
	if spec.NodeName == "" {
		spec.NodeName = p.Spec.NodeName
	}
	p.Spec = spec
	return p
}

// SchedulerName sets the scheduler that places the pod.
func (p *PodWrapper) SchedulerName(s string) *PodWrapper { p.Spec.SchedulerName = s; return p }

// Node binds the pod to node ("" leaves it pending).
func (p *PodWrapper) Node(node string) *PodWrapper { p.Spec.NodeName = node; return p }

// Priority sets the pod's priority, as admission resolves it from its class.
func (p *PodWrapper) Priority(priority int32) *PodWrapper {
	p.Spec.Priority = ptr.To(priority)
	return p
}

// RestartPolicy sets the restart policy.
func (p *PodWrapper) RestartPolicy(policy corev1.RestartPolicy) *PodWrapper {
	p.Spec.RestartPolicy = policy
	return p
}

// SchedulingGate adds a scheduling gate.
func (p *PodWrapper) SchedulingGate(name string) *PodWrapper {
	p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: name})
	return p
}

// PodGroup puts the pod in native (workload API) PodGroup name.
func (p *PodWrapper) PodGroup(name string) *PodWrapper {
	p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(name)}
	return p
}

// Affinity sets the pod's affinity.
func (p *PodWrapper) Affinity(a *corev1.Affinity) *PodWrapper { p.Spec.Affinity = a; return p }

// Container adds a container.
func (p *PodWrapper) Container(c corev1.Container) *PodWrapper {
	p.Spec.Containers = append(p.Spec.Containers, c)
	return p
}

// Phase sets the pod's status phase.
func (p *PodWrapper) Phase(phase corev1.PodPhase) *PodWrapper { p.Status.Phase = phase; return p }
