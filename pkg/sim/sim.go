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
package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
	"k8s.io/kubernetes/pkg/scheduler"
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
	// cache, queues empty, no binding or eviction goroutine); the quiet
	// stretch covers the rest, such as a handler that confirmed a binding
	// and is about to wake pods that wait for it.
	SettleQuiet time.Duration
	// StepTimeout bounds the real time of one step (default 3m); a step that
	// never settles is counted in Details.StalledSteps.
	StepTimeout time.Duration
	// BindFault, when set, is asked before each binding; an error fails that
	// binding like an API server error would (fault injection in tests).
	BindFault func(pod *v1.Pod, node string) error
	// ReserveFault, when set (muster only), is asked at each Reserve after
	// MusterGang's, with the virtual time; an error fails that reservation
	// as another plugin's Reserve would, so muster drops the gang's plan and
	// backs the gang off (fault injection in tests; see fault.go).
	ReserveFault ReserveFault
}

// watchBuffer is the fake clientset's per-watcher event buffer. The fake
// panics when a watcher's buffer is full (default 100), and a step creates
// thousands of objects at once in the large scenarios.
const watchBuffer = 1 << 17

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
	d.StalledSteps = h.stalled
	d.ClockMovesPodBackoff, d.ClockMovesGangBackoff = h.podBackoffMoves, h.gangBackoffMoves
	d.EndReason = h.endReason
	d.Extra = h.extraMetrics()
	if d.DRA = h.draResult(); d.DRA != nil && d.DRA.ViolationCount > 0 {
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

// harness is the state of one run. Everything but the binding records and
// the observation counters belongs to the step loop's goroutine.
type harness struct {
	opts   Options
	plan   *scenario.Plan
	cs     *fake.Clientset
	b      *built
	sched  *scheduler.Scheduler
	clock  *clocktesting.FakeClock
	rec    *measure.Recorder
	counts *counters
	binds  *bindLog
	pauser *pauser

	cpu, memory resource.Quantity
	now         time.Duration
	events      eventQueue
	nodes       map[string]*nodeSpec // change it through addNode and removeNode
	// capacityGPUs is the GPUs of nodes, kept as nodes come and go: summing
	// them in every step's sample cost 1.5 ms at 15000 nodes.
	capacityGPUs int64
	slots        []string // spot slot → node filling it now ("" while empty)
	gangs        []*gangState
	podGang      map[string]*gangState
	nodePods     map[string]map[string]bool
	setup        time.Duration
	setupCPU     time.Duration
	stalled      int
	endReason    string
	stepIndex    uint64
	bindCursor   int
	// confirmedBinds counts the bindings the scheduler's cache has
	// confirmed (unconfirmedBind).
	confirmedBinds int
	// lastRejects is muster's count of dropped gang plans when last read;
	// gangRejectedInStep: one was dropped in this step.
	lastRejects        float64
	gangRejectedInStep bool
	// harnessFree, harnessGangs and fitCursor: free GPUs per node, the
	// gangs with pods on it (how many) and where the next first-fit search
	// starts, for the None scheduler.
	harnessFree  map[string]int64
	harnessGangs map[string]map[*gangState]int
	fitCursor    int
	// firstRelease is when the first step that created pods resumed the
	// scheduler; lastBind is the latest binding so far.
	firstRelease, lastBind time.Time
	// podBackoffMoves and gangBackoffMoves count how often a settled step
	// moved the virtual clock past a pod's backoff or to muster's next timer.
	podBackoffMoves, gangBackoffMoves int
	changes                           stepChanges
	deletions                         deletions
	// lowestPriority is the plan's lowest job priority; preemptionsBefore
	// is kube-scheduler's count of unfinished preemptions when the run began
	// (its metrics live in the process, across runs).
	lowestPriority    int32
	preemptionsBefore float64
	// flushPending: an evFlush is queued; lastWasFlush: the last step was
	// one (a flush that binds nothing queues no other).
	flushPending, lastWasFlush bool
	parked                     chan struct{}
	resumed                    chan struct{}
	baseline                   map[string]float64
	// resourceVersion numbers every write: the fake tracker keeps object
	// versions to itself, and the scheduler ignores an update whose
	// resourceVersion did not change.
	resourceVersion atomic.Int64
	// bg is the realistic background (background.go); domains the GPUs of
	// the largest rack and zone (TAS constraints).
	bg      *background
	domains domainGPUs
	// dra is the DRA cluster's record (dra.go), nil without DRA.
	dra *draCluster
}

// versioned gives obj the next resourceVersion of counter.
func versioned[T metav1.Object](counter *atomic.Int64, obj T) T {
	obj.SetResourceVersion(strconv.FormatInt(counter.Add(1), 10))
	return obj
}

type nodeSpec struct {
	name, rack, zone string
	gpus             int64
	spot             bool
	// dra: the node's GPUs are DRA devices (scenario.DRA).
	dra        bool
	slot       int
	generation int
}

type gangState struct {
	job     *scenario.Job
	jobObj  *batchv1.Job
	attempt int
	pods    []string
	bound   map[string]string // pod → node
	// cpuOnly are the current attempt's CPU-only members.
	cpuOnly map[string]bool
	running bool
	done    bool
}

// heldGPUs are the GPUs of the gang's bound members: every bound member's
// but those of the (few) CPU-only ones.
func (g *gangState) heldGPUs() int64 {
	gpuMembers := len(g.bound)
	for name := range g.cpuOnly {
		if _, bound := g.bound[name]; bound {
			gpuMembers--
		}
	}
	return int64(gpuMembers) * g.job.GPUs
}

// podGPUs are the GPUs member pod asks for.
func (g *gangState) podGPUs(pod string) int64 {
	if g.cpuOnly[pod] {
		return 0
	}
	return g.job.GPUs
}

func newHarness(ctx context.Context, opts Options, waits *pauser) (*harness, error) {
	plan := opts.Plan
	cpu, err := resource.ParseQuantity(plan.Scenario.Cluster.CPU)
	if err != nil {
		return nil, fmt.Errorf("cluster.cpu: %w", err)
	}
	memory, err := resource.ParseQuantity(plan.Scenario.Cluster.Memory)
	if err != nil {
		return nil, fmt.Errorf("cluster.memory: %w", err)
	}
	bg, err := newBackground(plan)
	if err != nil {
		return nil, err
	}
	h := &harness{
		opts: opts, plan: plan, cpu: cpu, memory: memory, bg: bg, domains: domainsOf(plan.Nodes),
		rec: measure.NewRecorder(opts.Scheduler), counts: &counters{}, binds: &bindLog{}, pauser: waits,
		nodes: map[string]*nodeSpec{}, podGang: map[string]*gangState{}, nodePods: map[string]map[string]bool{},
		clock:  clocktesting.NewFakeClock(epoch),
		parked: make(chan struct{}), resumed: make(chan struct{}),
	}
	if n := plan.DRANodes(); n > 0 {
		if opts.Scheduler == None {
			return nil, fmt.Errorf("scheduler %s binds pods itself and allocates no DRA devices; it cannot run a cluster with cluster.dra", None)
		}
		h.dra = newDRACluster(n)
	}
	setupStart, setupCPUStart := time.Now(), processCPU()

	watch.DefaultChanSize = watchBuffer
	h.cs = fake.NewSimpleClientset()
	h.cs.PrependReactor("create", "pods", h.bindReactor)
	h.cs.PrependReactor("delete", "pods", h.deleteReactor)
	for _, n := range plan.Nodes {
		spec := &nodeSpec{name: n.Name, rack: n.Rack, zone: n.Zone, gpus: n.GPUs, spot: n.Spot, dra: n.DRA, slot: n.Slot}
		h.addNode(spec)
		if n.Spot {
			h.slots = append(h.slots, n.Name)
		}
		// Nodes go straight into the tracker before the informers start:
		// they arrive in the initial list, not as thousands of watch events.
		nodeCPU, nodeMemory := h.nodeResources(spec.gpus)
		if err := h.cs.Tracker().Add(versioned(&h.resourceVersion, nodeObject(*spec, nodeCPU, nodeMemory))); err != nil {
			return nil, err
		}
	}

	if err := h.addDRA(); err != nil {
		return nil, err
	}

	factory := scheduler.NewInformerFactory(h.cs, 0, nil)
	if opts.ReserveFault != nil && !isMuster(opts.Scheduler) {
		return nil, fmt.Errorf("ReserveFault is for muster only, not %s", opts.Scheduler)
	}
	h.b, err = buildScheduler(ctx, opts.Scheduler, h.cs, factory, h.clock, opts.ReserveFault)
	if err != nil {
		return nil, err
	}
	h.sched = h.b.sched
	if err := h.counts.watch(factory, h.b.podGroups, len(plan.PDBs) > 0, h.dra != nil); err != nil {
		return nil, err
	}
	if err := h.watchDRA(factory); err != nil {
		return nil, err
	}
	if err := h.addBackground(); err != nil {
		return nil, err
	}
	// The initial list delivers every node as an add: wait for those too.
	h.counts.wanted[kindNodeAdd].Add(int64(len(plan.Nodes)))
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	if err := h.sched.WaitForHandlersSync(ctx); err != nil {
		return nil, fmt.Errorf("waiting for scheduler handlers: %w", err)
	}
	if err := h.waitForDRA(ctx); err != nil {
		return nil, err
	}
	if err := h.waitCaughtUp(ctx); err != nil {
		return nil, err
	}
	// Scheduler and plugin metrics live in the process's registry and add up
	// across runs in one process (tests, benchmarks): start from here.
	h.baseline = h.counterValues()
	h.lastRejects = gangRejections()
	if !isMuster(h.opts.Scheduler) {
		h.preemptionsBefore, _ = h.evictionsInFlight()
	}
	h.installBarrier(ctx)
	go h.sched.Run(ctx)
	h.setup, h.setupCPU = time.Since(setupStart), processCPU()-setupCPUStart

	for i := range plan.Jobs {
		j := &plan.Jobs[i]
		if i == 0 || j.Priority < h.lowestPriority {
			h.lowestPriority = j.Priority
		}
		g := &gangState{job: j, bound: map[string]string{}}
		h.gangs = append(h.gangs, g)
		heap.Push(&h.events, event{at: j.Submit, kind: evArrival, seq: j.Seq, gang: g})
	}
	for i, r := range plan.Reclaims {
		heap.Push(&h.events, event{at: r.At, kind: evNotice, seq: i, reclaim: &plan.Reclaims[i]})
	}
	return h, nil
}

// Event kinds, in the order they apply within one step: finished jobs free
// capacity first, then nodes change, then new jobs arrive.
const (
	evComplete = iota
	evNotice
	evDelete
	evReplace
	evPreempted
	evFlush
	evArrival
)

type event struct {
	at   time.Duration
	kind int
	seq  int
	// gang and attempt: arrivals, completions and preemptions (a completion
	// of an attempt a reclaim or preemption has since restarted is ignored).
	gang    *gangState
	attempt int
	// reclaim: notices; node: deletions; slot and generation: deletions and
	// replacements.
	reclaim    *scenario.Reclaim
	node       string
	slot       int
	generation int
	// background: replacements, the background pods of the deleted node.
	background []*bgPod
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	if q[i].seq != q[j].seq {
		return q[i].seq < q[j].seq
	}
	// One reclaim event deletes and replaces several nodes: a total order
	// keeps the seed's runs identical.
	if q[i].node != q[j].node {
		return q[i].node < q[j].node
	}
	return q[i].slot < q[j].slot
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (h *harness) loop(ctx context.Context) error {
	horizon := h.plan.Scenario.Horizon.Duration
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if h.events.Len() == 0 {
			h.endReason = h.finishedReason()
			if h.endReason != allFinished {
				// Nothing can change any more: the jobs left wait forever.
				// The run is carried to the horizon so makespan and
				// allocation count that wait instead of stopping the clock.
				h.now = horizon
				h.rec.Step(h.sample(), 0, 0, h.partialGangs())
				h.endReason += fmt.Sprintf("; the run is carried to the horizon (%s)", horizon)
			}
			break
		}
		next := h.events[0].at
		if next > horizon {
			h.endReason = fmt.Sprintf("horizon %s reached with events left", horizon)
			h.now = horizon
			h.rec.Step(h.sample(), 0, 0, h.partialGangs())
			break
		}
		binds, err := h.step(ctx, next)
		if err != nil {
			return err
		}
		h.scheduleFlush(binds)
	}
	bound := map[string]int{}
	for _, g := range h.gangs {
		if !g.done {
			bound[g.job.Name] = len(g.bound)
		}
	}
	h.rec.End(h.now, bound)
	h.opts.Progress.Done(h.progressState())
	return nil
}

const allFinished = "all jobs finished"

func (h *harness) finishedReason() string {
	waiting := 0
	for _, g := range h.gangs {
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
	h.stepIndex++
	h.cs.ClearActions() // the fake keeps a copy of every call otherwise
	if err := h.pause(ctx); err != nil {
		return 0, err
	}
	h.now = t
	h.changes.reset()
	h.gangRejectedInStep = false
	applyStart := time.Now()
	var margins time.Duration // deliberate waits, not scheduler work
	// settle may have moved the queue's clock past a backoff already.
	if at := epoch.Add(t); at.After(h.clock.Now()) {
		h.clock.SetTime(at)
	}

	var arriving []*gangState
	for h.events.Len() > 0 && h.events[0].at == t {
		e := heap.Pop(&h.events).(event)
		var err error
		switch e.kind {
		case evComplete:
			err = h.complete(ctx, e)
		case evNotice:
			err = h.notice(ctx, e)
		case evDelete:
			arriving, err = h.deleteNode(ctx, e, arriving)
		case evReplace:
			err = h.replaceNode(ctx, e)
		case evPreempted:
			arriving, err = h.restartPreempted(ctx, e, arriving)
		case evFlush:
			h.flushUnschedulable()
		case evArrival:
			h.rec.Submitted(e.gang.job.Name, e.gang.job.Workers, e.gang.job.GPUs, e.gang.job.Priority, t)
			arriving = append(arriving, e.gang)
		}
		if err != nil {
			return 0, err
		}
	}
	if len(h.changes.deletedBound)+len(h.changes.deletedQueue) > 0 {
		// Let every handler see the deletions before the same gangs' new
		// pods appear: muster forgets a gang whose pods are all gone, and
		// whether it did decides where a restarted gang queues.
		if err := h.waitCaughtUp(ctx); err != nil {
			return 0, err
		}
		marginStart := time.Now()
		h.pauser.pause(handlerMargin)
		margins += time.Since(marginStart)
	}
	h.rec.NeededForPriority(h.gpusBeyondFree(arriving))
	if err := h.submit(ctx, arriving); err != nil {
		return 0, err
	}
	if err := h.waitDelivered(ctx); err != nil {
		return 0, err
	}
	applied := time.Since(applyStart) - margins
	h.pauser.pause(handlerMargin)
	if v := klog.V(3); v.Enabled() {
		q := h.sched.SchedulingQueue
		v.Info("Simulator resumes the scheduler", "virtual", t, "activeQ", len(q.PodsInActiveQ()), "backoffQ", len(q.PodsInBackoffQ()),
			"unschedulable", len(q.UnschedulablePods()))
	}
	resumedAt := time.Now()
	if h.firstRelease.IsZero() && len(h.changes.created) > 0 {
		h.firstRelease = resumedAt
	}
	h.resume()
	busy, err := h.settle(ctx, resumedAt)
	if err != nil {
		return 0, err
	}
	binds := h.collectBinds(resumedAt)
	h.rec.Step(h.sample(), applied+busy, binds, h.partialGangs())
	if err := h.collectEvictions(ctx); err != nil {
		return 0, err
	}
	h.checkDRA()
	h.opts.Progress.Update(h.progressState())
	return binds, nil
}

func (h *harness) complete(ctx context.Context, e event) error {
	g := e.gang
	if g.done || !g.running || g.attempt != e.attempt {
		return nil // a reclaim restarted the gang since
	}
	if err := h.deletePods(ctx, g); err != nil {
		return err
	}
	g.running, g.done = false, true
	h.rec.Completed(g.job.Name, h.now)
	h.counts.want(kindJobDelete)
	if err := h.cs.BatchV1().Jobs(namespace).Delete(ctx, g.job.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return h.deletePodGroup(ctx, g)
}

func (h *harness) deletePodGroup(ctx context.Context, g *gangState) error {
	if !h.b.podGroups {
		return nil
	}
	h.counts.want(kindPodGroupDelete)
	return h.cs.SchedulingV1beta1().PodGroups(namespace).Delete(ctx, podGroupName(g.job, g.attempt), metav1.DeleteOptions{})
}

// deletePods deletes every pod of the gang's current attempt.
func (h *harness) deletePods(ctx context.Context, g *gangState) error {
	for _, name := range g.pods {
		h.counts.want(kindPodDelete)
		h.deletions.mine(name)
		if err := h.cs.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting pod %s: %w", name, err)
		}
		ref := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("pod-" + name)}}
		if node, ok := g.bound[name]; ok && h.b.harnessBinds {
			h.harnessFree[node] += g.podGPUs(name)
			if h.harnessGangs[node][g]--; h.harnessGangs[node][g] == 0 {
				delete(h.harnessGangs[node], g)
			}
		}
		if node, ok := g.bound[name]; ok {
			delete(h.nodePods[node], name)
			h.changes.deletedBound = append(h.changes.deletedBound, ref)
		} else {
			if h.b.podGroups {
				ref.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To(podGroupName(g.job, g.attempt))}
			}
			h.changes.deletedQueue = append(h.changes.deletedQueue, ref)
		}
		delete(h.podGang, name)
	}
	g.pods, g.bound, g.cpuOnly = nil, map[string]string{}, nil
	return nil
}

