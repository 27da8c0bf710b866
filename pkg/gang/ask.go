package gang

import (
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// Ask is what a gang's owner object asks of the gang, read for one of its
// pods: the scheduler and kubectl muster read it the same way (AskOf).
type Ask struct {
	// Quorum is how many members are placed together.
	Quorum int
	// Timeout is the owner's own plan deadline (a scheduler-plugins
	// PodGroup's scheduleTimeoutSeconds); zero leaves the default.
	Timeout time.Duration
	// Required is a topology level the owner itself requires (a Kubernetes
	// PodGroup's schedulingConstraints), beside the members' annotations.
	Required string
	// NoGang explains why the owner's pods can never form a gang; each is
	// then placed as it comes.
	NoGang string
}

// AskOf reads what owner asks of pod's gang. owner is the gang's Job,
// StatefulSet, scheduler-plugins PodGroup, or Kubernetes PodGroup of the
// gang policy (one of the basic policy is no gang: its pods are their
// controller's). succeeded counts the members known to have finished
// successfully, beyond what a PodGroup's status says: they count toward
// the quorum. An error explains an owner muster cannot serve as asked.
func AskOf(owner runtime.Object, pod *v1.Pod, levels []Level, succeeded int) (Ask, error) {
	switch o := owner.(type) {
	case *batchv1.Job:
		q, err := JobQuorum(o, pod)
		return Ask{Quorum: q}, err
	case *appsv1.StatefulSet:
		q, orderedReady, err := StatefulSetQuorum(o, pod)
		if err != nil {
			return Ask{}, err
		}
		ask := Ask{Quorum: q}
		if replicas := ptr.Deref(o.Spec.Replicas, 1); orderedReady && replicas > 1 {
			ask.NoGang = fmt.Sprintf("StatefulSet %s has podManagementPolicy OrderedReady: its controller creates one pod at a time and waits for it to be Ready, "+
				"so its %d pods can never be placed as one gang; muster places each as it comes, next to its siblings when they fit. "+
				"Set podManagementPolicy: Parallel for a gang", o.Name, replicas)
		}
		return ask, nil
	case *v1alpha1.PodGroup:
		if o.Spec.MinMember < 1 {
			return Ask{}, fmt.Errorf("PodGroup spec.minMember must be at least 1, got %d", o.Spec.MinMember)
		}
		// Members that finished successfully leave the cluster's live pods
		// but still count: the rest are not held waiting for them.
		done := max(int(o.Status.Succeeded), succeeded)
		ask := Ask{Quorum: max(int(o.Spec.MinMember)-done, 1)}
		if t := o.Spec.ScheduleTimeoutSeconds; t != nil && *t > 0 {
			ask.Timeout = time.Duration(*t) * time.Second
		}
		return ask, nil
	case *schedulingv1beta1.PodGroup:
		return askOfWorkloadGroup(o, pod, levels)
	}
	return Ask{}, fmt.Errorf("a %T defines no gang", owner)
}

// askOfWorkloadGroup: the quorum is gang.minCount, lowered by the member's
// muster.dev/min-available; the topology levels its schedulingConstraints
// name are required.
func askOfWorkloadGroup(pg *schedulingv1beta1.PodGroup, pod *v1.Pod, levels []Level) (Ask, error) {
	policy := pg.Spec.SchedulingPolicy.Gang
	if policy == nil {
		return Ask{}, fmt.Errorf("PodGroup %s has the basic policy: its pods are no gang of their own", pg.Name)
	}
	if policy.MinCount < 1 {
		return Ask{}, fmt.Errorf("PodGroup spec.schedulingPolicy.gang.minCount must be at least 1, got %d", policy.MinCount)
	}
	ask := Ask{Quorum: int(policy.MinCount)}
	n, err := MinAvailable(pod, ask.Quorum, "the PodGroup's gang.minCount is %d")
	if err != nil {
		return Ask{}, err
	}
	if n > 0 {
		ask.Quorum = n
	}
	if c := pg.Spec.SchedulingConstraints; c != nil {
		for _, t := range c.Topology {
			level, found := levelOfLabel(levels, t.Key)
			if !found {
				return Ask{}, fmt.Errorf("PodGroup spec.schedulingConstraints.topology key %q is no topology level's nodeLabel (levels: %s); add a level with nodeLabel %s to MusterGang's topologyLevels",
					t.Key, describeLevels(levels), t.Key)
			}
			ask.Required = NarrowerLevel(levels, ask.Required, level)
		}
	}
	return ask, nil
}

// levelOfLabel is the level whose nodes carry label.
func levelOfLabel(levels []Level, label string) (string, bool) {
	for _, l := range levels {
		if l.Label == label {
			return l.Name, true
		}
	}
	return "", false
}

// describeLevels lists the levels and where each is read.
func describeLevels(levels []Level) string {
	var parts []string
	for _, l := range levels {
		source := l.Label
		if source == "" {
			source = "device attribute " + l.Attribute
		}
		parts = append(parts, l.Name+"="+source)
	}
	return strings.Join(parts, ", ")
}
