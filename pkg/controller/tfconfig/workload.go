package tfconfig

import (
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/muster-sched/muster/pkg/gang"
)

// workload is what the controller serves: an opted-in batch/v1 Job or apps/v1 StatefulSet. What
// differs between the two kinds is behind this interface, so there is one reconcile path for both.
//
// Pod i of either kind has the hostname <name>-<i> and the subdomain serviceName(); it learns i from
// the downward API: a Job's pod from the annotation batch.kubernetes.io/job-completion-index, a
// StatefulSet's from the label apps.kubernetes.io/pod-index (docs/tfconfig.md).
type workload interface {
	metav1.Object
	// object is the Job or StatefulSet itself, for Events (the recorder looks its kind up by type).
	object() runtime.Object
	kind() gang.Kind
	// serviceName is the headless Service that gives the pods their DNS names: a Job's pod template
	// subdomain, a StatefulSet's spec.serviceName.
	serviceName() string
	// podSelector selects the workload's pods; the Service the controller creates uses it.
	podSelector() map[string]string
	// podLabels are labels every pod of the workload carries.
	podLabels() map[string]string
	// taskSet checks that the workload can be one role of a TensorFlow cluster and returns its tasks.
	// Errors are *InvalidError whose message says how to fix the workload.
	taskSet() (TaskSet, error)
}

// workloadKinds are the kinds of workload the controller serves, in the order it looks them up.
var workloadKinds = []gang.Kind{gang.KindJob, gang.KindStatefulSet}

// keyOf is the work item of a workload. The kind is part of it because a Job and a StatefulSet may
// have the same name.
func keyOf(w workload) gang.Key {
	return gang.Key{Kind: w.kind(), Namespace: w.GetNamespace(), Name: w.GetName()}
}

// itemName names a work item in logs as kind/namespace/name: gang.Key's String leaves a Job's kind out.
func itemName(k gang.Key) string { return string(k.Kind) + "/" + k.Namespace + "/" + k.Name }

// asWorkload wraps an informer object (or the last state of a deleted one) as a workload.
func asWorkload(obj any) (workload, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case *batchv1.Job:
		return jobWorkload{o}, true
	case *appsv1.StatefulSet:
		return statefulSetWorkload{o}, true
	}
	return nil, false
}

// jobWorkload is an Indexed Job: one pod per completion index, all running at once.
type jobWorkload struct{ *batchv1.Job }

func (j jobWorkload) object() runtime.Object { return j.Job }
func (j jobWorkload) kind() gang.Kind        { return gang.KindJob }
func (j jobWorkload) serviceName() string    { return j.Spec.Template.Spec.Subdomain }

// podSelector uses the labels the API server puts on every Job's pod template: the Job's name, and
// its UID so that the pods of an earlier Job of that name, orphaned or still terminating (a headless
// Service publishes terminating pods too), do not answer for the same hostnames. A Job with a manual
// selector has no UID label; its name is all there is.
func (j jobWorkload) podSelector() map[string]string {
	selector := map[string]string{batchv1.JobNameLabel: j.Name}
	if uid, ok := j.Spec.Template.Labels[batchv1.ControllerUidLabel]; ok && uid == string(j.UID) {
		selector[batchv1.ControllerUidLabel] = uid
	}
	return selector
}

func (j jobWorkload) podLabels() map[string]string {
	l := maps.Clone(j.Spec.Template.Labels)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, j.podSelector())
	return l
}

func (j jobWorkload) taskSet() (TaskSet, error) {
	role, err := roleOf(j)
	if err != nil {
		return TaskSet{}, err
	}
	if j.Spec.CompletionMode == nil || *j.Spec.CompletionMode != batchv1.IndexedCompletion {
		return TaskSet{}, invalidf(ReasonNotIndexed, "Job is not Indexed: set spec.completionMode: Indexed so each pod gets a stable index and the hostname %s-<index>", j.Name)
	}
	// The API server defaults parallelism to 1 and requires completions for Indexed Jobs.
	parallelism, completions := int32(1), int32(-1)
	if j.Spec.Parallelism != nil {
		parallelism = *j.Spec.Parallelism
	}
	if j.Spec.Completions != nil {
		completions = *j.Spec.Completions
	}
	if parallelism != completions {
		return TaskSet{}, invalidf(ReasonParallelismMismatch, "spec.parallelism (%d) differs from spec.completions (%s): every TensorFlow task must run at once, so set both to the number of tasks (change them together to resize)", parallelism, optionalInt(j.Spec.Completions))
	}
	return checkedTaskSet(j, &j.Spec.Template.Spec, role, completions)
}

// statefulSetWorkload is a StatefulSet: pods <name>-0 … <name>-<replicas-1>, which run until deleted.
type statefulSetWorkload struct{ *appsv1.StatefulSet }

func (s statefulSetWorkload) object() runtime.Object { return s.StatefulSet }
func (s statefulSetWorkload) kind() gang.Kind        { return gang.KindStatefulSet }
func (s statefulSetWorkload) serviceName() string    { return s.Spec.ServiceName }

// podSelector is the StatefulSet's own selector (immutable, so the Service never has to follow a
// change); its matchLabels, or the template's labels when it selects by expressions only.
func (s statefulSetWorkload) podSelector() map[string]string {
	if s.Spec.Selector != nil && len(s.Spec.Selector.MatchLabels) > 0 {
		return maps.Clone(s.Spec.Selector.MatchLabels)
	}
	return s.podLabels()
}

func (s statefulSetWorkload) podLabels() map[string]string {
	l := maps.Clone(s.Spec.Template.Labels)
	if l == nil {
		l = map[string]string{}
	}
	return l
}

func (s statefulSetWorkload) taskSet() (TaskSet, error) {
	role, err := roleOf(s)
	if err != nil {
		return TaskSet{}, err
	}
	// TensorFlow's task indexes start at 0, and the pod-index label is the ordinal.
	if s.Spec.Ordinals != nil && s.Spec.Ordinals.Start != 0 {
		return TaskSet{}, invalidf(ReasonInvalidOrdinals, "spec.ordinals.start is %d, so the pods' index labels start at %d, but TensorFlow's task indexes start at 0: remove spec.ordinals", s.Spec.Ordinals.Start, s.Spec.Ordinals.Start)
	}
	replicas := int32(1) // the API server's default
	if s.Spec.Replicas != nil {
		replicas = *s.Spec.Replicas
	}
	if replicas == 0 {
		return TaskSet{}, invalidf(ReasonScaledToZero, "StatefulSet %s has 0 replicas: its Secret is left as it is until it is scaled up", s.Name)
	}
	return checkedTaskSet(s, &s.Spec.Template.Spec, role, replicas)
}

// checkedTaskSet is the task set of workload w, whose pods run spec, with the given role and number of
// tasks, checked as the cluster builder checks it, so that a bad workload is reported as itself and not
// as "the group".
func checkedTaskSet(w workload, spec *corev1.PodSpec, role Role, replicas int32) (TaskSet, error) {
	port, err := tfPort(spec)
	if err != nil {
		return TaskSet{}, err
	}
	ts := TaskSet{
		Kind:      string(w.kind()),
		Role:      role,
		JobName:   w.GetName(),
		Subdomain: w.serviceName(),
		Port:      port,
		Replicas:  replicas,
	}
	if err := validateTaskSet(ts); err != nil {
		return TaskSet{}, err
	}
	return ts, nil
}
