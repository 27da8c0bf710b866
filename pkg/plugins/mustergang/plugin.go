// Package mustergang is the framework adapter of muster's gang scheduling: it
// plans a whole gang at once (pkg/gang), steers each member to its planned
// node, holds members at Permit until the whole plan is reserved, and
// releases everything when the gang cannot complete.
package mustergang

import (
	"context"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/config"
	_ "github.com/muster-sched/muster/pkg/apis/config/scheme" // registers the args types
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// Name is the plugin name used in the scheduler configuration.
const Name = "MusterGang"

// Event reasons on Jobs, StatefulSets and PodGroups.
const (
	ReasonWaitingForMembers = "GangWaitingForMembers"
	ReasonUnschedulable     = "GangUnschedulable"
	ReasonInvalid           = "GangInvalid"
	ReasonPlanned           = "GangPlanned"
	ReasonScheduled         = "GangScheduled"
	ReasonRejected          = "GangRejected"
	ReasonTimeout           = "GangScheduleTimeout"
	// ReasonNoGang on a StatefulSet (and its pod) whose pods can never form
	// a gang: OrderedReady creates them one at a time.
	ReasonNoGang = "GangNotPossible"
	// ReasonPreempting on the preemptor's Job/PodGroup (or pod), ReasonPreempted
	// on each victim's.
	ReasonPreempting = "GangPreempting"
	ReasonPreempted  = "Preempted"
)

// gangIndexPrefix names the pod informer's gang index; one index per
// profile, because every profile's QueueSort is MusterGang (kube-scheduler
// requires one QueueSort for all profiles) and they share the informer.
const gangIndexPrefix = "muster.dev/gang/"

// registries shares one gang registry among the MusterGang instances of one
// scheduler (one per profile, all on the same informer factory), so every
// profile sees the capacity the others' plans hold.
var registries = struct {
	sync.Mutex
	byFactory map[interface{}]*sharedRegistry
}{byFactory: map[interface{}]*sharedRegistry{}}

type sharedRegistry struct {
	*gang.Registry
	users int
}

// registryFor returns the registry of the scheduler that owns factory,
// released when ctx ends.
func registryFor(ctx context.Context, factory interface{}) *gang.Registry {
	registries.Lock()
	defer registries.Unlock()
	r := registries.byFactory[factory]
	if r == nil {
		r = &sharedRegistry{Registry: gang.NewRegistry()}
		registries.byFactory[factory] = r
	}
	r.users++
	go func() {
		<-ctx.Done()
		registries.Lock()
		defer registries.Unlock()
		if r.users--; r.users == 0 {
			delete(registries.byFactory, factory)
		}
	}()
	return r.Registry
}

var (
	_ fwk.QueueSortPlugin   = &Plugin{}
	_ fwk.PreEnqueuePlugin  = &Plugin{}
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PostFilterPlugin  = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.PermitPlugin      = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// Plugin implements the MusterGang plugin.
type Plugin struct {
	handle   fwk.Handle
	args     *config.MusterGangArgs
	levels   []gang.Level
	registry *gang.Registry

	pods      cache.Indexer
	gangIndex string
	jobs      batchlisters.JobLister
	sets      appslisters.StatefulSetLister
	pdbs      policylisters.PodDisruptionBudgetLister
	podGroups cache.GenericLister // nil when the PodGroup CRD is not served
	pgClient  *v1alpha1.Client
	status    *statusWriter
	now       func() time.Time
	// logger is the scheduler's, for work outside a scheduling cycle
	// (informer handlers, timers).
	logger klog.Logger

	timersMu sync.Mutex
	timers   map[*time.Timer]bool // nil once the scheduler stopped
}

// New builds the plugin: validates args, adds the gang index to the pod
// informer (before informers start), and starts a PodGroup informer when the
// API server serves the PodGroup CRD.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, ok := obj.(*config.MusterGangArgs)
	if !ok {
		return nil, fmt.Errorf("%s: want args of type MusterGangArgs, got %T", Name, obj)
	}
	if err := config.ValidateMusterGangArgs(field.NewPath("pluginConfig").Key(Name).Child("args"), args); err != nil {
		return nil, err
	}
	p := &Plugin{handle: h, args: args, registry: registryFor(ctx, h.SharedInformerFactory()), now: time.Now, timers: map[*time.Timer]bool{},
		gangIndex: gangIndexPrefix + h.ProfileName(), logger: klog.FromContext(ctx).WithValues("plugin", Name, "profile", h.ProfileName())}
	go func() {
		<-ctx.Done()
		p.stopTimers()
	}()
	p.status = newStatusWriter(p)
	for _, l := range args.TopologyLevels {
		p.levels = append(p.levels, gang.Level{Name: l.Name, Label: l.NodeLabel})
	}
	registerMetrics()

	podInformer := h.SharedInformerFactory().Core().V1().Pods().Informer()
	profile := h.ProfileName()
	if err := podInformer.AddIndexers(cache.Indexers{p.gangIndex: func(obj interface{}) ([]string, error) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.SchedulerName != profile {
			return nil, nil
		}
		if key, ok := gang.KeyOf(pod); ok {
			return []string{key.String()}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("adding gang index: %w", err)
	}
	p.pods = podInformer.GetIndexer()
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onPodAdd,
		UpdateFunc: func(_, obj interface{}) { p.onPodChange(obj) },
		DeleteFunc: p.onPodDelete,
	}); err != nil {
		return nil, err
	}
	if args.GangPreemption {
		// Registered before the informers start, as DefaultPreemption does.
		p.pdbs = h.SharedInformerFactory().Policy().V1().PodDisruptionBudgets().Lister()
	}
	jobInformer := h.SharedInformerFactory().Batch().V1().Jobs()
	p.jobs = jobInformer.Lister()
	if _, err := jobInformer.Informer().AddEventHandler(p.ownerHandler(gang.KindJob)); err != nil {
		return nil, err
	}
	// A StatefulSet's replicas and pod management decide its quorum; the
	// handler wakes its pending members when they change.
	setInformer := h.SharedInformerFactory().Apps().V1().StatefulSets()
	p.sets = setInformer.Lister()
	if _, err := setInformer.Informer().AddEventHandler(p.ownerHandler(gang.KindStatefulSet)); err != nil {
		return nil, err
	}

	if err := p.startPodGroupInformer(ctx); err != nil {
		return nil, err
	}
	go p.status.run(ctx)
	return p, nil
}

// handlerCtx is the context for work outside a scheduling cycle: it carries
// the scheduler's logger.
func (p *Plugin) handlerCtx() context.Context {
	return klog.NewContext(context.Background(), p.logger)
}

// Name returns the plugin name.
func (p *Plugin) Name() string { return Name }

// startPodGroupInformer watches PodGroups when discovery shows the CRD, so
// the scheduler never waits on an API that is not served.
func (p *Plugin) startPodGroupInformer(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cfg := p.handle.KubeConfig()
	if cfg == nil {
		return nil
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	if !podGroupsServed(disco) {
		logger.Info("PodGroup API not served; PodGroup gangs are disabled until the CRD is installed and the scheduler restarted",
			"resource", v1alpha1.Resource.String())
		return nil
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	p.pgClient = v1alpha1.NewClient(dyn)
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	informer := factory.ForResource(v1alpha1.Resource)
	p.podGroups = informer.Lister()
	if _, err := informer.Informer().AddEventHandler(p.ownerHandler(gang.KindPodGroup)); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), informer.Informer().HasSynced) {
		return fmt.Errorf("PodGroup informer did not sync within 30s")
	}
	return nil
}

func podGroupsServed(disco discovery.DiscoveryInterface) bool {
	list, err := disco.ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	if err != nil || list == nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == v1alpha1.Resource.Resource {
			return true
		}
	}
	return false
}

