// Package tfconfig is muster's TF_CONFIG controller (docs/tfconfig.md). For every batch/v1 Job and apps/v1
// StatefulSet labelled muster.dev/tf-config: "true" it writes the Secret <name>-tf-config, whose key
// "cluster" lists the DNS address of every TensorFlow task of the workload (or of its group, one
// workload per role), and creates the headless Service that makes those addresses resolve. Each pod
// composes its own TF_CONFIG from that Secret and its index with the kubelet's $(VAR) expansion;
// TFConfigForPod shows the result.
//
// The controller never reads a Secret: it writes its own with server-side apply and tells them from
// someone else's by what the apply returns (docs/tfconfig.md, "Least privilege").
package tfconfig

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

const (
	groupIndex   = "tfGroup"     // namespace/group → workloads of that group
	serviceIndex = "serviceName" // namespace/service → workloads whose pods take their DNS names from it

	// DefaultResyncPeriod re-reconciles every workload this often. Secrets are not watched at all and
	// Services the controller does not own are not watched, so this is how a deleted Secret or
	// user-made Service gets replaced.
	DefaultResyncPeriod = 10 * time.Minute
	// DefaultConflictRecheck is how soon a workload blocked by a Secret or Service it does not own is
	// looked at again: that object is not watched either.
	DefaultConflictRecheck = time.Minute
)

// Controller writes the TF_CONFIG Secret and headless Service of opted-in Jobs and StatefulSets.
// Create it with NewController and start it once with Run.
type Controller struct {
	client          kubernetes.Interface
	namespace       string
	resync          time.Duration
	conflictRecheck time.Duration
	recorder        record.EventRecorder
	ownRecorder     bool

	workloadFactory informers.SharedInformerFactory
	serviceFactory  informers.SharedInformerFactory
	jobIndexer      cache.Indexer
	setIndexer      cache.Indexer
	jobs            batchlisters.JobLister
	sets            appslisters.StatefulSetLister
	services        corelisters.ServiceLister
	cacheSyncs      []cache.InformerSynced

	// applied remembers the Secret this controller instance last applied for each workload. It cannot
	// read Secrets, so this is how it deletes only its own (by UID) and knows whether an apply changed
	// the cluster. It starts empty: a Secret left by a workload deleted while no controller ran is the
	// garbage collector's, through the owner reference.
	appliedMu sync.Mutex
	applied   map[gang.Key]appliedSecret

	queue   workqueue.TypedRateLimitingInterface[gang.Key]
	started atomic.Bool
	synced  atomic.Bool
}

type appliedSecret struct {
	uid     types.UID
	cluster [sha256.Size]byte // of the cluster spec, which may be 127 KiB
}

// Option configures a Controller.
type Option func(*Controller)

// WithNamespace limits the controller to one namespace (default: all).
func WithNamespace(namespace string) Option { return func(c *Controller) { c.namespace = namespace } }

// WithResyncPeriod sets how often every workload is reconciled even without a change (default
// DefaultResyncPeriod; 0 disables it).
func WithResyncPeriod(d time.Duration) Option { return func(c *Controller) { c.resync = d } }

// WithConflictRecheck sets how soon a workload blocked by a foreign Secret or Service is retried.
func WithConflictRecheck(d time.Duration) Option {
	return func(c *Controller) { c.conflictRecheck = d }
}

// WithEventRecorder makes the controller record its Events there instead of to the API server.
func WithEventRecorder(r record.EventRecorder) Option { return func(c *Controller) { c.recorder = r } }

