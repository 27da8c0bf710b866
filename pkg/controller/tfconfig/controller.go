// Package tfconfig is muster's TF_CONFIG controller (DESIGN.md §5). For every batch/v1 Job labelled
// muster.dev/tf-config: "true" it writes the Secret <job>-tf-config, whose key "cluster" lists the DNS
// address of every TensorFlow task of the Job (or of its group of Jobs, one per role), and creates the
// headless Service that makes those addresses resolve. Each pod composes its own TF_CONFIG from that
// Secret and its completion index with the kubelet's $(VAR) expansion; TFConfigForPod shows the result.
package tfconfig

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	groupIndex     = "tfGroup"   // namespace/group → Jobs of that group
	subdomainIndex = "subdomain" // namespace/subdomain → Jobs whose pods use that subdomain

	// DefaultResyncPeriod re-reconciles every Job this often. Secrets and Services the controller does
	// not own are not watched, so this is how a deleted user-made Service gets replaced.
	DefaultResyncPeriod = 10 * time.Minute
	// DefaultConflictRecheck is how soon a Job blocked by a Secret or Service it does not own is looked
	// at again: that object is not watched either.
	DefaultConflictRecheck = time.Minute
)

// Controller writes the TF_CONFIG Secret and headless Service of opted-in Jobs. Create it with
// NewController and start it once with Run.
type Controller struct {
	client          kubernetes.Interface
	namespace       string
	resync          time.Duration
	conflictRecheck time.Duration
	recorder        record.EventRecorder
	ownRecorder     bool

	jobFactory   informers.SharedInformerFactory
	ownedFactory informers.SharedInformerFactory
	jobIndexer   cache.Indexer
	jobLister    batchlisters.JobLister
	secrets      corelisters.SecretLister
	services     corelisters.ServiceLister
	cacheSyncs   []cache.InformerSynced

	queue   workqueue.TypedRateLimitingInterface[string]
	started atomic.Bool
	synced  atomic.Bool
}

// Option configures a Controller.
type Option func(*Controller)

// WithNamespace limits the controller to one namespace (default: all).
func WithNamespace(namespace string) Option { return func(c *Controller) { c.namespace = namespace } }

// WithResyncPeriod sets how often every Job is reconciled even without a change (default
// DefaultResyncPeriod; 0 disables it).
func WithResyncPeriod(d time.Duration) Option { return func(c *Controller) { c.resync = d } }

// WithConflictRecheck sets how soon a Job blocked by a foreign Secret or Service is retried.
func WithConflictRecheck(d time.Duration) Option {
	return func(c *Controller) { c.conflictRecheck = d }
}

// WithEventRecorder makes the controller record its Events there instead of to the API server.
func WithEventRecorder(r record.EventRecorder) Option { return func(c *Controller) { c.recorder = r } }

// NewController builds a controller on client. Its informers watch only Jobs labelled
// muster.dev/tf-config=true and the Secrets and Services labelled muster.dev/tf-config-job; they
// start in Run.
func NewController(client kubernetes.Interface, opts ...Option) *Controller {
	RegisterMetrics()
	c := &Controller{
		client:          client,
		resync:          DefaultResyncPeriod,
		conflictRecheck: DefaultConflictRecheck,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "tfconfig"}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.recorder == nil {
		// Replaced in Run by a recorder that writes to the API server; this one drops events.
		c.recorder = &record.FakeRecorder{}
		c.ownRecorder = true
	}

	c.jobFactory = informers.NewSharedInformerFactoryWithOptions(client, c.resync,
		informers.WithNamespace(c.namespace),
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{OptInLabel: "true"}).String()
		}))
	// Only what the controller labelled: an unfiltered Secret informer would cache every Secret of
	// the cluster. No resync: Jobs resync, and the owner of each object is found through its label.
	c.ownedFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(c.namespace),
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = JobLabel }))

	jobs := c.jobFactory.Batch().V1().Jobs()
	utilruntime.Must(jobs.Informer().AddIndexers(cache.Indexers{
		groupIndex: func(obj any) ([]string, error) {
			job, ok := obj.(*batchv1.Job)
			if !ok || groupOf(job) == "" {
				return nil, nil
			}
			return []string{job.Namespace + "/" + groupOf(job)}, nil
		},
		subdomainIndex: func(obj any) ([]string, error) {
			job, ok := obj.(*batchv1.Job)
			if !ok || job.Spec.Template.Spec.Subdomain == "" {
				return nil, nil
			}
			return []string{job.Namespace + "/" + job.Spec.Template.Spec.Subdomain}, nil
		},
	}))
	c.jobIndexer = jobs.Informer().GetIndexer()
	c.jobLister = jobs.Lister()
	secrets := c.ownedFactory.Core().V1().Secrets()
	services := c.ownedFactory.Core().V1().Services()
	c.secrets = secrets.Lister()
	c.services = services.Lister()

	jobReg, err := jobs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueJobAndGroup(obj) },
		UpdateFunc: c.onJobUpdate,
		DeleteFunc: func(obj any) { c.enqueueJobAndGroup(obj) },
	})
	utilruntime.Must(err)
	secretReg, err := secrets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueOwner,
		UpdateFunc: func(_, cur any) { c.enqueueOwner(cur) },
		DeleteFunc: c.enqueueOwner,
	})
	utilruntime.Must(err)
	serviceReg, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onService,
		UpdateFunc: func(_, cur any) { c.onService(cur) },
		DeleteFunc: c.onService,
	})
	utilruntime.Must(err)
	c.cacheSyncs = []cache.InformerSynced{
		jobs.Informer().HasSynced, secrets.Informer().HasSynced, services.Informer().HasSynced,
		jobReg.HasSynced, secretReg.HasSynced, serviceReg.HasSynced,
	}
	return c
}

