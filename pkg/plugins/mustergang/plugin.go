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

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/apis/config"
	_ "github.com/muster-sched/muster/pkg/apis/config/scheme" // registers the args types
	"github.com/muster-sched/muster/pkg/gang"
)

// Name is the plugin name used in the scheduler configuration.
const Name = "MusterGang"

// ReasonPreempted is the reason of the Event on each victim's owner (or the
// victim pod). Events about a gang itself have its gang.Outcome as reason.
const ReasonPreempted = "Preempted"

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

// Plugin implements the MusterGang plugin: short adapters from the
// framework's extension points to the gang manager (pkg/gang), which keeps
// each gang's life, and the framework's own filters, which confirm each
// plan. The parts it is made of each keep their own state.
type Plugin struct {
	handle fwk.Handle
	args   *config.MusterGangArgs
	// gangs is the life of every gang, shared by the scheduler's profiles.
	gangs *gang.Manager
	// source says which gang a pod belongs to and what its owner asks.
	source *gangSource
	// nodes is what muster keeps of the nodes: classes, topology, views.
	nodes *nodeViews
	// dra counts the GPUs dynamic resource allocation serves.
	dra  *draGPUs
	pdbs policylisters.PodDisruptionBudgetLister // nil without gang preemption
	// status keeps PodGroup status in line; failedPlans records each
	// gang's last failed plan on its object.
	status      *statusWriter
	failedPlans *failedPlanWriter
	timers      *timers
	// evictions deletes the victims of preemptions.
	evictions *evictor
	// provisioning asks cluster-autoscaler for the nodes of gangs that do
	// not fit (nil when off or the API is not served).
	provisioning *provisioner
	// run is the scheduler's context with the plugin's logger, for work
	// outside a scheduling cycle (informer handlers, timers, evictions):
	// it ends when the scheduler stops.
	run context.Context
}

// Factory returns the plugin's factory on clock c (the real clock, or the
// simulator's virtual clock; plugins.Registry chooses). The instances it
// makes for one scheduler (one per profile, all on that scheduler's
// informer factory) share one gang manager, so every profile sees the
// capacity the others' plans hold. A harness that builds several
// schedulers from one registry (upstream's scheduler_perf does) gets a
// manager per scheduler: no gang state outlives the scheduler it was made
// in.
func Factory(c clock.WithDelayedExecution) frameworkruntime.PluginFactory {
	managers := &gangManagers{bySchedulers: map[informers.SharedInformerFactory]*gang.Manager{}}
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return newPlugin(ctx, obj, h, c, managers.of(ctx, h.SharedInformerFactory()))
	}
}

// gangManagers hands out one gang manager per scheduler, known by its
// informer factory, until the scheduler's context ends.
type gangManagers struct {
	mu           sync.Mutex
	bySchedulers map[informers.SharedInformerFactory]*gang.Manager
}

func (g *gangManagers) of(ctx context.Context, scheduler informers.SharedInformerFactory) *gang.Manager {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.bySchedulers[scheduler]
	if m == nil {
		m = gang.NewManager()
		g.bySchedulers[scheduler] = m
		go func() {
			<-ctx.Done()
			g.mu.Lock()
			defer g.mu.Unlock()
			delete(g.bySchedulers, scheduler)
		}()
	}
	return m
}