// NewController builds a controller on client. Its informers watch only Jobs and StatefulSets labelled
// muster.dev/tf-config=true and the Services labelled muster.dev/tf-config-job; they start in Run.
func NewController(client kubernetes.Interface, opts ...Option) *Controller {
	RegisterMetrics()
	c := &Controller{
		client:          client,
		resync:          DefaultResyncPeriod,
		conflictRecheck: DefaultConflictRecheck,
		applied:         map[gang.Key]appliedSecret{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[gang.Key](),
			workqueue.TypedRateLimitingQueueConfig[gang.Key]{Name: "tfconfig"}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.recorder == nil {
		// Replaced in Run by a recorder that writes to the API server; this one drops events.
		c.recorder = &record.FakeRecorder{}
		c.ownRecorder = true
	}

	c.workloadFactory = informers.NewSharedInformerFactoryWithOptions(client, c.resync,
		informers.WithNamespace(c.namespace),
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{OptInLabel: "true"}).String()
		}))
	// Only the Services the controller labelled. No resync: workloads resync, and the owner of each
	// Service is found through its label.
	c.serviceFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(c.namespace),
		informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = JobLabel }))

	indexers := cache.Indexers{
		groupIndex:   indexWorkload(func(w workload) string { return groupOf(w) }),
		serviceIndex: indexWorkload(func(w workload) string { return w.serviceName() }),
	}
	jobs := c.workloadFactory.Batch().V1().Jobs()
	sets := c.workloadFactory.Apps().V1().StatefulSets()
	services := c.serviceFactory.Core().V1().Services()
	utilruntime.Must(jobs.Informer().AddIndexers(indexers))
	utilruntime.Must(sets.Informer().AddIndexers(indexers))
	c.jobIndexer, c.setIndexer = jobs.Informer().GetIndexer(), sets.Informer().GetIndexer()
	c.jobs, c.sets, c.services = jobs.Lister(), sets.Lister(), services.Lister()

	workloadHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onWorkload,
		UpdateFunc: c.onWorkloadUpdate,
		DeleteFunc: c.onWorkloadDeleted,
	}
	jobReg, err := jobs.Informer().AddEventHandler(workloadHandler)
	utilruntime.Must(err)
	setReg, err := sets.Informer().AddEventHandler(workloadHandler)
	utilruntime.Must(err)
	serviceReg, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.onService,
		UpdateFunc: func(_, cur any) { c.onService(cur) },
		DeleteFunc: c.onService,
	})
	utilruntime.Must(err)
	c.cacheSyncs = []cache.InformerSynced{
		jobs.Informer().HasSynced, sets.Informer().HasSynced, services.Informer().HasSynced,
		jobReg.HasSynced, setReg.HasSynced, serviceReg.HasSynced,
	}
	return c
}

// indexWorkload indexes workloads by namespace and the value of field, skipping empty values.
func indexWorkload(field func(workload) string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		w, ok := asWorkload(obj)
		if !ok || field(w) == "" {
			return nil, nil
		}
		return []string{w.GetNamespace() + "/" + field(w)}, nil
	}
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
		c.workloadFactory.Shutdown()
		c.serviceFactory.Shutdown()
		c.synced.Store(false)
		logger.Info("Stopped")
	}()
	c.workloadFactory.Start(ctx.Done())
	c.serviceFactory.Start(ctx.Done())

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
	utilruntime.HandleErrorWithContext(ctx, err, "Reconciling TF_CONFIG failed, will retry", "workload", itemName(key))
	c.queue.AddRateLimited(key)
	return true
}

// Event handlers. Work items are workload keys.

func (c *Controller) enqueueGroup(namespace, group string) {
	if group == "" {
		return
	}
	c.enqueueIndexed(groupIndex, namespace+"/"+group)
}

// enqueueIndexed queues the workloads of both kinds under value in the named index.
func (c *Controller) enqueueIndexed(index, value string) {
	for _, indexer := range []cache.Indexer{c.jobIndexer, c.setIndexer} {
		objs, err := indexer.ByIndex(index, value)
		if err != nil {
			continue
		}
		for _, o := range objs {
			if w, ok := asWorkload(o); ok {
				c.queue.Add(keyOf(w))
			}
		}
	}
}

// onWorkload queues a workload and, since every member's Secret holds the whole group's cluster, the
// rest of its group.
func (c *Controller) onWorkload(obj any) {
	w, ok := asWorkload(obj)
	if !ok {
		return
	}
	c.queue.Add(keyOf(w))
	c.enqueueGroup(w.GetNamespace(), groupOf(w))
}

