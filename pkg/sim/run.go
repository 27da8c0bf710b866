// Package sim runs the real kube-scheduler (scheduler.New, with muster's
// plugins and shipped profile, or the default profile, or the default profile
// with native gang scheduling) against a simulated cluster: a client-go fake
// clientset whose binding subresource is recorded, nodes and pods with UIDs,
// and a virtual clock that decides when jobs arrive, run and finish, and when
// spot nodes are reclaimed. No API server runs.
//
// A run is a sequence of steps. Each step applies everything due at one
// virtual instant (completions, reclaims, arrivals), then lets the scheduler
// work on the real clock until it is idle, then records what is bound. The
// scheduling queue's clock follows the virtual clock, so pod backoff (1-10 s)
// is short next to job run times, as in a real cluster, and does not depend on
// how fast this machine is.
//
// A run has three parts, composed by the harness: the event engine
// (engine.go: virtual clock, events, the step loop), the cluster model
// (cluster.go and the files it names: objects, reactors, the gangs' and
// nodes' bookkeeping) and the scheduler driver (driver.go: pause, delivery,
// settle, metrics).
package sim

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// Options configure one scheduler's run.
type Options struct {
	Plan      *scenario.Plan
	Scheduler string
	// Progress receives a progress bar (nil: none).
	Progress *Progress
	// SettleQuiet is how long the scheduler must stay idle before a step
	// counts as settled (default 1ms). What the simulator can check it does
	// (every change delivered, every binding confirmed in the scheduler's
	// cache, every deleted ResourceClaim gone from its claim cache, queues
	// empty, no binding or eviction goroutine); the quiet
	// stretch covers the rest, such as a handler that confirmed a binding
	// and is about to wake pods that wait for it.
	SettleQuiet time.Duration
	// StepTimeout bounds the real time of one step (default 3m); a step that
	// never settles is counted in Details.StalledSteps.
	StepTimeout time.Duration
	// BindFault, when set, is asked before each binding; an error fails that
	// binding like an API server error would (fault injection in tests).
	BindFault func(pod *v1.Pod, node string) error
	// HeapProfiles, when set, is a directory where a soak (scenario soak
	// block) writes a heap profile at each sample,
	// <scheduler>.heap-<hours>h.pprof: `go tool pprof -base` of two of
	// them says which allocation sites the heap grew at.
	HeapProfiles string
	// CPUProfiles, when set, is a directory where a soak writes the CPU
	// profile of each period between two samples,
	// <scheduler>.cpu-<hours>h.pprof named by the period's end: `go tool
	// pprof -diff_base` of an early and a late one says what a day's work
	// came to cost more.
	CPUProfiles string
	// ReserveFault, when set (muster only), is asked at each Reserve after
	// MusterGang's, with the virtual time; an error fails that reservation
	// as another plugin's Reserve would, so muster drops the gang's plan
	// and backs the gang off (fault injection in tests; see fault.go).
	ReserveFault ReserveFault
}

// Run runs one scheduler through the plan in this process.
func Run(ctx context.Context, opts Options) (*measure.Run, error) {
	if opts.SettleQuiet == 0 {
		opts.SettleQuiet = time.Millisecond
	}
	if opts.StepTimeout == 0 {
		opts.StepTimeout = 3 * time.Minute
	}
	wallStart := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	waits := newPauser()
	defer waits.close()
	h, err := newHarness(ctx, opts, waits)
	if err != nil {
		return nil, err
	}
	loopStart, loopCPUStart := time.Now(), processCPU()
	if err := h.loop(ctx); err != nil {
		return nil, err
	}
	loopWall, loopCPU := time.Since(loopStart), processCPU()-loopCPUStart
	m, d, series, gangs := h.rec.Result()
	d.SetupSeconds = h.setup.Seconds()
	d.SetupCPUSeconds = h.setupCPU.Seconds()
	d.LoopWallSeconds, d.LoopCPUSeconds = loopWall.Seconds(), loopCPU.Seconds()
	if !h.firstRelease.IsZero() && h.lastBind.After(h.firstRelease) {
		d.SpanSeconds = h.lastBind.Sub(h.firstRelease).Seconds()
	}
	st := h.driver.stats
	d.StalledSteps = st.stalled
	d.ClockMovesPodBackoff, d.ClockMovesGangBackoff = st.podBackoffMoves, st.gangBackoffMoves
	d.EndReason = h.endReason
	d.Extra = h.driver.metrics.extra()
	if h.soak != nil {
		h.soak.finish(h, h.engine.now) // at the end, every job done
		d.Soak = h.soak.samples
	}
	d.RefusedJobPatches = h.cluster.refusedPatches.Load()
	if d.DRA = h.cluster.draResult(); d.DRA != nil && d.DRA.ViolationCount > 0 {
		return nil, fmt.Errorf("%s on %s seed %d broke %d DRA checks, first: %s", opts.Scheduler, opts.Plan.Scenario.Name, opts.Plan.Seed,
			d.DRA.ViolationCount, strings.Join(d.DRA.Violations, "; "))
	}
	d.WallSeconds = time.Since(wallStart).Seconds()
	return &measure.Run{
		Scenario: opts.Plan.Scenario.Name, Seed: opts.Plan.Seed,
		Nodes: len(opts.Plan.Nodes), GPUs: opts.Plan.TotalGPUs(),
		Metrics: m, Details: d, Series: series, Gangs: gangs,
		Segments: h.rec.Segments(), FirstSubmitS: h.rec.FirstSubmit().Seconds(), EndS: h.rec.EndTime().Seconds(),
	}, nil
}