// notice taints the nodes filling the event's spot slots; they are deleted
// Notice later.
func (h *harness) notice(ctx context.Context, e event) error {
	churn := h.plan.Scenario.Churn
	for _, slot := range e.reclaim.Slots {
		name := h.slots[slot]
		if name == "" {
			continue // already reclaimed and not yet replaced
		}
		node, err := h.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, reclaimTaint())
		h.counts.want(kindNodeUpdate)
		if _, err := h.cs.CoreV1().Nodes().Update(ctx, versioned(&h.resourceVersion, node), metav1.UpdateOptions{}); err != nil {
			return err
		}
		h.slots[slot] = ""
		h.changes.tainted = append(h.changes.tainted, name)
		heap.Push(&h.events, event{at: h.now + h.plan.Scenario.Quantize(churn.Notice.Duration), kind: evDelete, seq: e.seq, node: name, slot: slot})
	}
	return nil
}

// deleteNode removes a reclaimed node. Every gang with a pod on it loses the
// whole gang (a MultiWorkerMirroredStrategy job cannot go on without a
// peer): its pods are deleted and it is resubmitted in this step.
func (h *harness) deleteNode(ctx context.Context, e event, arriving []*gangState) ([]*gangState, error) {
	var broken []*gangState
	seen := map[*gangState]bool{}
	pods := make([]string, 0, len(h.nodePods[e.node]))
	for pod := range h.nodePods[e.node] {
		pods = append(pods, pod)
	}
	sort.Strings(pods)
	for _, pod := range pods {
		if g := h.podGang[pod]; g != nil && !seen[g] {
			seen[g] = true
			broken = append(broken, g)
		}
	}
	for _, g := range broken {
		h.rec.Broken(g.job.Name, h.now)
		var err error
		if arriving, err = h.restart(ctx, g, arriving); err != nil {
			return nil, err
		}
	}
	bgPods, err := h.deleteBackgroundOn(ctx, e.node)
	if err != nil {
		return nil, err
	}
	h.counts.want(kindNodeDelete)
	if err := h.cs.CoreV1().Nodes().Delete(ctx, e.node, metav1.DeleteOptions{}); err != nil {
		return nil, err
	}
	spec := h.removeNode(e.node)
	delete(h.nodePods, e.node)
	if spec.dra {
		if err := h.deleteSlice(ctx, e.node); err != nil {
			return nil, err
		}
	}
	if after := h.plan.Scenario.Churn.ReplaceAfter.Duration; after > 0 {
		heap.Push(&h.events, event{at: h.now + h.plan.Scenario.Quantize(after), kind: evReplace, seq: e.seq, slot: e.slot,
			generation: spec.generation + 1, background: bgPods})
	}
	return arriving, nil
}