func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// HasSynced reports whether Run's caches have synced and workers are running.
func (c *Controller) HasSynced() bool { return c.synced.Load() }

// Run starts the informers, waits for their caches, and reconciles with the given number of workers
// until ctx is done. It returns nil after a clean stop. A Controller runs once.
func (c *Controller) Run(ctx context.Context, workers int) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("tfconfig: Controller.Run called twice")
	}
	if workers < 1 {
		return fmt.Errorf("tfconfig: need at least one worker, got %d", workers)
	}
	logger := klog.FromContext(ctx).WithValues("controller", ControllerName)
	ctx = klog.NewContext(ctx, logger)

	if c.ownRecorder {
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartStructuredLogging(3)
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		c.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ControllerName})
		defer broadcaster.Shutdown()
	}

	var wg sync.WaitGroup
	defer func() {
		c.queue.ShutDown()
		wg.Wait()
		c.jobFactory.Shutdown()
		c.ownedFactory.Shutdown()
		c.synced.Store(false)
		logger.Info("Stopped")
	}()
	c.jobFactory.Start(ctx.Done())
	c.ownedFactory.Start(ctx.Done())

	logger.Info("Starting", "namespace", c.namespace, "workers", workers)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.cacheSyncs...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("tfconfig: informer caches did not sync")
	}
	for range workers {
		wg.Go(func() {
			for c.processNextItem(ctx) {
			}
		})
	}
	c.synced.Store(true)
	<-ctx.Done()
	return nil
}

func (c *Controller) processNextItem(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)

	result, err := c.sync(ctx, key)
	reconcilesTotal.WithLabelValues(result).Inc()
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	if ctx.Err() != nil { // stopping: the error is the cancellation
		return true
	}
	utilruntime.HandleErrorWithContext(ctx, err, "Reconciling TF_CONFIG failed, will retry", "job", key)
	c.queue.AddRateLimited(key)
	return true
}

// Event handlers. Work items are Job keys (namespace/name).

func (c *Controller) enqueue(namespace, name string) {
	c.queue.Add(namespace + "/" + name)
}

func (c *Controller) enqueueGroup(namespace, group string) {
	if group == "" {
		return
	}
	objs, err := c.jobIndexer.ByIndex(groupIndex, namespace+"/"+group)
	if err != nil {
		return
	}
	for _, o := range objs {
		if job, ok := o.(*batchv1.Job); ok {
			c.enqueue(job.Namespace, job.Name)
		}
	}
}

// enqueueJobAndGroup queues a Job and, since every member's Secret holds the whole group's cluster,
// the rest of its group.
func (c *Controller) enqueueJobAndGroup(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	job, ok := obj.(*batchv1.Job)
	if !ok {
		return
	}
	c.enqueue(job.Namespace, job.Name)
	c.enqueueGroup(job.Namespace, groupOf(job))
}

func (c *Controller) onJobUpdate(oldObj, curObj any) {
	old, okOld := oldObj.(*batchv1.Job)
	cur, okCur := curObj.(*batchv1.Job)
	if !okOld || !okCur {
		return
	}
	if old.ResourceVersion == cur.ResourceVersion { // periodic resync
		c.enqueue(cur.Namespace, cur.Name)
		return
	}
	// The Job controller updates status all the time; only spec and metadata matter here.
	if old.Generation == cur.Generation &&
		labels.Equals(old.Labels, cur.Labels) &&
		labels.Equals(old.Annotations, cur.Annotations) &&
		(old.DeletionTimestamp == nil) == (cur.DeletionTimestamp == nil) {
		return
	}
	c.enqueueJobAndGroup(cur)
	if groupOf(old) != groupOf(cur) {
		c.enqueueGroup(old.Namespace, groupOf(old))
	}
}

