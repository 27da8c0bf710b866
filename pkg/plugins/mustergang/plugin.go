// Package mustergang is the framework adapter of muster's gang scheduling: it
// plans a whole gang at once (pkg/gang), steers each member to its planned
// node, holds members at Permit until the whole plan is reserved, and
// releases everything when the gang cannot complete.
package mustergang

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	appslisters "k8s.io/client-go/listers/apps/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/apis/config"
	_ "github.com/muster-sched/muster/pkg/apis/config/scheme" // registers the args types
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// Name is the plugin name used in the scheduler configuration.
const Name = "MusterGang"

// ReasonPreempted is the reason of the Event on each victim's owner (or the
// victim pod). Events about a gang itself have its gang.Outcome as reason.
const ReasonPreempted = "Preempted"

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

// cachedView is a node's NodeView as of one NodeInfo generation, and the
// node's position in the last nodes list nodeViews saw.
type cachedView struct {
	info       fwk.NodeInfo
	generation int64
	draFree    int64 // the node's free DRA GPUs the view counts
	view       gang.NodeView
	pos        int
}

// Plugin implements the MusterGang plugin.
type Plugin struct {
	handle   fwk.Handle
	args     *config.MusterGangArgs
	levels   []gang.Level
	topology *gang.TopologyIndex // the nodes' domains at each level, kept between plans
	// views keeps each node's NodeView between plans, by NodeInfo generation.
	viewsMu   sync.Mutex
	views     map[string]cachedView
	lastViews []cachedView // by position in the last nodes list
	viewBuf   []gang.NodeView
	heldBuf   []gang.NodeView // viewBuf with other gangs' holdings taken out
	heldTaken []int           // the positions where heldBuf differs from viewBuf
	registry  *gang.Registry
	classes   nodeClasses
	// dra counts the GPUs dynamic resource allocation serves.
	dra *draGPUs
	// workloadGroups: the scheduler keeps Kubernetes PodGroups
	// (GenericWorkload), whose pods form gangs (workloadgroup.go).
	workloadGroups bool

	pods      cache.Indexer
	gangIndex string
	jobs      batchlisters.JobLister
	sets      appslisters.StatefulSetLister
	pdbs      policylisters.PodDisruptionBudgetLister
	podGroups cache.GenericLister // nil when the PodGroup CRD is not served
	pgClient  *v1alpha1.Client
	status    *statusWriter
	// failedPlans records each gang's last failed plan on its object.
	failedPlans *failedPlanWriter
	// clock is the real clock in a scheduler and the simulator's virtual
	// clock in muster-sim, so plan deadlines, gang backoff and avoidance
	// follow the same time as the scheduling queue.
	clock clock.WithDelayedExecution
	// logger is the scheduler's, for work outside a scheduling cycle
	// (informer handlers, timers).
	logger klog.Logger

	timersMu sync.Mutex
	timers   map[clock.Timer]bool // nil once the scheduler stopped
	// deadlines are the plan deadline timers by plan ID.
	deadlinesMu sync.Mutex
	deadlines   map[int64]clock.Timer
	// short are the gangs short of members with a check pending
	// (explainShortLater).
	shortMu sync.Mutex
	short   map[gang.Key]bool
}

// Factory returns the plugin's factory on clock c (the real clock, or the
// simulator's virtual clock; plugins.Registry chooses).
func Factory(c clock.WithDelayedExecution) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return newPlugin(ctx, obj, h, c)
	}
}