// restart stops every pod of the gang's current attempt and resubmits the
// gang as its next attempt in this step.
func (h *harness) restart(ctx context.Context, g *gangState, arriving []*gangState) ([]*gangState, error) {
	if err := h.deletePods(ctx, g); err != nil {
		return nil, err
	}
	if err := h.deletePodGroup(ctx, g); err != nil {
		return nil, err
	}
	g.running = false
	g.attempt++
	return append(arriving, g), nil
}

// replaceNode adds a new spot node where a reclaimed one was (same rack and
// zone, a new name).
func (h *harness) replaceNode(ctx context.Context, e event) error {
	var orig scenario.Node
	for _, n := range h.plan.Nodes {
		if n.Slot == e.slot {
			orig = n
		}
	}
	spec := &nodeSpec{name: fmt.Sprintf("%s-g%d", orig.Name, e.generation), rack: orig.Rack, zone: orig.Zone, gpus: orig.GPUs,
		spot: true, dra: orig.DRA, slot: e.slot, generation: e.generation}
	h.counts.want(kindNodeAdd)
	nodeCPU, nodeMemory := h.nodeResources(spec.gpus)
	if _, err := h.cs.CoreV1().Nodes().Create(ctx, versioned(&h.resourceVersion, nodeObject(*spec, nodeCPU, nodeMemory)), metav1.CreateOptions{}); err != nil {
		return err
	}
	if spec.dra {
		// The driver publishes the new node's GPUs once it runs there.
		if err := h.createSlice(ctx, spec.name, spec.gpus); err != nil {
			return err
		}
	}
	h.addNode(spec)
	h.slots[e.slot] = spec.name
	return h.recreateBackground(ctx, e.background, spec.name)
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
	if h.b.podGroups {
		for _, g := range arriving {
			h.counts.want(kindPodGroupAdd)
			if _, err := h.cs.SchedulingV1beta1().PodGroups(namespace).Create(ctx, versioned(&h.resourceVersion, podGroupObject(g.job, g.attempt, h.now, h.topologyKey(g.job))), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		if err := h.waitCaughtUp(ctx); err != nil {
			return err
		}
	}

	type podRef struct {
		g     *gangState
		index int
	}
	var refs []podRef
	for _, g := range arriving {
		if g.jobObj == nil {
			g.jobObj = jobObject(g.job, h.b.schedulerName, h.now)
		}
		for i := 0; i < g.job.Members(); i++ {
			refs = append(refs, podRef{g, i})
		}
	}
	if h.plan.Scenario.Workload.PodOrder == "interleaved" {
		rng := rand.New(rand.NewPCG(h.plan.Seed, scenario.StreamPodOrder+h.stepIndex))
		rng.Shuffle(len(refs), func(i, j int) { refs[i], refs[j] = refs[j], refs[i] })
	}
	cpuMember := v1.ResourceList{v1.ResourceCPU: h.bg.memberCPU, v1.ResourceMemory: h.bg.memMem}
	for _, r := range refs {
		pod := podObject(r.g.job, r.g.jobObj, h.b, r.g.attempt, r.index, h.now, cpuMember, h.plan.Scenario.Workload.AntiAffinity)
		if r.index >= r.g.job.Workers {
			if r.g.cpuOnly == nil {
				r.g.cpuOnly = map[string]bool{}
			}
			r.g.cpuOnly[pod.Name] = true
		}
		if h.b.harnessBinds {
			node, err := h.firstFit(r.g, pod.Name)
			if err != nil {
				return err
			}
			pod.Spec.NodeName = node
			pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue})
		}
		r.g.pods = append(r.g.pods, pod.Name)
		h.podGang[pod.Name] = r.g
		h.counts.want(kindPodAdd)
		if _, err := h.cs.CoreV1().Pods(namespace).Create(ctx, versioned(&h.resourceVersion, pod), metav1.CreateOptions{}); err != nil {
			return err
		}
		if h.b.harnessBinds {
			h.binds.add(bindRecord{pod: pod.Name, uid: pod.UID, node: pod.Spec.NodeName, at: time.Now()})
		}
		h.changes.created = append(h.changes.created, pod)
	}
	// The scheduler's pod handler may lag behind the Job informer: a pod it
	// took in after its Job appeared would see its gang half-created.
	if err := h.waitFor(ctx, h.createdPodsQueued); err != nil {
		return err
	}
	for _, g := range arriving {
		if g.attempt > 0 {
			continue // a restarted gang keeps its Job
		}
		h.counts.want(kindJobAdd)
		if _, err := h.cs.BatchV1().Jobs(namespace).Create(ctx, versioned(&h.resourceVersion, g.jobObj), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// collectBinds applies the bindings made in this step to the gangs, and
// records every gang whose last member was bound. A gang's latency runs from
// the moment the scheduler was resumed in this step to its last binding.
func (h *harness) collectBinds(resumedAt time.Time) int {
	records := h.binds.since(h.bindCursor)
	h.bindCursor += len(records)
	lastBind := map[*gangState]time.Time{}
	var touched []*gangState
	for _, r := range records {
		g := h.podGang[r.pod]
		if g == nil {
			continue // deleted since (cannot happen: the reactor checks)
		}
		if _, ok := lastBind[g]; !ok {
			touched = append(touched, g)
		}
		g.bound[r.pod] = r.node
		if h.nodePods[r.node] == nil {
			h.nodePods[r.node] = map[string]bool{}
		}
		h.nodePods[r.node][r.pod] = true
		lastBind[g] = r.at
		if r.at.After(h.lastBind) {
			h.lastBind = r.at
		}
	}
	for _, g := range touched {
		if g.running || len(g.bound) < g.job.Members() {
			continue
		}
		g.running = true
		heap.Push(&h.events, event{at: h.now + g.job.Duration, kind: evComplete, seq: g.job.Seq, gang: g, attempt: g.attempt})
		// The harness's own binds (None) happen as it creates the pods,
		// before the step resumes any scheduler: no scheduler latency.
		latency := max(lastBind[g].Sub(resumedAt), 0)
		h.rec.Placed(g.job.Name, h.now, latency, h.placement(g))
	}
	return len(records)
}

func (h *harness) placement(g *gangState) measure.Placement {
	nodes := make([]string, 0, len(g.bound))
	for _, node := range g.bound {
		nodes = append(nodes, node)
	}
	return measure.PlacementOf(nodes, func(n string) string { return h.nodes[n].rack }, func(n string) bool { return h.nodes[n].spot })
}

func (h *harness) partialGangs() []string {
	var out []string
	for _, g := range h.gangs {
		if n := len(g.bound); n > 0 && n < g.job.Members() {
			out = append(out, g.job.Name)
		}
	}
	return out
}

func (h *harness) addNode(spec *nodeSpec) {
	h.nodes[spec.name] = spec
	h.capacityGPUs += spec.gpus
}

func (h *harness) removeNode(name string) *nodeSpec {
	spec := h.nodes[name]
	delete(h.nodes, name)
	h.capacityGPUs -= spec.gpus
	return spec
}

func (h *harness) sample() measure.Sample {
	s := measure.Sample{T: h.now.Seconds(), CapacityGPUs: h.capacityGPUs}
	for _, g := range h.gangs {
		held := g.heldGPUs()
		s.HeldGPUs += held
		if g.running {
			s.RunningGPUs += held
		}
	}
	return s
}

func (h *harness) progressState() ProgressState {
	st := ProgressState{Virtual: h.now, Total: len(h.gangs)}
	for _, g := range h.gangs {
		switch {
		case g.done:
			st.Done++
		case g.running:
			st.Running++
		}
	}
	return st
}

// bindLog records the bindings the reactor performed, in order.
type bindLog struct {
	mu      sync.Mutex
	records []bindRecord
}

type bindRecord struct {
	pod, node string
	uid       types.UID
	at        time.Time
}

func (l *bindLog) add(r bindRecord) {
	l.mu.Lock()
	l.records = append(l.records, r)
	l.mu.Unlock()
}

func (l *bindLog) since(i int) []bindRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bindRecord(nil), l.records[i:]...)
}

// firstFit picks a node for member pod of g under the None scheduler: the
// next node, in the plan's order from where the last search ended, with
// the GPUs free (the background's GPU pods count) and, when the workload
// asks for anti-affinity, no noisy pod (for a worker) and no pod of another
// gang. It fails when no node qualifies: None runs only scenarios in which
// every pod fits.
func (h *harness) firstFit(g *gangState, pod string) (string, error) {
	nodes := h.plan.Nodes
	if h.harnessFree == nil {
		h.harnessFree = make(map[string]int64, len(nodes))
		h.harnessGangs = make(map[string]map[*gangState]int, len(nodes))
		for _, n := range nodes {
			h.harnessFree[n.Name] = n.GPUs - h.bg.gpusOn(n.Name)
			h.harnessGangs[n.Name] = map[*gangState]int{}
		}
	}
	gpus := g.podGPUs(pod)
	anti := h.plan.Scenario.Workload.AntiAffinity
	fits := func(name string) bool {
		if _, exists := h.nodes[name]; !exists || h.harnessFree[name] < gpus {
			return false
		}
		if anti == nil {
			return true
		}
		if anti.NoisyPods && !g.cpuOnly[pod] && h.bg.noisyOn(name) {
			return false
		}
		if anti.OtherGangs {
			for other := range h.harnessGangs[name] {
				if other != g {
					return false
				}
			}
		}
		return true
	}
	for i := 0; i < len(nodes); i++ {
		name := nodes[(h.fitCursor+i)%len(nodes)].Name
		if fits(name) {
			h.harnessFree[name] -= gpus
			h.harnessGangs[name][g]++
			h.fitCursor = (h.fitCursor + i) % len(nodes)
			return name, nil
		}
	}
	return "", fmt.Errorf("scheduler %s: no node has %d GPUs free and room under the workload's anti-affinity; it runs only scenarios in which every pod fits", None, gpus)
}

// topologyKey is the topology constraint of a job's PodGroup: none but for
// native gang scheduling with TAS.
func (h *harness) topologyKey(j *scenario.Job) string {
	if !h.b.rackConstraints {
		return ""
	}
	return topologyKeyFor(j, h.domains)
}

// processCPU is the CPU time (user and system) this process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