// enqueueOwner queues the Job named by an owned object's label.
func (c *Controller) enqueueOwner(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	if name := m.GetLabels()[JobLabel]; name != "" {
		c.enqueue(m.GetNamespace(), name)
	}
}

// onService also queues every Job whose subdomain is the Service's name: when one Job's Service goes,
// another Job using the same subdomain may now need its own.
func (c *Controller) onService(obj any) {
	c.enqueueOwner(obj)
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	objs, err := c.jobIndexer.ByIndex(subdomainIndex, svc.Namespace+"/"+svc.Name)
	if err != nil {
		return
	}
	for _, o := range objs {
		if job, ok := o.(*batchv1.Job); ok {
			c.enqueue(job.Namespace, job.Name)
		}
	}
}

// sync reconciles one Job key and returns the result label for the metrics.
func (c *Controller) sync(ctx context.Context, key string) (string, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return resultError, err
	}
	logger := klog.FromContext(ctx).WithValues("job", klog.KRef(namespace, name))
	ctx = klog.NewContext(ctx, logger)

	job, err := c.jobLister.Jobs(namespace).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		return c.cleanup(ctx, namespace, name)
	case err != nil:
		return resultError, err
	case !optedIn(job):
		return c.cleanup(ctx, namespace, name)
	}

	var members []*batchv1.Job
	if g := groupOf(job); g != "" {
		objs, err := c.jobIndexer.ByIndex(groupIndex, namespace+"/"+g)
		if err != nil {
			return resultError, err
		}
		for _, o := range objs {
			members = append(members, o.(*batchv1.Job))
		}
	}
	p := planFor(job, members)
	if p.problem != nil {
		if p.waiting {
			logger.V(2).Info("Waiting for the rest of the group", "reason", p.problem.Reason, "message", p.problem.Message)
			c.recorder.Event(job, corev1.EventTypeNormal, p.problem.Reason, p.problem.Message)
			return resultWaiting, nil
		}
		logger.V(2).Info("Job cannot be served", "reason", p.problem.Reason, "message", p.problem.Message)
		c.recorder.Event(job, corev1.EventTypeWarning, p.problem.Reason, p.problem.Message)
		return resultInvalid, nil
	}

	// The Secret first: pods wait for it in CreateContainerConfigError.
	secretConflict, err := c.ensureSecret(ctx, job, p)
	if err != nil {
		return resultError, err
	}
	serviceConflict := false
	if p.self.Role.inCluster() {
		if serviceConflict, err = c.ensureService(ctx, job, p.self); err != nil {
			return resultError, err
		}
	}
	if secretConflict || serviceConflict {
		// Foreign objects are not watched; look again later.
		c.queue.AddAfter(key, c.conflictRecheck)
		return resultConflict, nil
	}
	return resultSynced, nil
}

// ensureSecret makes the Job's Secret hold p.cluster. It reports true when a Secret of that name
// belongs to someone else.
func (c *Controller) ensureSecret(ctx context.Context, job *batchv1.Job, p plan) (bool, error) {
	logger := klog.FromContext(ctx)
	name := SecretName(job.Name)
	existing, err := c.secrets.Secrets(job.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		// The cache holds only labelled Secrets: a foreign one of this name shows only in a live read.
		existing, err = c.client.CoreV1().Secrets(job.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err := c.client.CoreV1().Secrets(job.Namespace).Create(ctx, desiredSecret(job, p.cluster), metav1.CreateOptions{}); err != nil {
				return false, fmt.Errorf("creating Secret %s/%s: %w", job.Namespace, name, err)
			}
			secretWritesTotal.WithLabelValues("create").Inc()
			logger.V(2).Info("Created TF_CONFIG Secret", "secret", name, "tasks", p.tasks)
			c.recorder.Eventf(job, corev1.EventTypeNormal, ReasonSecretCreated, "Created Secret %s with a cluster of %d tasks", name, p.tasks)
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("reading Secret %s/%s: %w", job.Namespace, name, err)
	}
	if !belongsTo(existing, job) {
		c.recorder.Eventf(job, corev1.EventTypeWarning, ReasonSecretConflict,
			"Secret %s exists and is not controlled by this Job, so it is left alone and the Job's pods will not get this controller's TF_CONFIG: delete or rename that Secret", name)
		return true, nil
	}
	if secretUpToDate(existing, job, p.cluster) {
		return false, nil
	}
	updated := existing.DeepCopy()
	claim(updated, job)
	updated.Data = map[string][]byte{ClusterKey: p.cluster}
	if _, err := c.client.CoreV1().Secrets(job.Namespace).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating Secret %s/%s: %w", job.Namespace, name, err)
	}
	secretWritesTotal.WithLabelValues("update").Inc()
	logger.V(2).Info("Updated TF_CONFIG Secret", "secret", name, "tasks", p.tasks)
	c.recorder.Eventf(job, corev1.EventTypeNormal, ReasonSecretUpdated,
		"Updated Secret %s to a cluster of %d tasks; running containers keep the cluster they started with", name, p.tasks)
	return false, nil
}

