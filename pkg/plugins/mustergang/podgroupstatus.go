package mustergang

import (
	"context"
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// statusWriter keeps PodGroup status in line with the gang, off the
// scheduling path: gangs are queued by key (changes within statusDelay
// coalesce) and written by one worker, only when the status differs.
type statusWriter struct {
	source *gangSource
	gangs  *gang.Manager
	queue  workqueue.TypedRateLimitingInterface[gang.Key]
}

func newStatusWriter(source *gangSource, gangs *gang.Manager) *statusWriter {
	return &statusWriter{source: source, gangs: gangs, queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[gang.Key](),
		workqueue.TypedRateLimitingQueueConfig[gang.Key]{Name: "muster-podgroup-status"})}
}

// statusDelay gathers the changes of a gang's members that come together
// (a released gang binds all of them within milliseconds) into one status
// write instead of one per member.
const statusDelay = 500 * time.Millisecond

func (w *statusWriter) enqueue(key gang.Key) {
	if key.Kind == gang.KindPodGroup && w.source.pgClient != nil {
		w.queue.AddAfter(key, statusDelay)
	}
}

func (w *statusWriter) run(ctx context.Context) {
	runGangQueue(ctx, w.queue, "Updating PodGroup status", 0, w.sync)
}

func (w *statusWriter) sync(ctx context.Context, key gang.Key) error {
	src := w.source
	obj, err := src.podGroups.ByNamespace(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pg, err := v1alpha1.FromUnstructured(obj)
	if err != nil {
		return err
	}
	status := *pg.DeepCopy()
	desired := &status.Status
	set := src.members(key)
	members := gang.MemberCounts{Total: set.total, Bound: set.bound(),
		Succeeded: int(max(pg.Status.Succeeded, int32(w.gangs.Succeeded(key))))}
	objs, _ := src.pods.ByIndex(src.gangIndex, key.String())
	for _, o := range objs {
		if o.(*v1.Pod).Status.Phase == v1.PodRunning {
			members.Running++
		}
	}
	plan := w.gangs.Plan(key)
	phase, keep := gang.PodGroupPhase(pg.Status.Phase, int(pg.Spec.MinMember), members, plan != nil)
	desired.Succeeded = int32(members.Succeeded)
	if keep {
		// The members left the informer (finished or deleted): the last
		// state stands, with the count of those that succeeded.
		if desired.Succeeded == pg.Status.Succeeded {
			return nil
		}
		return w.update(ctx, &status)
	}
	desired.Phase = phase
	desired.Scheduled, desired.Running = int32(members.Bound), int32(members.Running)
	if plan != nil && desired.ScheduleStartTime == nil {
		desired.ScheduleStartTime = &metav1.Time{Time: plan.Created}
	}
	outcome, message := w.gangs.LastNotice(key)
	cond := metav1.Condition{Type: "Scheduled", Status: metav1.ConditionFalse, Reason: outcome.Reason(), Message: message, ObservedGeneration: pg.Generation}
	if phase == v1alpha1.PodGroupScheduled || phase == v1alpha1.PodGroupRunning || phase == v1alpha1.PodGroupSucceeded {
		cond.Status = metav1.ConditionTrue
		if outcome != gang.OutcomeScheduled {
			cond.Reason, cond.Message = gang.OutcomeScheduled.Reason(), "gang reached its quorum of bound members"
		}
	}
	if cond.Reason == "" {
		cond.Reason, cond.Message = "Pending", "gang not planned yet"
	}
	meta.SetStatusCondition(&desired.Conditions, cond)
	if reflect.DeepEqual(pg.Status, *desired) {
		return nil
	}
	return w.update(ctx, &status)
}

func (w *statusWriter) update(ctx context.Context, pg *v1alpha1.PodGroup) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := w.source.pgClient.UpdateStatus(ctx, pg)
	return err
}
