package gang

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// Owners reads the objects gangs are defined by, from wherever the reader
// keeps them: the scheduler from its informers, kubectl muster from its
// snapshot. A missing object is an error for which apierrors.IsNotFound
// holds; any other error is the reader's own explanation.
type Owners interface {
	Job(namespace, name string) (*batchv1.Job, error)
	StatefulSet(namespace, name string) (*appsv1.StatefulSet, error)
	// PodGroup is a scheduler-plugins PodGroup.
	PodGroup(namespace, name string) (*v1alpha1.PodGroup, error)
	// WorkloadPodGroup is a Kubernetes scheduling.k8s.io PodGroup.
	WorkloadPodGroup(namespace, name string) (*schedulingv1beta1.PodGroup, error)
}

// OwnerOf reads the object that defines gang key: its Job, StatefulSet, or
// PodGroup of either API.
func OwnerOf(key Key, owners Owners) (runtime.Object, error) {
	var (
		obj  runtime.Object
		err  error
		kind string
	)
	ns, name := key.Namespace, key.Name
	switch key.Kind {
	case KindJob:
		kind = "Job"
		obj, err = found(owners.Job(ns, name))
	case KindStatefulSet:
		kind = "StatefulSet"
		obj, err = found(owners.StatefulSet(ns, name))
	case KindPodGroup:
		kind = "PodGroup"
		obj, err = found(owners.PodGroup(ns, name))
	case KindWorkloadPodGroup:
		kind = "PodGroup"
		obj, err = found(owners.WorkloadPodGroup(ns, name))
	default:
		return nil, fmt.Errorf("gang %s has no owner object", key)
	}
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("gang %s: %s %s not found in namespace %s", key, kind, key.Name, key.Namespace)
	}
	return obj, err
}

// found is what a reader returned, as a runtime.Object only when it was
// read: a nil pointer in a runtime.Object is no nil interface.
func found[T runtime.Object](obj T, err error) (runtime.Object, error) {
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// Resolved is a pod's gang and what its owner asks of it.
type Resolved struct {
	Key Key
	// OwnerKey is the gang whose object defines the quorum and speaks for
	// the pods to users: Key itself, or for a Kubernetes PodGroup of the
	// basic policy its pods' controller.
	OwnerKey Key
	// Owner is the object that defines the quorum (nil when it could not
	// be read): the gang's own, or for a Kubernetes PodGroup of the basic
	// policy the Job or StatefulSet that made it.
	Owner runtime.Object
	// Group is the Kubernetes PodGroup of a pod that joins one, read even
	// when its Owner could not be.
	Group *schedulingv1beta1.PodGroup
	// Ref is the object Events about the gang are recorded on: its Owner,
	// or its Group when the Owner cannot be read; nil when neither can.
	// OwnerUID is the Owner's UID (empty when it cannot be read), so that
	// a record written later never lands on an object recreated under its
	// name.
	Ref      *v1.ObjectReference
	OwnerUID types.UID
	// Constraints are the pod's own placement annotations, read for every
	// pod, in a gang or alone.
	Constraints Constraints
	// Ask is what the Owner asks; Resolver.Resolve sets its Timeout to the
	// plan deadline in force (the default when the owner sets none). Its
	// Quorum is 0 exactly when the ask could not be read.
	Ask
}

// MaxPlanTimeout is the longest plan deadline: the framework cuts a Permit
// wait there.
const MaxPlanTimeout = 15 * time.Minute

// Resolver finds pods' gangs and reads what their owners ask. The
// scheduler and kubectl muster resolve the same way.
type Resolver struct {
	Owners Owners
	Levels []Level
	// Succeeded, when not nil, counts the members of a scheduler-plugins
	// PodGroup known to have finished (AskOf).
	Succeeded func(Key) int
	// DefaultTimeout is a plan's deadline unless the owner sets one.
	DefaultTimeout time.Duration
}

// Resolve finds pod's gang (KeyOf) and reads what its owner asks (AskOf),
// with the pod's own placement annotations (ConstraintsFromPod). A
// Kubernetes PodGroup of the basic policy (with WorkloadWithJob every Job
// gets one) asks nothing itself: its pods' quorum is their controller's,
// and a pod without one is scheduled alone. ok is false for a pod
// scheduled alone; err explains an invalid annotation (of any pod) or a
// gang that cannot be served yet or at all, with r.Key set. The pod's own
// annotations are explained first.
func (rs Resolver) Resolve(pod *v1.Pod) (r Resolved, ok bool, err error) {
	c, cErr := ConstraintsFromPod(pod, rs.Levels)
	r, ok, err = rs.gangOf(pod)
	r.Constraints = c
	if r.Ref = Reference(r.Owner); r.Ref != nil {
		r.OwnerUID = r.Ref.UID
	} else if r.Group != nil {
		r.Ref = Reference(r.Group)
	}
	if r.Timeout == 0 {
		r.Timeout = rs.DefaultTimeout
	}
	r.Timeout = min(r.Timeout, MaxPlanTimeout)
	if cErr != nil {
		return r, ok, cErr
	}
	return r, ok, err
}

// gangOf is Resolve without the pod's annotations.
func (rs Resolver) gangOf(pod *v1.Pod) (r Resolved, ok bool, err error) {
	if r.Key, ok = KeyOf(pod); !ok {
		return r, false, nil
	}
	r.OwnerKey = r.Key
	if r.Owner, err = OwnerOf(r.Key, rs.Owners); err != nil {
		return r, true, err
	}
	if pg, isGroup := r.Owner.(*schedulingv1beta1.PodGroup); isGroup {
		r.Group = pg
		if pg.Spec.SchedulingPolicy.Gang == nil {
			controller, owned := ControllerKey(pod)
			if !owned {
				return r, false, nil
			}
			r.OwnerKey = controller
			if r.Owner, err = OwnerOf(controller, rs.Owners); err != nil {
				return r, true, err
			}
		}
	}
	done := 0
	if _, isGroup := r.Owner.(*v1alpha1.PodGroup); isGroup && rs.Succeeded != nil {
		done = rs.Succeeded(r.Key)
	}
	if r.Ask, err = AskOf(r.Owner, pod, rs.Levels, done); err != nil {
		return r, true, fmt.Errorf("gang %s: %w", r.Key, err)
	}
	return r, true, nil
}

// Reference refers to a gang's owner object (or a pod scheduled alone),
// for Events; nil for anything else.
func Reference(obj runtime.Object) *v1.ObjectReference {
	ref := func(apiVersion, kind string, m metav1.Object) *v1.ObjectReference {
		return &v1.ObjectReference{APIVersion: apiVersion, Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName(), UID: m.GetUID()}
	}
	switch o := obj.(type) {
	case *v1.Pod:
		return ref("v1", "Pod", o)
	case *batchv1.Job:
		return ref("batch/v1", "Job", o)
	case *appsv1.StatefulSet:
		return ref("apps/v1", "StatefulSet", o)
	case *v1alpha1.PodGroup:
		return ref(v1alpha1.SchemeGroupVersion.String(), "PodGroup", o)
	case *schedulingv1beta1.PodGroup:
		return ref(schedulingv1beta1.SchemeGroupVersion.String(), "PodGroup", o)
	}
	return nil
}