// ensureService makes sure a headless Service named like the Job's subdomain exists. A Service of that
// name that the controller does not own is fine if it is headless and selects the Job's pods; otherwise
// it reports true with a Warning Event.
func (c *Controller) ensureService(ctx context.Context, job *batchv1.Job, ts TaskSet) (bool, error) {
	logger := klog.FromContext(ctx)
	name := ts.Subdomain
	existing, err := c.services.Services(job.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		existing, err = c.client.CoreV1().Services(job.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err := c.client.CoreV1().Services(job.Namespace).Create(ctx, desiredService(job, ts), metav1.CreateOptions{}); err != nil {
				return false, fmt.Errorf("creating Service %s/%s: %w", job.Namespace, name, err)
			}
			serviceWritesTotal.WithLabelValues("create").Inc()
			logger.V(2).Info("Created headless Service", "service", name)
			c.recorder.Eventf(job, corev1.EventTypeNormal, ReasonServiceCreated, "Created headless Service %s for the pods' DNS names", name)
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("reading Service %s/%s: %w", job.Namespace, name, err)
	}
	if !belongsTo(existing, job) {
		if ok, why := serviceServes(existing, job); !ok {
			c.recorder.Eventf(job, corev1.EventTypeWarning, ReasonServiceConflict,
				"Service %s is not controlled by this Job and %s, so the addresses in the cluster spec will not resolve; it is left alone: make it a headless Service selecting %s=%s, or delete it, or give the Job a subdomain of its own",
				name, why, batchv1.JobNameLabel, job.Name)
			return true, nil
		}
		return false, nil
	}
	if serviceUpToDate(existing, job, ts) {
		return false, nil
	}
	updated := existing.DeepCopy()
	claim(updated, job)
	updated.Spec.PublishNotReadyAddresses = true
	updated.Spec.Selector = podSelector(job)
	updated.Spec.Ports = desiredPorts(ts.Port)
	if _, err := c.client.CoreV1().Services(job.Namespace).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating Service %s/%s: %w", job.Namespace, name, err)
	}
	serviceWritesTotal.WithLabelValues("update").Inc()
	logger.V(2).Info("Updated headless Service", "service", name)
	return false, nil
}

// cleanup deletes the Secrets and Services made for the Job named name, which is gone, being deleted
// or no longer opted in. Owner references alone are not enough: a Job deleted with orphan propagation
// leaves its dependents behind, and so does a cluster without a garbage collector.
func (c *Controller) cleanup(ctx context.Context, namespace, name string) (string, error) {
	logger := klog.FromContext(ctx)
	sel := labels.SelectorFromSet(labels.Set{JobLabel: name})
	secrets, err := c.secrets.Secrets(namespace).List(sel)
	if err != nil {
		return resultError, err
	}
	services, err := c.services.Services(namespace).List(sel)
	if err != nil {
		return resultError, err
	}
	type victim struct {
		kind string
		obj  metav1.Object
	}
	var victims []victim
	for _, s := range secrets {
		if labelledFor(s, name) {
			victims = append(victims, victim{"Secret", s})
		}
	}
	for _, s := range services {
		if labelledFor(s, name) {
			victims = append(victims, victim{"Service", s})
		}
	}
	if len(victims) == 0 {
		return resultCleaned, nil
	}

	// Running pods may still read the Secret: check the API server before trusting a cache that says
	// the Job is gone.
	live, err := c.client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && optedIn(live):
		return resultError, fmt.Errorf("job %s/%s exists but is not in the cache yet", namespace, name)
	case err != nil && !apierrors.IsNotFound(err):
		return resultError, err
	}

	for _, v := range victims {
		uid := v.obj.GetUID()
		opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
		if v.kind == "Secret" {
			err = c.client.CoreV1().Secrets(namespace).Delete(ctx, v.obj.GetName(), opts)
		} else {
			err = c.client.CoreV1().Services(namespace).Delete(ctx, v.obj.GetName(), opts)
		}
		// NotFound: already gone. Conflict: replaced by a new object, which its own event will bring back.
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return resultError, fmt.Errorf("deleting %s %s/%s: %w", v.kind, namespace, v.obj.GetName(), err)
		}
		if err == nil {
			if v.kind == "Secret" {
				secretWritesTotal.WithLabelValues("delete").Inc()
			} else {
				serviceWritesTotal.WithLabelValues("delete").Inc()
			}
			logger.V(2).Info("Deleted object of a deleted Job", "kind", v.kind, "name", v.obj.GetName(), "uid", uid)
		}
	}
	return resultCleaned, nil
}