// newPlugin builds the plugin: validates args, adds the gang index to the pod
// informer (before informers start), and starts a PodGroup informer when the
// API server serves the PodGroup CRD.
func newPlugin(ctx context.Context, obj runtime.Object, h fwk.Handle, c clock.WithDelayedExecution, gangs *gang.Manager) (fwk.Plugin, error) {
	args, ok := obj.(*config.MusterGangArgs)
	if !ok {
		return nil, fmt.Errorf("%s: want args of type MusterGangArgs, got %T", Name, obj)
	}
	if err := config.ValidateMusterGangArgs(field.NewPath("pluginConfig").Key(Name).Child("args"), args); err != nil {
		return nil, err
	}
	nodes := newNodeViews(args)
	factory := h.SharedInformerFactory()
	p := &Plugin{handle: h, args: args, gangs: gangs, nodes: nodes, timers: newTimers(c),
		dra: newDRAGPUs(h, v1.ResourceName(args.GPUResourceName), args.GPUDeviceClasses, nodes.levels),
		run: klog.NewContext(ctx, klog.FromContext(ctx).WithValues("plugin", Name, "profile", h.ProfileName())),
		source: &gangSource{handle: h, gangs: gangs, levels: nodes.levels, gangIndex: gangIndexPrefix + h.ProfileName(),
			defaultTimeout: time.Duration(args.DefaultScheduleTimeoutSeconds) * time.Second,
			jobs:           factory.Batch().V1().Jobs().Lister(),
			sets:           factory.Apps().V1().StatefulSets().Lister()},
	}
	go func() {
		<-ctx.Done()
		p.timers.stop()
	}()
	p.evictions = &evictor{handle: h, gangs: gangs, source: p.source, clock: c}
	p.status = newStatusWriter(p.source, gangs)
	p.failedPlans = newFailedPlanWriter(h.ClientSet, p.source)
	registerMetrics()

	podInformer, err := p.addHandlers(factory)
	if err != nil {
		return nil, err
	}
	if err := p.watchPodGroups(ctx, podInformer.HasSynced); err != nil {
		return nil, err
	}
	if err := p.watchProvisioning(ctx, podInformer.HasSynced); err != nil {
		return nil, err
	}
	if args.GangPreemption {
		go func() {
			// Once this replica schedules: informers start when it leads.
			if cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
				factory.WaitForCacheSync(ctx.Done())
				p.evictions.resume(p.run)
			}
		}()
	}
	go p.status.run(ctx)
	go p.failedPlans.run(ctx)
	return p, nil
}

// addHandlers indexes pods by gang and registers the plugin's handlers on
// the informers of pods, nodes, DRA devices, PDBs and gang owners; it
// returns the pod informer.
func (p *Plugin) addHandlers(factory informers.SharedInformerFactory) (cache.SharedIndexInformer, error) {
	podInformer := factory.Core().V1().Pods().Informer()
	if err := podInformer.AddIndexers(cache.Indexers{p.source.gangIndex: gangIndexFunc(p.handle.ProfileName())}); err != nil {
		return nil, fmt.Errorf("adding gang index: %w", err)
	}
	p.source.pods = podInformer.GetIndexer()
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onPodAdd,
		UpdateFunc: p.onPodUpdate,
		DeleteFunc: p.onPodDelete,
	}); err != nil {
		return nil, err
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(p.nodeHandler()); err != nil {
		return nil, err
	}
	if p.dra.enabled() {
		// The same informer DynamicResources allocates from.
		if _, err := factory.Resource().V1().ResourceSlices().Informer().AddEventHandler(p.sliceHandler()); err != nil {
			return nil, err
		}
		// The scheduler applies DeviceTaintRules to its copy of the slices
		// through this informer, when the gate is on (and only then is the
		// API sure to be served).
		if utilfeature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules) {
			if _, err := factory.Resource().V1().DeviceTaintRules().Informer().AddEventHandler(
				p.taintRuleHandler(factory.Resource().V1().ResourceSlices().Lister())); err != nil {
				return nil, err
			}
		}
	}
	if p.args.GangPreemption {
		// Registered before the informers start, as DefaultPreemption does.
		p.pdbs = factory.Policy().V1().PodDisruptionBudgets().Lister()
	}
	if _, err := factory.Batch().V1().Jobs().Informer().AddEventHandler(p.ownerHandler(gang.KindJob)); err != nil {
		return nil, err
	}
	// A StatefulSet's replicas and pod management decide its quorum; the
	// handler wakes its pending members when they change.
	if _, err := factory.Apps().V1().StatefulSets().Informer().AddEventHandler(p.ownerHandler(gang.KindStatefulSet)); err != nil {
		return nil, err
	}
	return podInformer, nil
}

// handlerCtx is the context for work outside a scheduling cycle (run).
func (p *Plugin) handlerCtx() context.Context { return p.run }

// logger is the plugin's logger outside a scheduling cycle.
func (p *Plugin) logger() klog.Logger { return klog.FromContext(p.run) }

// Name returns the plugin name.
func (p *Plugin) Name() string { return Name }

func (p *Plugin) now() time.Time { return p.timers.now() }

// workloadGroups reports whether the scheduler keeps Kubernetes PodGroups
// (GenericWorkload), whose pods form gangs (workloadgroup.go).
func workloadGroups() bool {
	return utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload)
}
