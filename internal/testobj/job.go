package testobj

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// JobWrapper builds a batch/v1 Job. Methods named after a pod field set it
// in the Job's pod template.
type JobWrapper struct{ batchv1.Job }

// MakeJob starts Job namespace/name with an empty spec.
func MakeJob(namespace, name string) *JobWrapper {
	return &JobWrapper{batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
}

// Obj returns the Job.
func (j *JobWrapper) Obj() *batchv1.Job { return &j.Job }

// TypeMeta sets apiVersion and kind, as a decoded manifest has them.
func (j *JobWrapper) TypeMeta() *JobWrapper {
	j.Job.TypeMeta = metav1.TypeMeta{APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "Job"}
	return j
}

// UID sets the Job's UID.
func (j *JobWrapper) UID(uid string) *JobWrapper { j.ObjectMeta.UID = types.UID(uid); return j }

// Generation sets the Job's generation.
func (j *JobWrapper) Generation(g int64) *JobWrapper { j.ObjectMeta.Generation = g; return j }

// ResourceVersion sets the Job's resource version.
func (j *JobWrapper) ResourceVersion(rv string) *JobWrapper {
	j.ObjectMeta.ResourceVersion = rv
	return j
}

// Created sets the creation timestamp.
func (j *JobWrapper) Created(t time.Time) *JobWrapper {
	j.CreationTimestamp = metav1.NewTime(t)
	return j
}

// Deleting marks the Job as being deleted now, kept by the orphan finalizer.
func (j *JobWrapper) Deleting() *JobWrapper {
	j.DeletionTimestamp = ptr.To(metav1.Now())
	j.Finalizers = []string{metav1.FinalizerOrphanDependents}
	return j
}

// Label sets label k to v on the Job.
func (j *JobWrapper) Label(k, v string) *JobWrapper {
	metav1.SetMetaDataLabel(&j.ObjectMeta, k, v)
	return j
}

// Annotation sets annotation k to v on the Job.
func (j *JobWrapper) Annotation(k, v string) *JobWrapper {
	metav1.SetMetaDataAnnotation(&j.ObjectMeta, k, v)
	return j
}

// Workers sets parallelism and completions to n: n workers run at once,
// muster's gang of a Job.
func (j *JobWrapper) Workers(n int32) *JobWrapper {
	j.Spec.Parallelism, j.Spec.Completions = ptr.To(n), ptr.To(n)
	return j
}

// Resize sets the workers as a spec change does: the generation goes up.
func (j *JobWrapper) Resize(n int32) *JobWrapper {
	j.ObjectMeta.Generation++
	return j.Workers(n)
}

// Parallelism sets parallelism alone.
func (j *JobWrapper) Parallelism(n int32) *JobWrapper { j.Spec.Parallelism = ptr.To(n); return j }

// CompletionMode sets the completion mode.
func (j *JobWrapper) CompletionMode(m batchv1.CompletionMode) *JobWrapper {
	j.Spec.CompletionMode = ptr.To(m)
	return j
}

// Indexed makes the Job Indexed: pod i has completion index i.
func (j *JobWrapper) Indexed() *JobWrapper { return j.CompletionMode(batchv1.IndexedCompletion) }

// BackoffLimit sets how many pod failures the Job retries.
func (j *JobWrapper) BackoffLimit(n int32) *JobWrapper { j.Spec.BackoffLimit = ptr.To(n); return j }

// PodSpec replaces the pod template's spec.
func (j *JobWrapper) PodSpec(spec corev1.PodSpec) *JobWrapper { j.Spec.Template.Spec = spec; return j }

// PodLabel sets label k to v in the pod template.
func (j *JobWrapper) PodLabel(k, v string) *JobWrapper {
	metav1.SetMetaDataLabel(&j.Spec.Template.ObjectMeta, k, v)
	return j
}

// PodAnnotation sets annotation k to v in the pod template (muster.dev/*
// annotations are read from the pods).
func (j *JobWrapper) PodAnnotation(k, v string) *JobWrapper {
	metav1.SetMetaDataAnnotation(&j.Spec.Template.ObjectMeta, k, v)
	return j
}

// SchedulerName sets the scheduler of the Job's pods.
func (j *JobWrapper) SchedulerName(s string) *JobWrapper {
	j.Spec.Template.Spec.SchedulerName = s
	return j
}

// RestartPolicy sets the restart policy of the Job's pods.
func (j *JobWrapper) RestartPolicy(p corev1.RestartPolicy) *JobWrapper {
	j.Spec.Template.Spec.RestartPolicy = p
	return j
}

// Subdomain sets the pods' subdomain: the headless Service that names them.
func (j *JobWrapper) Subdomain(s string) *JobWrapper { j.Spec.Template.Spec.Subdomain = s; return j }

// Container adds a container to the pod template.
func (j *JobWrapper) Container(c corev1.Container) *JobWrapper {
	j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, c)
	return j
}

// ContainerPorts sets the ports of the template's first container.
func (j *JobWrapper) ContainerPorts(ports ...corev1.ContainerPort) *JobWrapper {
	j.Spec.Template.Spec.Containers[0].Ports = ports
	return j
}
