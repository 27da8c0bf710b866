package mustergang

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

// runGangQueue is the worker loop of the plugin's writers (PodGroup status,
// failed plans): it takes gangs from queue and syncs each until ctx ends. A
// failed sync is retried at the queue's rate limit, at most maxRetries
// times (0: until it succeeds); what names the work in the log.
func runGangQueue(ctx context.Context, queue workqueue.TypedRateLimitingInterface[gang.Key], what string, maxRetries int,
	sync func(context.Context, gang.Key) error) {
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	logger := klog.FromContext(ctx)
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		err := sync(ctx, key)
		switch {
		case err == nil:
			queue.Forget(key)
		case maxRetries == 0 || queue.NumRequeues(key) < maxRetries:
			logger.V(2).Info(what+" failed; retrying", "gang", key, "err", err)
			queue.AddRateLimited(key)
		default:
			logger.Error(err, what+" failed; giving up", "gang", key)
			queue.Forget(key)
		}
		queue.Done(key)
	}
}
