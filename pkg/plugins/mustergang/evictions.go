package mustergang

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	applyv1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/gang"
)

// evictor deletes the victims of gang preemptions, unit by unit, each
// unit marked whole before its first pod is deleted (evict), and after a
// restart finishes the units another run began (resume).
type evictor struct {
	// handle is the profile's: its client, Event recorder and pod lister.
	handle fwk.Handle
	// gangs says whether the plan that waits for the victims is active.
	gangs *gang.Manager
	// source names the units of marked pods and their owners.
	source *gangSource
	// clock paces the retries of a failed deletion.
	clock clock.WithDelayedExecution
	// resumed runs resume once, before this scheduler evicts;
	// resumeDone is closed when the deletions it started are done.
	resumed    sync.Once
	resumeDone chan struct{}
}

// EvictionOperation is the operation label of scheduler_goroutines while
// victims of a gang preemption are being deleted.
const EvictionOperation = "MusterGangEviction"

// evict marks each victim with the DisruptionTarget condition, as
// DefaultPreemption does, and deletes it (with its grace period). The
// victims come unit by unit (a whole gang, or one pod), and a unit is
// deleted whole or left whole: every pod of a unit is marked before the
// first is deleted, so that a scheduler that stops halfway leaves the unit
// marked for the next one to finish (resume). A failed deletion
// is retried, with backoff, for as long as the plan that waits for the
// victims is active and ctx (the scheduler's) lasts. Once the plan is gone
// (its deadline, its preemptor deleted), no further unit is started, but a
// unit of which a pod is already gone is finished: a gang missing a member
// is broken, and its other pods would hold their GPUs for nothing.
func (e *evictor) evict(ctx context.Context, units [][]*v1.Pod, preemptor *v1.Pod, key gang.Key, planID int64) {
	logger := klog.FromContext(ctx).WithValues("gang", key)
	ctx = klog.NewContext(ctx, logger)
	client := e.handle.ClientSet()
	planActive := func() bool {
		plan := e.gangs.Plan(key)
		return plan != nil && plan.ID == planID
	}
	message := preemptionMarker(preemptor.Spec.SchedulerName) + key.Subject()
	for u, unit := range units {
		if !planActive() {
			logger.V(2).Info("The plan waiting for the victims is gone; the victims left are not preempted", "unitsLeft", len(units)-u)
			return
		}
		for _, v := range unit {
			markVictim(ctx, client, v, v1.ConditionTrue, message)
		}
		if !e.deleteUnit(ctx, unit, planActive, false) {
			return
		}
	}
}

// deleteUnit deletes the pods of one victim unit, retrying a failed call
// with backoff while planActive holds. Once it does not, a unit not begun
// (no pod deleted yet) is left whole, its marks set False, and a begun
// one is finished within finishAttempts more failed calls. It reports
// whether every pod is gone.
func (e *evictor) deleteUnit(ctx context.Context, unit []*v1.Pod, planActive func() bool, begun bool) bool {
	logger := klog.FromContext(ctx)
	client := e.handle.ClientSet()
	for k, v := range unit {
		backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 10 * time.Second}
		for failedWithoutPlan := 0; ; {
			err := deleteVictim(ctx, client, v)
			if err == nil {
				logger.V(2).Info("Preempted", "victim", klog.KObj(v))
				break
			}
			evictionErrors.Inc()
			if ctx.Err() != nil {
				return false
			}
			if !planActive() {
				if k == 0 && !begun {
					// Unmarked, so that no scheduler finishes what was
					// called off (resume).
					logger.Error(err, "Could not preempt victim; the plan waiting for it is gone, its unit is left whole", "victim", klog.KObj(v))
					for _, u := range unit {
						markVictim(ctx, client, u, v1.ConditionFalse, "the preemption was called off; the pod is left running")
					}
					return false
				}
				if failedWithoutPlan++; failedWithoutPlan >= finishAttempts {
					logger.Error(err, "Could not preempt the rest of a partly preempted unit; giving up", "victim", klog.KObj(v))
					return false
				}
			}
			logger.Error(err, "Could not preempt victim; retrying", "victim", klog.KObj(v))
			select {
			case <-e.clock.After(backoff.Step()):
			case <-ctx.Done():
				return false
			}
		}
	}
	return true
}

// finishAttempts bounds the failed calls spent on finishing a partly
// preempted unit once its plan is gone: under a minute of backoff.
const finishAttempts = 10

// markVictim sets a victim's DisruptionTarget condition to status, with
// message. A failure is logged, not retried: the deletion says the rest.
func markVictim(ctx context.Context, client kubernetes.Interface, v *v1.Pod, status v1.ConditionStatus, message string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	condition := applyv1.PodCondition().
		WithType(v1.DisruptionTarget).
		WithStatus(status).
		WithReason(v1.PodReasonPreemptionByScheduler).
		WithMessage(message).
		WithLastTransitionTime(metav1.Now())
	// The victim's UID: a pod that has since replaced it under its name is
	// refused the condition (a UID cannot change), as it is the deletion.
	apply := applyv1.Pod(v.Name, v.Namespace).WithUID(v.UID).WithStatus(applyv1.PodStatus().WithConditions(condition))
	if _, err := client.CoreV1().Pods(v.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: "muster-scheduler", Force: true}); err != nil && !apierrors.IsNotFound(err) {
		// Refused for another UID, the deletion's precondition says so too.
		klog.FromContext(ctx).Error(err, "Could not set the DisruptionTarget condition", "victim", klog.KObj(v), "status", status)
	}
}

