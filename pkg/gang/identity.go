// Package gang holds muster's gang logic without framework glue: which gang a
// pod belongs to, what the gang asks for (quorum, timeout, topology,
// preemptible policy), the manager of every gang's life and its plan
// (Manager), and the planner that places a whole gang at once.
package gang

import (
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// Pod annotations users write (docs/scheduling.md, sections 1 and 3, and
// docs/preemptible.md).
const (
	AnnotationMinAvailable      = "muster.dev/min-available"
	AnnotationTopologyRequired  = "muster.dev/topology-required"
	AnnotationTopologyPreferred = "muster.dev/topology-preferred"
	AnnotationPreemptible       = "muster.dev/preemptible"
)

// Kind says what defines a gang.
type Kind string

const (
	// KindPodGroup gangs are the pods labelled with a scheduler-plugins
	// PodGroup's name.
	KindPodGroup Kind = "PodGroup"
	// KindWorkloadPodGroup gangs are the pods that join a Kubernetes
	// scheduling.k8s.io PodGroup through spec.schedulingGroup.
	KindWorkloadPodGroup Kind = "PodGroup.scheduling.k8s.io"
	// KindJob gangs are the pods of one batch/v1 Job.
	KindJob Kind = "Job"
	// KindStatefulSet gangs are the pods of one apps/v1 StatefulSet.
	KindStatefulSet Kind = "StatefulSet"
	// KindPod is a pod scheduled alone, when it needs a plan of its own
	// (it preempts).
	KindPod Kind = "Pod"
)

// LoneKey is the key of a pod scheduled alone.
func LoneKey(pod *v1.Pod) Key {
	return Key{Kind: KindPod, Namespace: pod.Namespace, Name: pod.Name}
}

// Key identifies a gang. Gangs never cross namespaces.
type Key struct {
	Kind      Kind
	Namespace string
	Name      string
}

// Subject names the gang in messages people read: "pod ns/name" for a pod
// scheduled alone, "gang <key>" for a gang.
func (k Key) Subject() string {
	if k.Kind == KindPod {
		return "pod " + k.Namespace + "/" + k.Name
	}
	return "gang " + k.String()
}

func (k Key) String() string {
	switch k.Kind {
	case KindJob:
		return k.Namespace + "/" + k.Name
	case KindPod:
		return k.Namespace + "/pod/" + k.Name
	case KindStatefulSet:
		return k.Namespace + "/statefulset/" + k.Name
	case KindWorkloadPodGroup:
		return k.Namespace + "/podgroup.scheduling.k8s.io/" + k.Name
	}
	return k.Namespace + "/podgroup/" + k.Name
}

// KeyOf resolves the gang of a pod: its spec.schedulingGroup (a Kubernetes
// PodGroup) first, then the scheduler-plugins PodGroup label, then a
// controlling batch/v1 Job or apps/v1 StatefulSet; ok is false for a pod
// scheduled alone.
func KeyOf(pod *v1.Pod) (Key, bool) {
	if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil && *g.PodGroupName != "" {
		return Key{Kind: KindWorkloadPodGroup, Namespace: pod.Namespace, Name: *g.PodGroupName}, true
	}
	if name := pod.Labels[v1alpha1.PodGroupLabel]; name != "" {
		return Key{Kind: KindPodGroup, Namespace: pod.Namespace, Name: name}, true
	}
	return ControllerKey(pod)
}

// ControllerKey is the gang of the pod's controlling batch/v1 Job or
// apps/v1 StatefulSet, if it has one.
func ControllerKey(pod *v1.Pod) (Key, bool) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return Key{}, false
	}
	// A pod joins a gang only through an owner in the version muster
	// reads the workload in, as it always has (FuzzKeyOf holds KeyOf to
	// that); OwnerKind accepts any version of the group. Compared as
	// strings: the victim search asks this of every pod of the cluster.
	for _, w := range controllerTypes {
		if ref.Kind == w.kind && ref.APIVersion == w.apiVersion {
			return Key{Kind: w.gang, Namespace: pod.Namespace, Name: ref.Name}, true
		}
	}
	return Key{}, false
}

// controllerType is a workload kind as the strings of an owner reference.
type controllerType struct {
	gang             Kind
	apiVersion, kind string
}

var controllerTypes = func() []controllerType {
	var out []controllerType
	for k, gvk := range workloadTypes {
		out = append(out, controllerType{k, gvk.GroupVersion().String(), gvk.Kind})
	}
	return out
}()

// workloadTypes are the workloads whose pods form a gang through their
// controller owner reference, as the API types muster reads them as.
var workloadTypes = map[Kind]schema.GroupVersionKind{
	KindJob:         batchv1.SchemeGroupVersion.WithKind("Job"),
	KindStatefulSet: appsv1.SchemeGroupVersion.WithKind("StatefulSet"),
}

// GroupVersionKind is the API type of a workload kind: batch/v1 Job for
// KindJob, apps/v1 StatefulSet for KindStatefulSet; the zero value for the
// kinds no workload object stands behind.
func (k Kind) GroupVersionKind() schema.GroupVersionKind {
	return workloadTypes[k]
}