// harness is one run: the event engine, the cluster model and the
// scheduler driver, and what the run records across them. Everything but
// what the reactors and informer handlers record belongs to the step
// loop's goroutine.
type harness struct {
	opts    Options
	engine  *engine
	cluster *cluster
	driver  *driver
	rec     *measure.Recorder
	// setup and setupCPU are the real and CPU time from the cluster's
	// creation until the scheduler ran.
	setup, setupCPU time.Duration
	endReason       string
	// firstRelease is when the first step that created pods resumed the
	// scheduler; lastBind is the latest binding so far.
	firstRelease, lastBind time.Time
	// soak samples what the scheduler keeps (nil without a soak block).
	soak *soakSampler
}

func newHarness(ctx context.Context, opts Options, waits *pauser) (*harness, error) {
	setupStart, setupCPUStart := time.Now(), processCPU()
	h := &harness{opts: opts, engine: newEngine(opts.Plan.Scenario), rec: measure.NewRecorder(opts.Scheduler)}
	if opts.Plan.Scenario.Soak != nil {
		h.rec.ForgetFinished() // a soak measures the scheduler's memory, not a log of every job
	}
	var err error
	if h.cluster, err = newCluster(opts, h.engine, h.rec); err != nil {
		return nil, err
	}
	if h.driver, err = newDriver(ctx, opts, h.cluster, h.engine, waits); err != nil {
		return nil, err
	}
	h.driver.start(ctx)
	h.soak = newSoakSampler(h)
	h.setup, h.setupCPU = time.Since(setupStart), processCPU()-setupCPUStart
	return h, nil
}

// loop runs every step, then carries the run to its end.
func (h *harness) loop(ctx context.Context) error {
	stop, err := h.engine.run(ctx, h.step, h.driver.unschedulable)
	if err != nil {
		return err
	}
	horizon := h.opts.Plan.Scenario.Horizon.Duration
	switch stop {
	case drained:
		h.endReason = h.finishedReason()
		if h.endReason != allFinished {
			// Nothing can change any more: the jobs left wait forever.
			// The run is carried to the horizon so makespan and
			// allocation count that wait instead of stopping the clock.
			h.engine.now = horizon
			h.rec.Step(h.cluster.sample(), 0, 0, h.cluster.partialGangs())
			h.endReason += fmt.Sprintf("; the run is carried to the horizon (%s)", horizon)
		}
	case beyondHorizon:
		h.endReason = fmt.Sprintf("horizon %s reached with events left", horizon)
		h.engine.now = horizon
		h.rec.Step(h.cluster.sample(), 0, 0, h.cluster.partialGangs())
	}
	bound := map[string]int{}
	for _, g := range h.cluster.work.gangs {
		if !g.done {
			bound[g.job.Name] = len(g.bound)
		}
	}
	h.rec.End(h.engine.now, bound)
	h.opts.Progress.Done(h.cluster.progressState())
	return nil
}

const allFinished = "all jobs finished"

func (h *harness) finishedReason() string {
	waiting := 0
	for _, g := range h.cluster.work.gangs {
		if !g.done {
			waiting++
		}
	}
	if waiting == 0 {
		return allFinished
	}
	return fmt.Sprintf("no event left; %d jobs can never run", waiting)
}

