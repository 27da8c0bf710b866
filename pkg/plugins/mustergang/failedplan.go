package mustergang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

// failedPlanWriter records a gang's last failed plan on the gang's object
// (gang.FailedPlanAnnotation), for kubectl-muster: the per-reason node
// counts the scheduler saw, which no client can compute (framework filter
// refusals, other gangs' holdings). It runs off the scheduling path, is fed
// only when the gang's notice changes (at most once per plan outcome, the
// same moment as its Event), and writes only the newest record of a gang.
type failedPlanWriter struct {
	client func() kubernetes.Interface
	source *gangSource // the PodGroup client
	mu     sync.Mutex
	latest map[gang.Key]*failedPlanRecord
	queue  workqueue.TypedRateLimitingInterface[gang.Key]
}

// failedPlanRecord is a failed plan to write on the gang's object, the one
// with uid: the patch names it, so the API server refuses it (422, the UID
// is immutable) once the object was deleted and another made under its
// name, whose gang never had this plan.
type failedPlanRecord struct {
	uid  types.UID
	plan *gang.FailedPlan
}

func newFailedPlanWriter(client func() kubernetes.Interface, source *gangSource) *failedPlanWriter {
	return &failedPlanWriter{client: client, source: source, latest: map[gang.Key]*failedPlanRecord{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[gang.Key](),
			workqueue.TypedRateLimitingQueueConfig[gang.Key]{Name: "muster-failed-plan"})}
}

// record queues f as the newest failed plan of gang key, whose object has
// uid. A pod scheduled alone has no object of its own to write on.
func (w *failedPlanWriter) record(key gang.Key, uid types.UID, f *gang.FailedPlan) {
	if key.Kind == gang.KindPod || key.Name == "" {
		return
	}
	w.mu.Lock()
	w.latest[key] = &failedPlanRecord{uid: uid, plan: f}
	w.mu.Unlock()
	w.queue.Add(key)
}

func (w *failedPlanWriter) run(ctx context.Context) {
	runGangQueue(ctx, w.queue, "Recording the failed plan", maxFailedPlanRetries, w.sync)
}

// maxFailedPlanRetries bounds the retries of one record: a newer failed
// plan queues the gang again anyway.
const maxFailedPlanRetries = 5

func (w *failedPlanWriter) sync(ctx context.Context, key gang.Key) error {
	w.mu.Lock()
	f := w.latest[key]
	w.mu.Unlock()
	if f == nil {
		return nil
	}
	metadata := map[string]any{"annotations": map[string]string{gang.FailedPlanAnnotation: f.plan.Encode()}}
	if f.uid != "" {
		metadata["uid"] = f.uid
	}
	patch, err := json.Marshal(map[string]any{"metadata": metadata})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts := metav1.PatchOptions{FieldManager: "muster-scheduler"}
	client := w.client()
	switch key.Kind {
	case gang.KindJob:
		_, err = client.BatchV1().Jobs(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, opts)
	case gang.KindStatefulSet:
		_, err = client.AppsV1().StatefulSets(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, opts)
	case gang.KindWorkloadPodGroup:
		_, err = client.SchedulingV1beta1().PodGroups(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, patch, opts)
	case gang.KindPodGroup:
		if w.source.pgClient == nil {
			return nil
		}
		err = w.source.pgClient.Patch(ctx, key.Namespace, key.Name, types.MergePatchType, patch, opts)
	default:
		return fmt.Errorf("gang %s: no object to record a failed plan on", key)
	}
	switch {
	case apierrors.IsNotFound(err):
		err = nil // the gang is gone
	case f.uid != "" && uidRefused(err):
		// Another object has the gang's name now; a retry would be
		// refused the same way.
		klog.FromContext(ctx).V(2).Info("Failed plan not recorded: the gang's object was replaced", "gang", key, "uid", f.uid, "err", err)
		err = nil
	case refusedByPolicy(err):
		// An admission webhook or policy denying updates of the object, or
		// the object at its size limit: the same patch is refused again at
		// once, so it is not retried (each retry is a call to the webhook).
		klog.FromContext(ctx).Error(err, "Failed plan not recorded: the API server refused the patch; not retried", "gang", key)
		err = nil
	}
	// Written, refused for good, or refused for the last time
	// (runGangQueue gives up after maxFailedPlanRetries): the record is
	// dropped either way, and a newer failed plan of the gang queues it
	// again.
	if err == nil || w.queue.NumRequeues(key) >= maxFailedPlanRetries {
		w.mu.Lock()
		if w.latest[key] == f {
			delete(w.latest, key)
		}
		w.mu.Unlock()
	}
	return err
}

// refusedByPolicy reports whether err is a refusal the same request meets
// again: denied (403, an admission webhook or RBAC), invalid (422, a
// ValidatingAdmissionPolicy's CEL) or too large.
func refusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// uidRefused reports whether err is the API server refusing a patch that
// names another UID than the object's.
func uidRefused(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == "metadata.uid" {
			return true
		}
	}
	return false
}