// ownerHandler wakes a gang's pods when its Job, StatefulSet or PodGroup is
// added or changes its quorum. This is the only path by which an owner's
// change reaches the queue (see EventsToRegister): the handler runs on the
// informer whose lister the plugin reads, so the woken pods see the change.
func (p *Plugin) ownerHandler(kind gang.Kind) cache.ResourceEventHandler {
	wake := func(obj interface{}) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		key := gang.Key{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName()}
		p.activate(p.logger, p.members(key).pending)
		p.status.enqueue(key)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: wake,
		UpdateFunc: func(oldObj, obj interface{}) {
			if quorumUnchanged(oldObj, obj) {
				return // most status writes (ours included) change no quorum
			}
			wake(obj)
		},
	}
}

// quorumUnchanged reports whether an update of a gang's owner cannot change
// its quorum: the spec (metadata.generation) is the same and so are the
// counts of finished members the quorum subtracts (a Job's status, a
// PodGroup's status.succeeded).
func quorumUnchanged(oldObj, newObj interface{}) bool {
	o, err1 := meta.Accessor(oldObj)
	n, err2 := meta.Accessor(newObj)
	if err1 != nil || err2 != nil || o.GetGeneration() != n.GetGeneration() {
		return false
	}
	oj, ok1 := oldObj.(*batchv1.Job)
	nj, ok2 := newObj.(*batchv1.Job)
	if ok1 && ok2 {
		return oj.Status.Succeeded == nj.Status.Succeeded && oj.Status.Failed == nj.Status.Failed &&
			ptr.Deref(oj.Status.FailedIndexes, "") == ptr.Deref(nj.Status.FailedIndexes, "")
	}
	opg, ok1 := oldObj.(*unstructured.Unstructured)
	npg, ok2 := newObj.(*unstructured.Unstructured)
	if ok1 && ok2 {
		a, _, _ := unstructured.NestedFieldNoCopy(opg.Object, "status", "succeeded")
		b, _, _ := unstructured.NestedFieldNoCopy(npg.Object, "status", "succeeded")
		return a == b
	}
	return true
}

// after runs f after d unless the scheduler stops first. Pending timers hold
// the plugin (and through its handle the scheduler's caches), so they are
// stopped with the scheduler instead of firing minutes later.
func (p *Plugin) after(d time.Duration, f func()) {
	p.timersMu.Lock()
	defer p.timersMu.Unlock()
	if p.timers == nil {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		p.timersMu.Lock()
		delete(p.timers, t) // t is set: the lock was held while it was assigned
		p.timersMu.Unlock()
		f()
	})
	p.timers[t] = true
}

func (p *Plugin) stopTimers() {
	p.timersMu.Lock()
	defer p.timersMu.Unlock()
	for t := range p.timers {
		t.Stop()
	}
	p.timers = nil
}