// newPlugin builds the plugin: validates args, adds the gang index to the pod
// informer (before informers start), and starts a PodGroup informer when the
// API server serves the PodGroup CRD.
func newPlugin(ctx context.Context, obj runtime.Object, h fwk.Handle, c clock.WithDelayedExecution) (fwk.Plugin, error) {
	args, ok := obj.(*config.MusterGangArgs)
	if !ok {
		return nil, fmt.Errorf("%s: want args of type MusterGangArgs, got %T", Name, obj)
	}
	if err := config.ValidateMusterGangArgs(field.NewPath("pluginConfig").Key(Name).Child("args"), args); err != nil {
		return nil, err
	}
	p := &Plugin{handle: h, args: args, registry: registryFor(ctx, h.SharedInformerFactory()), clock: c, timers: map[clock.Timer]bool{}, deadlines: map[int64]clock.Timer{}, short: map[gang.Key]bool{},
		gangIndex: gangIndexPrefix + h.ProfileName(), logger: klog.FromContext(ctx).WithValues("plugin", Name, "profile", h.ProfileName())}
	go func() {
		<-ctx.Done()
		p.stopTimers()
	}()
	p.status = newStatusWriter(p)
	p.failedPlans = newFailedPlanWriter(p)
	for _, l := range args.TopologyLevels {
		p.levels = append(p.levels, gang.Level{Name: l.Name, Label: l.NodeLabel, Attribute: l.DeviceAttribute})
	}
	p.topology = gang.NewTopologyIndex(p.levels)
	p.views = map[string]cachedView{}
	p.workloadGroups = utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload)
	p.dra = newDRAGPUs(h, v1.ResourceName(args.GPUResourceName), args.GPUDeviceClasses, p.levels)
	registerMetrics()

	podInformer := h.SharedInformerFactory().Core().V1().Pods().Informer()
	if err := podInformer.AddIndexers(cache.Indexers{p.gangIndex: gangIndexFunc(h.ProfileName())}); err != nil {
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
	if _, err := h.SharedInformerFactory().Core().V1().Nodes().Informer().AddEventHandler(p.nodeHandler()); err != nil {
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
	go p.failedPlans.run(ctx)
	return p, nil
}

// gangIndexFunc indexes the pods of profile by their gang.
func gangIndexFunc(profile string) cache.IndexFunc {
	return func(obj interface{}) ([]string, error) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.SchedulerName != profile {
			return nil, nil
		}
		key, ok := gang.KeyOf(pod)
		if !ok {
			return nil, nil
		}
		if key.Kind == gang.KindWorkloadPodGroup {
			// A basic PodGroup's quorum is its Job's or StatefulSet's:
			// the owner's handler finds the group through the pod.
			if owner, ok := gang.ControllerKey(pod); ok {
				return []string{key.String(), controlledBy(owner)}, nil
			}
		}
		return []string{key.String()}, nil
	}
}

// controlledBy is the gang index value of the pods in Kubernetes PodGroups
// whose controller is the Job or StatefulSet owner.
func controlledBy(owner gang.Key) string { return "controlled-by " + owner.String() }

// groupsControlledBy are the Kubernetes PodGroups of owner's pods.
func (p *Plugin) groupsControlledBy(owner gang.Key) []gang.Key {
	objs, _ := p.pods.ByIndex(p.gangIndex, controlledBy(owner))
	var groups []gang.Key
	for _, o := range objs {
		if key, ok := gang.KeyOf(o.(*v1.Pod)); ok && !slices.Contains(groups, key) {
			groups = append(groups, key)
		}
	}
	return groups
}

// handlerCtx is the context for work outside a scheduling cycle: it carries
// the scheduler's logger.
func (p *Plugin) handlerCtx() context.Context {
	return klog.NewContext(context.Background(), p.logger)
}

// Name returns the plugin name.
func (p *Plugin) Name() string { return Name }

// after runs f after d unless the scheduler stops first. Pending timers hold
// the plugin (and through its handle the scheduler's caches), so they are
// stopped with the scheduler instead of firing minutes later. It returns the
// timer (nil once the scheduler stopped) for stopTimer.
func (p *Plugin) after(d time.Duration, f func()) clock.Timer {
	p.timersMu.Lock()
	defer p.timersMu.Unlock()
	if p.timers == nil {
		return nil
	}
	var t clock.Timer
	t = p.clock.AfterFunc(d, func() {
		p.timersMu.Lock()
		delete(p.timers, t) // t is set: the lock was held while it was assigned
		p.timersMu.Unlock()
		f()
	})
	p.timers[t] = true
	return t
}

// stopTimer cancels a timer of after that has not fired yet.
func (p *Plugin) stopTimer(t clock.Timer) {
	if t == nil {
		return
	}
	p.timersMu.Lock()
	defer p.timersMu.Unlock()
	if p.timers[t] {
		t.Stop()
		delete(p.timers, t)
	}
}

// watchDeadline expires plan id of gang key after d unless endDeadline
// comes first.
func (p *Plugin) watchDeadline(key gang.Key, id int64, d time.Duration) {
	t := p.after(d, func() {
		p.deadlinesMu.Lock()
		delete(p.deadlines, id)
		p.deadlinesMu.Unlock()
		p.expirePlan(key, id)
	})
	if t == nil {
		return
	}
	p.deadlinesMu.Lock()
	p.deadlines[id] = t
	p.deadlinesMu.Unlock()
}

// endDeadline stops plan id's deadline timer once the plan is released or
// dropped: a timer left pending holds the plugin for minutes, and in the
// simulator each pending timer is a moment its virtual clock may move to.
func (p *Plugin) endDeadline(id int64) {
	p.deadlinesMu.Lock()
	t := p.deadlines[id]
	delete(p.deadlines, id)
	p.deadlinesMu.Unlock()
	p.stopTimer(t)
}

func (p *Plugin) now() time.Time { return p.clock.Now() }

func (p *Plugin) stopTimers() {
	p.timersMu.Lock()
	defer p.timersMu.Unlock()
	for t := range p.timers {
		t.Stop()
	}
	p.timers = nil
}