// onWorkloadDeleted also queues a workload of the other kind and the same name, which may be waiting
// for the Secret name to become free. A workload that opts out is deleted from the filtered cache too.
func (c *Controller) onWorkloadDeleted(obj any) {
	c.onWorkload(obj)
	w, ok := asWorkload(obj)
	if !ok {
		return
	}
	for _, k := range workloadKinds {
		if k == w.kind() {
			continue
		}
		key := gang.Key{Kind: k, Namespace: w.GetNamespace(), Name: w.GetName()}
		if _, err := c.lookup(key); err == nil {
			c.queue.Add(key)
		}
	}
}

func (c *Controller) onWorkloadUpdate(oldObj, curObj any) {
	old, okOld := asWorkload(oldObj)
	cur, okCur := asWorkload(curObj)
	if !okOld || !okCur {
		return
	}
	if old.GetResourceVersion() == cur.GetResourceVersion() { // periodic resync
		c.queue.Add(keyOf(cur))
		return
	}
	// The Job and StatefulSet controllers update status all the time; only spec and metadata matter,
	// and a new object of the same name (deleted and made again while the watch was down, so a
	// relist shows it as an update, its generation 1 again).
	if old.GetUID() == cur.GetUID() && old.GetGeneration() == cur.GetGeneration() &&
		labels.Equals(old.GetLabels(), cur.GetLabels()) &&
		labels.Equals(old.GetAnnotations(), cur.GetAnnotations()) &&
		(old.GetDeletionTimestamp() == nil) == (cur.GetDeletionTimestamp() == nil) {
		return
	}
	c.onWorkload(curObj)
	if groupOf(old) != groupOf(cur) {
		c.enqueueGroup(old.GetNamespace(), groupOf(old))
	}
}

// onService queues the workload a Service was made for (named by its label; the kind comes from its
// controller reference, both kinds when it has none) and every workload whose pods use a Service of
// that name: when one workload's Service goes, another may now need its own.
func (c *Controller) onService(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	if name := svc.Labels[JobLabel]; name != "" {
		kinds := workloadKinds
		if ref := metav1.GetControllerOf(svc); ref != nil {
			if k, ok := gang.OwnerKind(ref.APIVersion, ref.Kind); ok {
				kinds = []gang.Kind{k}
			}
		}
		for _, k := range kinds {
			c.queue.Add(gang.Key{Kind: k, Namespace: svc.Namespace, Name: name})
		}
	}
	c.enqueueIndexed(serviceIndex, svc.Namespace+"/"+svc.Name)
}

// lookup returns the workload of key from the informer cache.
func (c *Controller) lookup(key gang.Key) (workload, error) {
	switch key.Kind {
	case gang.KindJob:
		job, err := c.jobs.Jobs(key.Namespace).Get(key.Name)
		if err != nil {
			return nil, err
		}
		return jobWorkload{job}, nil
	case gang.KindStatefulSet:
		set, err := c.sets.StatefulSets(key.Namespace).Get(key.Name)
		if err != nil {
			return nil, err
		}
		return statefulSetWorkload{set}, nil
	}
	return nil, fmt.Errorf("unknown workload kind %q", key.Kind)
}