// deleteVictim deletes one victim; a victim already gone is done.
func deleteVictim(ctx context.Context, client kubernetes.Interface, v *v1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := client.CoreV1().Pods(v.Namespace).Delete(ctx, v.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(v.UID))})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by a pod of the same name (a new UID)
	}
	return err
}

// resume finishes the preemptions a previous run of this
// scheduler began and did not end: it stopped, or lost its lease, between
// marking a victim unit (evict) and deleting the last of its pods. The
// marked pods still carry this profile's DisruptionTarget condition (the
// disruption controller clears one left on a pod not deleted within two
// minutes), and the whole unit they belong to is deleted: a gang half
// deleted is broken, its other pods would hold their GPUs for nothing.
//
// It runs once, when the scheduler's informers have synced, and before
// this scheduler's first victim search (SearchVictims calls it too and
// waits for finished), so the marks it acts on are all another run's. The
// deletions go on in the background; finished, the same channel for every
// caller, is closed when they are done.
func (e *evictor) resume(ctx context.Context) (finished <-chan struct{}) {
	e.resumed.Do(func() {
		done := make(chan struct{})
		e.resumeDone = done
		units := e.begun(ctx)
		if len(units) == 0 {
			close(done)
			return
		}
		evictions := schedmetrics.Goroutines.WithLabelValues(EvictionOperation)
		evictions.Inc()
		go func() {
			defer close(done)
			defer evictions.Dec()
			for _, unit := range units {
				e.deleteUnit(ctx, unit, func() bool { return false }, true)
			}
		}()
	})
	return e.resumeDone
}

// begun lists the victim units another run of this profile began
// to evict (resume), each with an Event on the unit's owner.
func (e *evictor) begun(ctx context.Context) [][]*v1.Pod {
	logger := klog.FromContext(ctx)
	pods, err := e.handle.SharedInformerFactory().Core().V1().Pods().Lister().List(labels.Everything())
	if err != nil {
		logger.Error(err, "Could not list pods to finish the preemptions begun before this scheduler started")
		return nil
	}
	unitOf := func(pod *v1.Pod) gang.Key {
		if key, ok := e.source.victimKey(pod); ok {
			return key
		}
		return gang.LoneKey(pod)
	}
	marker := preemptionMarker(e.handle.ProfileName())
	marked := map[gang.Key]bool{}
	for _, pod := range pods {
		if holdsItsNode(pod) && markedForPreemption(pod, marker) {
			marked[unitOf(pod)] = true
		}
	}
	if len(marked) == 0 {
		return nil
	}
	byKey := map[gang.Key][]*v1.Pod{}
	for _, pod := range pods {
		if key := unitOf(pod); marked[key] && holdsItsNode(pod) {
			byKey[key] = append(byKey[key], pod)
		}
	}
	var units [][]*v1.Pod
	for _, key := range slices.SortedFunc(maps.Keys(byKey), func(a, b gang.Key) int { return strings.Compare(a.String(), b.String()) }) {
		unit := byKey[key]
		logger.Info("Finishing a preemption begun before this scheduler started", "victims", key, "pods", len(unit))
		msg := fmt.Sprintf("finishing the preemption of %d pods that %s began before it restarted", len(unit), e.handle.ProfileName())
		if ref := e.source.ownerRef(key); ref != nil && key.Kind != gang.KindPod {
			e.handle.EventRecorder().Eventf(ref, nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
		} else {
			e.handle.EventRecorder().Eventf(unit[0], nil, v1.EventTypeWarning, ReasonPreempted, "Preempting", "%s", msg)
		}
		units = append(units, unit)
	}
	return units
}

// holdsItsNode reports whether pod is bound and neither finished nor being
// deleted.
func holdsItsNode(pod *v1.Pod) bool {
	return pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil &&
		pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed
}

// markedForPreemption reports whether pod carries the DisruptionTarget
// condition evict gives a victim, with a message that starts with marker.
// preemptionMarker begins the DisruptionTarget message muster writes on the
// victims of a gang's preemption (the subject follows), so that a
// scheduler that restarts finds the preemptions its profile began. Upstream's
// DefaultPreemption writes "<profile>: preempting to accommodate a higher
// priority pod" on its own single victims: a profile with it enabled must
// not have them taken for muster's, whose whole unit resume would delete.
func preemptionMarker(profile string) string {
	return profile + ": muster gang preemption, to accommodate "
}

func markedForPreemption(pod *v1.Pod, marker string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue && c.Reason == v1.PodReasonPreemptionByScheduler &&
			strings.HasPrefix(c.Message, marker) {
			return true
		}
	}
	return false
}