// OwnerKind is the kind of workload an owner reference (its apiVersion and
// kind) points at: KindJob for a batch Job, KindStatefulSet for an apps
// StatefulSet; ok is false for any other owner. The version is not compared:
// an owner reference names an object, and the object is the same in every
// version its group serves.
func OwnerKind(apiVersion, kind string) (Kind, bool) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return "", false
	}
	for k, gvk := range workloadTypes {
		if gv.Group == gvk.Group && kind == gvk.Kind {
			return k, true
		}
	}
	return "", false
}

// StatefulSetQuorum is the gang size of a StatefulSet: spec.replicas (at
// least 1), lowered by the pod's muster.dev/min-available annotation. With
// podManagementPolicy OrderedReady (the default) the StatefulSet controller
// creates one pod at a time and waits for it to be Ready, so no gang can
// ever form: the quorum is 1 (each pod is placed as it comes, next to its
// running siblings when they fit) and orderedReady says so.
func StatefulSetQuorum(sts *appsv1.StatefulSet, pod *v1.Pod) (quorum int, orderedReady bool, err error) {
	replicas := 1
	if sts.Spec.Replicas != nil {
		replicas = max(int(*sts.Spec.Replicas), 1)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		return 1, true, nil
	}
	n, err := MinAvailable(pod, replicas, "the StatefulSet has %d replicas")
	switch {
	case err != nil:
		return 0, false, err
	case n == 0:
		return replicas, false, nil
	}
	return n, false, nil
}

// MinAvailable reads the pod's muster.dev/min-available annotation: 0 when
// it has none, an error when it is not a positive integer or exceeds limit
// (limitWhy, with limit in it, says why that is the limit).
func MinAvailable(pod *v1.Pod, limit int, limitWhy string) (int, error) {
	value, ok := pod.Annotations[AnnotationMinAvailable]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("invalid %s %q: must be a positive integer", AnnotationMinAvailable, value)
	}
	if n > limit {
		return 0, fmt.Errorf("invalid %s %d: "+limitWhy, AnnotationMinAvailable, n, limit)
	}
	return n, nil
}

// JobQuorum is the gang size of a Job: parallelism, capped by the
// completions still to go (succeeded pods, and indexes that failed for good
// under backoffLimitPerIndex, are never waited for), at least 1, lowered by
// the pod's muster.dev/min-available annotation.
func JobQuorum(job *batchv1.Job, pod *v1.Pod) (int, error) {
	parallelism := 1
	if job.Spec.Parallelism != nil {
		parallelism = int(*job.Spec.Parallelism)
	}
	size := parallelism
	if job.Spec.Completions != nil {
		remaining := int(*job.Spec.Completions - job.Status.Succeeded)
		if job.Spec.BackoffLimitPerIndex != nil && job.Status.FailedIndexes != nil {
			remaining -= countIndexes(*job.Status.FailedIndexes)
		}
		size = min(size, remaining)
	}
	size = max(size, 1)
	n, err := MinAvailable(pod, max(parallelism, 1), "the Job runs at most %d pods at once (parallelism)")
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return size, nil
	}
	// Fewer members remain than min-available asked for: all of them.
	return min(n, size), nil
}

// countIndexes counts the indexes in a Job's interval list ("1,3-5").
// Malformed parts count as nothing: the Job controller writes this field.
func countIndexes(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		if part == "" {
			continue
		}
		first, last, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(first)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(last)
		}
		if err1 == nil && err2 == nil && b >= a {
			n += b - a + 1
		}
	}
	return n
}

// Constraints are a gang's placement wishes, read from a member's annotations.
type Constraints struct {
	Required  string
	Preferred string
	Policy    Policy
}

// NarrowerLevel is the tighter of two topology levels (levels are listed
// tightest first); an empty name is no constraint.
func NarrowerLevel(levels []Level, a, b string) string {
	if a == "" || a == b {
		return b
	}
	if b == "" {
		return a
	}
	for _, l := range levels {
		if l.Name == a || l.Name == b {
			return l.Name
		}
	}
	return a
}

// ConstraintsFromPod parses the topology and preemptible annotations and
// checks level names against the configured levels.
func ConstraintsFromPod(pod *v1.Pod, levels []Level) (Constraints, error) {
	var c Constraints
	var err error
	if c.Policy, err = ParsePolicy(pod.Annotations[AnnotationPreemptible]); err != nil {
		return c, err
	}
	known := func(key string) (string, error) {
		value := pod.Annotations[key]
		if value == "" {
			return "", nil
		}
		for _, l := range levels {
			if l.Name == value {
				return value, nil
			}
		}
		return "", fmt.Errorf("invalid %s %q: unknown topology level (known: %s)", key, value, levelNames(levels))
	}
	if c.Required, err = known(AnnotationTopologyRequired); err != nil {
		return c, err
	}
	if c.Preferred, err = known(AnnotationTopologyPreferred); err != nil {
		return c, err
	}
	return c, nil
}