// step applies every event due at t while the scheduling loop is paused,
// lets the scheduler work until it is idle, and records the outcome. The
// scheduler's busy time is the time to apply the step's changes (its event
// handlers run meanwhile) plus the time from resuming it until it is idle.
func (h *harness) step(ctx context.Context, t time.Duration) (int, error) {
	c, d := h.cluster, h.driver
	h.engine.steps++
	c.cs.ClearActions() // the fake keeps a copy of every call otherwise
	if err := d.pause(ctx); err != nil {
		return 0, err
	}
	c.changes.reset()
	d.metrics.newStep()
	applyStart := time.Now()
	var margins time.Duration // deliberate waits, not scheduler work
	// settle may have moved the queue's clock past a backoff already.
	h.engine.begin(t)

	arriving, err := h.applyDue(ctx, t)
	if err != nil {
		return 0, err
	}
	if len(c.changes.deletedBound)+len(c.changes.deletedQueue) > 0 {
		// Let every handler see the deletions before the same gangs' new
		// pods appear: muster forgets a gang whose pods are all gone, and
		// whether it did decides where a restarted gang queues.
		if err := d.waitCaughtUp(ctx); err != nil {
			return 0, err
		}
		marginStart := time.Now()
		d.pauser.pause(handlerMargin)
		margins += time.Since(marginStart)
	}
	h.rec.NeededForPriority(c.gpusBeyondFree(arriving))
	if err := h.submit(ctx, arriving); err != nil {
		return 0, err
	}
	if err := d.waitDelivered(ctx); err != nil {
		return 0, err
	}
	applied := time.Since(applyStart) - margins
	d.pauser.pause(handlerMargin)
	if v := klog.V(3); v.Enabled() {
		q := d.sched.SchedulingQueue
		v.Info("Simulator resumes the scheduler", "virtual", t, "activeQ", len(q.PodsInActiveQ()), "backoffQ", len(q.PodsInBackoffQ()),
			"unschedulable", len(q.UnschedulablePods()))
	}
	resumedAt := time.Now()
	if h.firstRelease.IsZero() && len(c.changes.created) > 0 {
		h.firstRelease = resumedAt
	}
	d.resume()
	busy, err := d.settle(ctx, resumedAt)
	if err != nil {
		return 0, err
	}
	binds, last := c.collectBinds(resumedAt)
	if last.After(h.lastBind) {
		h.lastBind = last
	}
	h.rec.Step(c.sample(), applied+busy, binds, c.partialGangs())
	if err := c.collectEvictions(ctx); err != nil {
		return 0, err
	}
	c.checkDRA()
	h.soak.maybe(h, t)
	h.opts.Progress.Update(c.progressState())
	return binds, nil
}

// applyDue applies the events due by virtual time t to the cluster, and
// returns the gangs that arrive (new, or restarted after losing a member).
func (h *harness) applyDue(ctx context.Context, t time.Duration) ([]*gangState, error) {
	c, d := h.cluster, h.driver
	var arriving []*gangState
	for {
		e, ok := h.engine.due()
		if !ok {
			return arriving, nil
		}
		var err error
		switch e.kind {
		case evComplete:
			err = c.complete(ctx, e)
		case evNotice:
			err = c.notice(ctx, e)
		case evDelete:
			arriving, err = c.deleteNode(ctx, e, arriving)
		case evReplace:
			err = c.replaceNode(ctx, e)
		case evPreempted:
			arriving, err = c.restartPreempted(ctx, e, arriving)
		case evFlush:
			h.engine.flushing()
			d.flushUnschedulable()
		case evArrival:
			h.rec.Submitted(e.gang.job.Name, e.gang.job.Workers, e.gang.job.GPUs, e.gang.job.Priority, t)
			arriving = append(arriving, e.gang)
		}
		if err != nil {
			return nil, err
		}
	}
}

// submit creates what arriving gangs need, in an order that lets the
// scheduler see each gang whole: native PodGroups first (pods whose PodGroup
// the scheduler has not seen wait apart), then every pod with a scheduling
// gate (interleaved across gangs or job by job), then the Jobs. Until its Job
// exists muster does not treat a pod as a gang member, so no plugin ever
// observes a half-created gang; waitDelivered lifts the gates once all of it
// is in place.
func (h *harness) submit(ctx context.Context, arriving []*gangState) error {
	if len(arriving) == 0 {
		return nil
	}
	c, d := h.cluster, h.driver
	for _, g := range arriving {
		c.work.arrived(g)
	}
	if c.b.podGroups {
		if err := c.createPodGroups(ctx, arriving); err != nil {
			return err
		}
		if err := d.waitCaughtUp(ctx); err != nil {
			return err
		}
	}
	if err := c.createPods(ctx, arriving); err != nil {
		return err
	}
	// The scheduler's pod handler may lag behind the Job informer: a pod it
	// took in after its Job appeared would see its gang half-created.
	if err := d.waitFor(ctx, d.createdPodsQueued); err != nil {
		return err
	}
	return c.createJobs(ctx, arriving)
}

// processCPU is the CPU time (user and system) this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
