package sim

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

// driver is the simulator's scheduler driver: it builds the scheduler on
// the cluster model's client, pauses its loop while a step's changes are
// applied (barrier.go), waits until it has taken them in (delivery.go) and
// until it is idle again (settle.go), and reads its metrics (metrics.go).
type driver struct {
	sched *scheduler.Scheduler
	b     *built
	c     *cluster
	eng   *engine
	// pauser makes the short waits between two looks at the scheduler.
	pauser *pauser
	// parked and resumed hand the scheduling loop over at the barrier.
	parked, resumed chan struct{}
	// settleQuiet and stepTimeout are Options.SettleQuiet and StepTimeout.
	settleQuiet, stepTimeout time.Duration
	// confirmedBinds reads the bindings, each read once the scheduler's
	// cache has confirmed it (unconfirmedBind).
	confirmedBinds *bindReader
	metrics        schedMetrics
	stats          driverStats
}

// driverStats count what the driver did that the report shows.
type driverStats struct {
	// stalled counts the steps that did not settle within the step timeout.
	stalled int
	// podBackoffMoves and gangBackoffMoves count how often a settled step
	// moved the virtual clock past a pod's backoff or to muster's next timer.
	podBackoffMoves, gangBackoffMoves int
}

// newDriver builds the named scheduler on the cluster's client with its
// informers, adds the cluster's counting handlers (and the DRA claim
// controller) to them, and starts the informers; the scheduling loop is
// not started yet (start).
func newDriver(ctx context.Context, opts Options, c *cluster, eng *engine, waits *pauser) (*driver, error) {
	factory := scheduler.NewInformerFactory(c.cs, 0, nil)
	if opts.ReserveFault != nil && !isMuster(opts.Scheduler) {
		return nil, fmt.Errorf("ReserveFault is for muster only, not %s", opts.Scheduler)
	}
	b, err := buildScheduler(ctx, opts.Scheduler, c.cs, factory, eng.clock, opts.ReserveFault)
	if err != nil {
		return nil, err
	}
	c.b = b
	d := &driver{
		sched: b.sched, b: b, c: c, eng: eng, pauser: waits,
		parked: make(chan struct{}), resumed: make(chan struct{}),
		settleQuiet: opts.SettleQuiet, stepTimeout: opts.StepTimeout,
		metrics:        schedMetrics{scheduler: opts.Scheduler, profile: b.schedulerName},
		confirmedBinds: c.binds.reader(),
	}
	if err := c.counts.watch(factory, b.podGroups, len(c.plan.PDBs) > 0, c.dra != nil); err != nil {
		return nil, err
	}
	if err := c.watchDRA(factory); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	if err := d.sched.WaitForHandlersSync(ctx); err != nil {
		return nil, fmt.Errorf("waiting for scheduler handlers: %w", err)
	}
	if err := d.waitForDRA(ctx, opts.Scheduler); err != nil {
		return nil, err
	}
	if err := d.waitCaughtUp(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// start takes the metrics' starting values and runs the scheduling loop
// (behind the barrier) until ctx ends.
func (d *driver) start(ctx context.Context) {
	d.metrics.start()
	d.installBarrier(ctx)
	go d.sched.Run(ctx)
}

// waitForDRA waits until the scheduler's DRA manager holds every slice and
// resolves nvidia.com/gpu to the DeviceClass: its caches are filled by
// informer handlers of their own.
func (d *driver) waitForDRA(ctx context.Context, scheduler string) error {
	dra := d.c.dra
	if dra == nil {
		return nil
	}
	manager := d.sched.Profiles[d.b.schedulerName].SharedDRAManager()
	if manager == nil {
		return fmt.Errorf("scheduler %s has no DRA manager: is the DynamicResourceAllocation feature gate off?", scheduler)
	}
	dra.mu.Lock()
	dra.manager = manager
	dra.mu.Unlock()
	return d.waitFor(ctx, func() string {
		slices, err := manager.ResourceSlices().ListWithDeviceTaintRules()
		if err != nil {
			return err.Error()
		}
		if len(slices) != dra.stats.Nodes {
			return fmt.Sprintf("the DRA manager has %d ResourceSlices, want %d", len(slices), dra.stats.Nodes)
		}
		if manager.DeviceClassResolver().GetDeviceClass(configv1.DefaultGPUResourceName) == nil {
			return "the DRA manager does not resolve nvidia.com/gpu to a DeviceClass yet"
		}
		return ""
	})
}

// unschedulable reports whether pods wait in the unschedulable pool.
func (d *driver) unschedulable() bool {
	return len(d.sched.SchedulingQueue.UnschedulablePods()) > 0
}

// flushUnschedulable moves every pod of the unschedulable pool back to be
// retried, as kube-scheduler's periodic flush does for pods that waited
// there longer than 5 minutes (every one has, at a flush step).
func (d *driver) flushUnschedulable() {
	d.sched.SchedulingQueue.MoveAllToActiveOrBackoffQueue(klog.Background(), framework.EventUnschedulableTimeout, nil, nil, nil)
}
