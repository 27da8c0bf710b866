package testobj

import (
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// JobWrapper builds a batch/v1 Job. Methods named after a pod field set it
// in the Job's pod template.
type JobWrapper struct {
	batchv1.Job
	objectMeta[*JobWrapper]
	podTemplate[*JobWrapper]
}

// MakeJob starts Job namespace/name with an empty spec.
func MakeJob(namespace, name string) *JobWrapper {
	j := &JobWrapper{Job: batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}}
	j.objectMeta = newObjectMeta(j, &j.ObjectMeta)
	j.podTemplate = newPodTemplate(j, &j.Spec.Template)
	return j
}

// Obj returns the Job.
func (j *JobWrapper) Obj() *batchv1.Job { return &j.Job }

// TypeMeta sets apiVersion and kind, as a decoded manifest has them.
func (j *JobWrapper) TypeMeta() *JobWrapper {
	j.Job.TypeMeta = metav1.TypeMeta{APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "Job"}
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