// lookupLive reads the workload of key from the API server.
func (c *Controller) lookupLive(ctx context.Context, key gang.Key) (workload, error) {
	switch key.Kind {
	case gang.KindJob:
		job, err := c.client.BatchV1().Jobs(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return jobWorkload{job}, nil
	case gang.KindStatefulSet:
		set, err := c.client.AppsV1().StatefulSets(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return statefulSetWorkload{set}, nil
	}
	return nil, fmt.Errorf("unknown workload kind %q", key.Kind)
}

// groupMembers returns the cached workloads of both kinds in the group.
func (c *Controller) groupMembers(namespace, group string) ([]workload, error) {
	var members []workload
	for _, indexer := range []cache.Indexer{c.jobIndexer, c.setIndexer} {
		objs, err := indexer.ByIndex(groupIndex, namespace+"/"+group)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if w, ok := asWorkload(o); ok {
				members = append(members, w)
			}
		}
	}
	return members, nil
}

// namesakeFirst returns the opted-in workload of the other kind and the same name if it was created
// before w (a Job before a StatefulSet of the same age): both would use the Secret <name>-tf-config,
// and the first one keeps it.
func (c *Controller) namesakeFirst(w workload) workload {
	for _, k := range workloadKinds {
		if k == w.kind() {
			continue
		}
		other, err := c.lookup(gang.Key{Kind: k, Namespace: w.GetNamespace(), Name: w.GetName()})
		if err != nil || !optedIn(other) {
			continue
		}
		a, b := other.GetCreationTimestamp(), w.GetCreationTimestamp()
		if a.Before(&b) || (a.Equal(&b) && other.kind() == gang.KindJob) {
			return other
		}
	}
	return nil
}

// sync reconciles one workload and returns the result label for the metrics.
func (c *Controller) sync(ctx context.Context, key gang.Key) (string, error) {
	logger := klog.FromContext(ctx).WithValues("workload", klog.KRef(key.Namespace, key.Name), "kind", key.Kind)
	ctx = klog.NewContext(ctx, logger)

	w, err := c.lookup(key)
	switch {
	case apierrors.IsNotFound(err):
		return c.cleanup(ctx, key)
	case err != nil:
		return resultError, err
	case !optedIn(w):
		return c.cleanup(ctx, key)
	}

	if first := c.namesakeFirst(w); first != nil {
		logger.V(2).Info("Secret name taken by a namesake", "other", first.kind())
		c.recorder.Eventf(w.object(), corev1.EventTypeWarning, ReasonSecretConflict,
			"%s %s was created first and has the Secret %s, which this %s would need too; nothing is written for this %s: rename one of them",
			first.kind(), first.GetName(), SecretName(w.GetName()), w.kind(), w.kind())
		c.queue.AddAfter(key, c.conflictRecheck)
		return resultConflict, nil
	}

	var members []workload
	if g := groupOf(w); g != "" {
		if members, err = c.groupMembers(key.Namespace, g); err != nil {
			return resultError, err
		}
	}
	p := planFor(w, members)
	if p.problem != nil {
		if p.waiting {
			logger.V(2).Info("Waiting", "reason", p.problem.Reason, "message", p.problem.Message)
			c.recorder.Event(w.object(), corev1.EventTypeNormal, p.problem.Reason, p.problem.Message)
			return resultWaiting, nil
		}
		logger.Info("Cannot be served", "reason", p.problem.Reason, "message", p.problem.Message)
		c.recorder.Event(w.object(), corev1.EventTypeWarning, p.problem.Reason, p.problem.Message)
		return resultInvalid, nil
	}

	// The Secret first: pods wait for it in CreateContainerConfigError.
	secretConflict, err := c.ensureSecret(ctx, w, p)
	if err != nil {
		return resultError, err
	}
	serviceConflict := false
	if p.self.Role.inCluster() {
		if serviceConflict, err = c.ensureService(ctx, w, p.self); err != nil {
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

// ensureSecret applies w's Secret so that it holds p.cluster, without reading it first. It reports
// true when a Secret of that name belongs to someone else.
func (c *Controller) ensureSecret(ctx context.Context, w workload, p plan) (bool, error) {
	logger := klog.FromContext(ctx)
	key, name := keyOf(w), SecretName(w.GetName())
	want := secretApply(w, p.cluster)
	apply := func(dryRun bool) (*corev1.Secret, error) { return c.applySecret(ctx, w.GetNamespace(), want, dryRun) }
	var applied *corev1.Secret
	var err error
	remembered, known := c.appliedSecretOf(key)
	if known {
		// The Secret applied before, and no other: if someone deleted it and made their own under
		// its name, the API server refuses the apply (the UID cannot change; none to create with).
		want.WithUID(remembered.uid)
	} else {
		// A Secret not yet known to be this workload's (the first sync, a restart, a foreign Secret
		// looked at again) is applied as a dry run first: a Secret someone else made is then never
		// written into, not even for the moment it takes to give the fields back.
		applied, err = apply(true)
		if err == nil {
			if why := foreignSecret(applied, w); why != "" {
				// Fields this controller merged into it before (a give-back that failed, then a
				// restart) are given back now; with none, the apply changes nothing.
				if err := c.giveBackSecret(ctx, w.GetNamespace(), name, applied.UID); err != nil {
					return false, err
				}
				logger.V(2).Info("TF_CONFIG Secret belongs to someone else; nothing applied", "secret", name, "why", why)
				c.reportForeignSecret(w, name, why)
				return true, nil
			}
		}
	}
	if err == nil {
		applied, err = apply(false)
	}
	if known && (apierrors.IsConflict(err) || apierrors.IsInvalid(err)) {
		// The Secret applied before is gone or replaced, or someone else wrote into it: look again
		// from the start, with a dry run.
		c.forgetSecret(key)
		return c.ensureSecret(ctx, w, p)
	}
	// Conflict: someone else's value in a field the apply sets. Invalid: a Secret that cannot take it
	// (another controller reference, immutable).
	if apierrors.IsConflict(err) || apierrors.IsInvalid(err) {
		c.forgetSecret(key)
		logger.V(2).Info("TF_CONFIG Secret belongs to someone else", "secret", name, "err", err)
		c.reportForeignSecret(w, name, err.Error())
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("applying Secret %s/%s: %w", w.GetNamespace(), name, err)
	}
	secretWritesTotal.WithLabelValues("apply").Inc()

	if why := foreignSecret(applied, w); why != "" {
		// The apply merged into a Secret someone else made between the dry run and the apply: take
		// back everything it added.
		c.forgetSecret(key)
		if err := c.giveBackSecret(ctx, w.GetNamespace(), name, applied.UID); err != nil {
			// Retried: the next sync's dry run finds the Secret foreign and gives the fields back.
			return false, err
		}
		logger.V(2).Info("TF_CONFIG Secret belongs to someone else; gave back what was applied", "secret", name, "why", why)
		c.reportForeignSecret(w, name, why)
		return true, nil
	}

	c.rememberApplied(ctx, w, p, name, applied.UID)
	return false, nil
}

// applySecret applies want (a dry run when dryRun). No force: a field another manager set to
// another value is a conflict, never overwritten.
func (c *Controller) applySecret(ctx context.Context, namespace string, want *applycorev1.SecretApplyConfiguration, dryRun bool) (*corev1.Secret, error) {
	secrets := c.client.CoreV1().Secrets(namespace)
	opts := metav1.ApplyOptions{FieldManager: FieldManager}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	applied, err := secrets.Apply(ctx, want, opts)
	if err != nil && conflictsOnlyWithItself(err) {
		opts.Force = true
		applied, err = secrets.Apply(ctx, want, opts)
	}
	return applied, err
}

// rememberApplied records the Secret name (uid) applied for w's plan p and announces
// it when it is new or holds another cluster than before.
func (c *Controller) rememberApplied(ctx context.Context, w workload, p plan, name string, uid types.UID) {
	logger := klog.FromContext(ctx)
	before, known := c.rememberSecret(keyOf(w), appliedSecret{uid: uid, cluster: sha256.Sum256(p.cluster)})
	switch {
	case !known || before.uid != uid:
		logger.V(2).Info("Applied TF_CONFIG Secret", "secret", name, "tasks", p.tasks)
		c.recorder.Eventf(w.object(), corev1.EventTypeNormal, ReasonSecretApplied, "Secret %s holds a cluster of %d tasks", name, p.tasks)
	case before.cluster != sha256.Sum256(p.cluster):
		logger.V(2).Info("Updated TF_CONFIG Secret", "secret", name, "tasks", p.tasks)
		c.recorder.Eventf(w.object(), corev1.EventTypeNormal, ReasonSecretUpdated,
			"Updated Secret %s to a cluster of %d tasks; running containers keep the cluster they started with", name, p.tasks)
	}
}

// giveBackSecret gives back every field the controller applied to the Secret namespace/name of that
// UID (secretRelease).
func (c *Controller) giveBackSecret(ctx context.Context, namespace, name string, uid types.UID) error {
	_, err := c.client.CoreV1().Secrets(namespace).Apply(ctx, secretRelease(namespace, name, uid), metav1.ApplyOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsConflict(err): // gone (an apply without field values conflicts with nothing else)
		klog.FromContext(ctx).V(2).Info("The foreign Secret is gone: nothing to give back", "secret", klog.KRef(namespace, name), "uid", uid)
	case apierrors.IsInvalid(err): // immutable, or replaced under its name: nothing can be taken back, or was added
		klog.FromContext(ctx).Info("Could not give back the fields applied to a foreign Secret", "secret", klog.KRef(namespace, name), "err", err)
	case err != nil:
		return fmt.Errorf("giving back Secret %s/%s: %w", namespace, name, err)
	default:
		secretWritesTotal.WithLabelValues("release").Inc()
	}
	return nil
}

func (c *Controller) reportForeignSecret(w workload, name, why string) {
	c.recorder.Eventf(w.object(), corev1.EventTypeWarning, ReasonSecretConflict,
		"Secret %s exists and is not this %s's (%s), so it is left as it was and the pods will not get this controller's TF_CONFIG: delete or rename that Secret",
		name, w.kind(), why)
}

// rememberSecret records what was applied for key and returns what was recorded before.
func (c *Controller) rememberSecret(key gang.Key, s appliedSecret) (appliedSecret, bool) {
	c.appliedMu.Lock()
	defer c.appliedMu.Unlock()
	before, known := c.applied[key]
	c.applied[key] = s
	return before, known
}

func (c *Controller) appliedSecretOf(key gang.Key) (appliedSecret, bool) {
	c.appliedMu.Lock()
	defer c.appliedMu.Unlock()
	s, ok := c.applied[key]
	return s, ok
}

func (c *Controller) forgetSecret(key gang.Key) {
	c.appliedMu.Lock()
	defer c.appliedMu.Unlock()
	delete(c.applied, key)
}

// ensureService makes sure a headless Service of the workload's service name exists. A Service of that
// name that the controller does not own is fine if it is headless and selects the workload's pods;
// otherwise it reports true with a Warning Event. A Service is the controller's only by its label
// (labelledFor), the same test the shipped admission policy makes before it lets the controller update
// or delete a Service: one without the label is never written, even if the workload controls it.
func (c *Controller) ensureService(ctx context.Context, w workload, ts TaskSet) (bool, error) {
	logger := klog.FromContext(ctx)
	ns, name := w.GetNamespace(), ts.Subdomain
	existing, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		existing, err = c.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err := c.client.CoreV1().Services(ns).Create(ctx, desiredService(w, ts), metav1.CreateOptions{}); err != nil {
				return false, fmt.Errorf("creating Service %s/%s: %w", ns, name, err)
			}
			serviceWritesTotal.WithLabelValues("create").Inc()
			logger.V(2).Info("Created headless Service", "service", name)
			c.recorder.Eventf(w.object(), corev1.EventTypeNormal, ReasonServiceCreated, "Created headless Service %s for the pods' DNS names", name)
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("reading Service %s/%s: %w", ns, name, err)
	}
	if !labelledFor(existing, keyOf(w)) {
		if ok, why := serviceServes(existing, w); !ok {
			logger.V(2).Info("Service of that name does not serve the pods", "service", name, "why", why)
			c.recorder.Eventf(w.object(), corev1.EventTypeWarning, ReasonServiceConflict,
				"Service %s is not this %s's (it does not carry the label %s=%s) and %s, so the addresses in the cluster spec will not resolve; it is left alone: make it a headless Service selecting %v, or delete it, or give the %s a service name of its own",
				name, w.kind(), JobLabel, w.GetName(), why, labels.Set(w.podSelector()), w.kind())
			return true, nil
		}
		return false, nil
	}
	if existing.Spec.ClusterIP != corev1.ClusterIPNone {
		// spec.clusterIP cannot be changed to None, and the admission policy refuses the controller any
		// Service that is not headless: only deleting it helps, which is left to whoever made it.
		logger.V(2).Info("Service carries the controller's label but is not headless", "service", name)
		c.recorder.Eventf(w.object(), corev1.EventTypeWarning, ReasonServiceConflict,
			"Service %s carries the label %s=%s but is not headless (spec.clusterIP is not None), so the addresses in the cluster spec will not resolve, and a Service cannot be made headless; it is left alone: delete it and the controller creates a headless one",
			name, JobLabel, w.GetName())
		return true, nil
	}
	if serviceUpToDate(existing, w, ts) {
		return false, nil
	}
	updated := existing.DeepCopy()
	claim(updated, w)
	updated.Spec.ExternalIPs = nil // the admission policy refuses the controller a Service with external IPs
	updated.Spec.PublishNotReadyAddresses = true
	updated.Spec.Selector = w.podSelector()
	updated.Spec.Ports = desiredPorts(ts.Port)
	if _, err := c.client.CoreV1().Services(ns).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating Service %s/%s: %w", ns, name, err)
	}
	serviceWritesTotal.WithLabelValues("update").Inc()
	logger.V(2).Info("Updated headless Service", "service", name)
	return false, nil
}

// cleanup deletes what was made for the workload of key, which is gone, being deleted or no longer
// opted in. Owner references alone are not enough: a workload deleted with orphan propagation leaves
// its dependents behind, and so does a cluster without a garbage collector. The Secret is deleted by
// name with the UID this controller applied, so a Secret someone else has since put under that name is
// never touched.
func (c *Controller) cleanup(ctx context.Context, key gang.Key) (string, error) {
	logger := klog.FromContext(ctx)
	secret, haveSecret := c.appliedSecretOf(key)
	services, err := c.services.Services(key.Namespace).List(labels.SelectorFromSet(labels.Set{JobLabel: key.Name}))
	if err != nil {
		return resultError, err
	}
	var victims []*corev1.Service
	for _, s := range services {
		if !labelledFor(s, key) {
			continue
		}
		// A Service without a controller may be adopted by a namesake of the other kind that is served.
		if metav1.GetControllerOf(s) == nil && c.servesName(key.Namespace, key.Name) {
			continue
		}
		victims = append(victims, s)
	}
	if !haveSecret && len(victims) == 0 {
		return resultCleaned, nil
	}

	// Running pods may still read the Secret: check the API server before trusting a cache that says
	// the workload is gone.
	live, err := c.lookupLive(ctx, key)
	switch {
	case err == nil && optedIn(live):
		return resultError, fmt.Errorf("%s %s/%s exists but is not in the cache yet", key.Kind, key.Namespace, key.Name)
	case err != nil && !apierrors.IsNotFound(err):
		return resultError, err
	}

	// NotFound: already gone. Conflict: another object under that name now, which is left alone.
	gone := func(err error) bool { return err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) }
	if haveSecret {
		name := SecretName(key.Name)
		err := c.client.CoreV1().Secrets(key.Namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &secret.uid}})
		if !gone(err) {
			return resultError, fmt.Errorf("deleting Secret %s/%s: %w", key.Namespace, name, err)
		}
		c.forgetSecret(key)
		if err == nil {
			secretWritesTotal.WithLabelValues("delete").Inc()
			logger.V(2).Info("Deleted the Secret of a workload that is gone", "secret", name, "uid", secret.uid)
		}
	}
	for _, s := range victims {
		uid := s.UID
		err := c.client.CoreV1().Services(key.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if !gone(err) {
			return resultError, fmt.Errorf("deleting Service %s/%s: %w", key.Namespace, s.Name, err)
		}
		if err == nil {
			serviceWritesTotal.WithLabelValues("delete").Inc()
			logger.V(2).Info("Deleted the Service of a workload that is gone", "service", s.Name, "uid", uid)
		}
	}
	return resultCleaned, nil
}

// servesName reports whether an opted-in workload of any kind named name is in the cache.
func (c *Controller) servesName(namespace, name string) bool {
	for _, k := range workloadKinds {
		if w, err := c.lookup(gang.Key{Kind: k, Namespace: namespace, Name: name}); err == nil && optedIn(w) {
			return true
		}
	}
	return false
}
