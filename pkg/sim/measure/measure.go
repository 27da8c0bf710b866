// Package measure records what happens in one simulator run (submissions,
// placements, completions, what the cluster holds after every step) and
// computes the benchmark's metrics from that record. It knows nothing of the
// scheduler, so every definition can be tested on a hand-written record.
// BENCHMARKS.md states the same definitions in prose.
package measure

import (
	"math"
	"sort"
	"time"
)

// Metrics are the per-scheduler fields of report.json, exactly as the
// benchmark issue lists them.
type Metrics struct {
	Scheduler             string  `json:"scheduler"`
	PodsPerSecond         float64 `json:"pods_per_second"`
	GangLatencyP50Ms      float64 `json:"gang_latency_p50_ms"`
	GangLatencyP99Ms      float64 `json:"gang_latency_p99_ms"`
	GPUAllocationRatio    float64 `json:"gpu_allocation_ratio"`
	MakespanS             float64 `json:"makespan_s"`
	MeanJCTS              float64 `json:"mean_jct_s"`
	GangsTotal            int     `json:"gangs_total"`
	GangsCompleted        int     `json:"gangs_completed"`
	PartialGangs          int     `json:"partial_gangs"`
	DeadlockedGangs       int     `json:"deadlocked_gangs"`
	MeanRacksPerGang      float64 `json:"mean_racks_per_gang"`
	PreemptibleGangsMixed int     `json:"preemptible_gangs_mixed"`
	// CommonAllocationRatio is GPUAllocationRatio over the window every
	// scheduler of a run shares (report.CommonWindow), so that a scheduler
	// that takes longer is not measured over a longer stretch.
	CommonAllocationRatio float64 `json:"gpu_allocation_common_window"`
	// GoodputRatio is like CommonAllocationRatio but counts only runs of a
	// gang that were not lost: a run cut short by a reclaim or a preemption
	// is work done again later.
	GoodputRatio float64 `json:"goodput_common_window"`
	// LostGPUHours are GPU-hours of gang runs cut short (the whole run).
	LostGPUHours float64 `json:"lost_gpu_hours"`
	// QueueWaitP50S and QueueWaitP95S are nearest-rank percentiles over jobs
	// of the virtual time from submission to the first placement (to the end
	// of the run for a job never placed).
	QueueWaitP50S float64 `json:"queue_wait_p50_s"`
	QueueWaitP95S float64 `json:"queue_wait_p95_s"`
	// StuckGangs never completed and had nothing bound at the end: they
	// wait forever without holding anything (DeadlockedGangs hold GPUs).
	StuckGangs int `json:"stuck_gangs"`
}

// Details are the run's other facts, shown in report.md and BENCHMARKS.md.
type Details struct {
	// HeldGPURatio is like GPUAllocationRatio but counts every bound pod,
	// including members of gangs that are not running.
	HeldGPURatio float64 `json:"held_gpu_ratio"`
	// GangsBroken counts gangs that lost a member to a node reclaim and were
	// resubmitted.
	GangsBroken int `json:"gangs_broken"`
	// GangsPendingAtEnd had no member bound when the run ended.
	GangsPendingAtEnd int `json:"gangs_pending_at_end"`
	// PodsBound counts successful bindings (a restarted gang's pods count
	// again).
	PodsBound int `json:"pods_bound"`
	// BusySeconds is the real time the scheduler had work (see Recorder.Step).
	BusySeconds float64 `json:"busy_seconds"`
	// SetupSeconds is scheduler.New, informer sync and node creation;
	// SetupCPUSeconds the process's CPU time meanwhile.
	SetupSeconds    float64 `json:"setup_seconds"`
	SetupCPUSeconds float64 `json:"setup_cpu_seconds"`
	// SpanSeconds is the real time from the first release of pods to the
	// scheduler (the first step that created pods resumed it) to the last
	// binding (0 when the harness bound the pods itself).
	SpanSeconds float64 `json:"span_seconds"`
	// LoopWallSeconds and LoopCPUSeconds are the real time and the process's
	// CPU time (user and system, every goroutine: scheduler and harness) of
	// the whole step loop, setup excluded.
	LoopWallSeconds float64 `json:"loop_wall_seconds"`
	LoopCPUSeconds  float64 `json:"loop_cpu_seconds"`
	// WallSeconds is the whole child process run.
	WallSeconds float64 `json:"wall_seconds"`
	Steps       int     `json:"steps"`
	// StalledSteps never became idle within the step timeout.
	StalledSteps int `json:"stalled_steps"`
	// ClockMovesPodBackoff and ClockMovesGangBackoff count how often a
	// settled step moved the virtual clock past pods' backoff, or to the
	// next timer of muster's plugin after a dropped gang plan, so that the
	// retry happened within the step.
	ClockMovesPodBackoff  int `json:"clock_moves_pod_backoff,omitempty"`
	ClockMovesGangBackoff int `json:"clock_moves_gang_backoff,omitempty"`
	// EndReason says why the run stopped.
	EndReason string `json:"end_reason"`
	// Preemption is filled when the scenario has jobs of more than one
	// priority.
	Preemption *Preemption `json:"preemption,omitempty"`
	// DRA is filled on a cluster whose GPUs DRA serves (scenario.DRA).
	DRA *DRA `json:"dra,omitempty"`
	// Extra holds scheduler-specific counters (plan failures, batching).
	Extra map[string]float64 `json:"extra,omitempty"`
	// PeakRSSMiB is the child process's maximum resident set (filled in by
	// the parent from rusage).
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// RunOrder is the position in which this scheduler ran (1: first).
	RunOrder int `json:"run_order,omitempty"`
	// Soak is sampled every scenario soak.sampleEvery of virtual time
	// (scenarios with a soak block).
	Soak []SoakSample `json:"soak,omitempty"`
	// RefusedJobPatches counts the Job patches the simulated API refused
	// for good (soak.refuseJobPatches).
	RefusedJobPatches int64 `json:"refused_job_patches,omitempty"`
}

// SoakSample is what a scheduler keeps at one moment of a soak: the live
// heap of the whole process after a full garbage collection (the
// scheduler's, and the simulator's own records of every job so far), the
// size of each structure muster keys by gang, pod, node, domain or slice
// (Structures, empty for other schedulers), and what the cluster held then.
type SoakSample struct {
	VirtualHours float64        `json:"virtual_hours"`
	HeapMiB      float64        `json:"heap_mib"`
	Structures   map[string]int `json:"structures,omitempty"`
	// Nodes and Pods are the cluster's at the sample; JobsSubmitted,
	// JobsFinished and NodesReplaced count from the start.
	Nodes         int `json:"nodes"`
	Pods          int `json:"pods"`
	JobsSubmitted int `json:"jobs_submitted"`
	JobsFinished  int `json:"jobs_finished"`
	NodesReplaced int `json:"nodes_replaced"`
	// What the scheduler did from the start, to tell whether it slows
	// down as the soak goes on: real time busy, scheduling attempts, and
	// (muster) plans computed and the real time computing them.
	BusySeconds float64 `json:"busy_seconds"`
	Attempts    float64 `json:"attempts"`
	Plans       float64 `json:"plans,omitempty"`
	PlanSeconds float64 `json:"plan_seconds,omitempty"`
}

// DRA is what the simulator checked of dynamic resource allocation after
// every step of a run on a DRA cluster (pkg/sim/dra.go): each GPU member
// bound to a DRA node has an allocated claim of its GPUs on that node,
// named in its status.extendedResourceClaimStatus and reserved for it; no
// member on a device-plugin node has one; no device is allocated twice; and
// the devices allocated are exactly the GPUs of the bound members on DRA
// nodes (claims of finished or evicted pods were released). A run that
// breaks any of these fails.
type DRA struct {
	// Nodes whose GPUs DRA serves at the start.
	Nodes int `json:"nodes"`
	// ClaimsChecked counts GPU members bound to DRA nodes whose claim was
	// checked (each binding once); ClaimsReleased the claims the simulator
	// deleted when their pod went, as the ResourceClaim controller would.
	ClaimsChecked  int `json:"claims_checked"`
	ClaimsReleased int `json:"claims_released"`
	// PeakDevicesAllocated is the most devices allocated after a step.
	PeakDevicesAllocated int `json:"peak_devices_allocated"`
	// SlowBindings counts bindings that came 0.5 s or more (real time)
	// after the pod's claim was created: DynamicResources' PreBind polls
	// its assume cache once a second until the claim it created shows there.
	SlowBindings int `json:"slow_bindings"`
	// Violations lists the first broken checks (empty in a valid run);
	// ViolationCount counts all of them.
	Violations     []string `json:"violations,omitempty"`
	ViolationCount int      `json:"violation_count,omitempty"`
}

// Preemption is what priorities cost and bought in a run: how long the
// higher-priority jobs waited, and what was evicted for them.
type Preemption struct {
	// HighJobs counts jobs above the run's lowest priority; their wait runs
	// from submission to their first placement (to the end of the run for a
	// job never placed), in virtual seconds.
	HighJobs      int     `json:"high_jobs"`
	HighWaitP50S  float64 `json:"high_wait_p50_s"`
	HighWaitP99S  float64 `json:"high_wait_p99_s"`
	HighNotPlaced int     `json:"high_not_placed"`
	// PodsEvicted and GPUsEvicted count pods the scheduler deleted to make
	// room (jobs' pods and background pods), and their GPUs.
	PodsEvicted int   `json:"pods_evicted"`
	GPUsEvicted int64 `json:"gpus_evicted"`
	// NonGPUPodsEvicted counts pods that asked for no GPU which the
	// scheduler deleted although they freed no GPU for the preemptor:
	// background pods, and a gang's CPU-only members deleted when none of
	// its GPU members was deleted in the same step. A scheduler that only
	// makes room for GPUs evicts none. CPUMembersWithGang counts the
	// CPU-only members deleted together with GPU members of their gang
	// (taking a victim gang whole), which the first count leaves out.
	NonGPUPodsEvicted  int `json:"non_gpu_pods_evicted"`
	CPUMembersWithGang int `json:"cpu_members_with_gang"`
	// GPUsNeededLowerBound is what no scheduler can evict less than: for
	// each higher-priority job, its GPUs beyond those free when it arrived
	// (jobs arriving together share the free GPUs).
	GPUsNeededLowerBound int64 `json:"gpus_needed_lower_bound"`
	// VictimGangs counts gangs (each run of a job once) that lost members to
	// preemption; VictimGangsPartial of them were left with members running
	// that the scheduler did not evict (the job cannot go on without its
	// peers, so the simulator stops them too).
	VictimGangs        int `json:"victim_gangs"`
	VictimGangsPartial int `json:"victim_gangs_partial"`
}

// Sample is the cluster after one step, at virtual time T (seconds).
type Sample struct {
	T float64 `json:"t"`
	// CapacityGPUs is the GPUs of the nodes that exist.
	CapacityGPUs int64 `json:"capacity_gpus"`
	// HeldGPUs are requested by bound pods; RunningGPUs by bound pods of
	// gangs whose every member is bound.
	HeldGPUs    int64 `json:"held_gpus"`
	RunningGPUs int64 `json:"running_gpus"`
}

// Run is one scheduler's run of one scenario: the metrics plus what they were
// computed from, so a report can plot it.
type Run struct {
	Scenario string    `json:"scenario"`
	Seed     uint64    `json:"seed"`
	Nodes    int       `json:"nodes"`
	GPUs     int64     `json:"gpus"`
	Metrics  Metrics   `json:"metrics"`
	Details  Details   `json:"details"`
	Series   []Sample  `json:"series"`
	Gangs    []GangLog `json:"gangs"`
	// Segments are the gang runs (all members bound until the gang
	// completed or lost a member), for goodput over a window.
	Segments []Segment `json:"segments,omitempty"`
	// FirstSubmitS and EndS bound the run in virtual seconds.
	FirstSubmitS float64 `json:"first_submit_s"`
	EndS         float64 `json:"end_s"`
}

// Segment is one run of a gang: from when its last member was bound (From)
// to when it completed or lost a member (To, virtual seconds), holding GPUs.
type Segment struct {
	From float64 `json:"from"`
	To   float64 `json:"to"`
	GPUs int64   `json:"gpus"`
	// Lost: cut short by a reclaim or a preemption; the job runs again.
	Lost bool `json:"lost,omitempty"`
}

// GangLog is what happened to one gang, for debugging a surprising metric.
type GangLog struct {
	Name       string   `json:"name"`
	Workers    int      `json:"workers"`
	Submitted  float64  `json:"submitted_s"`
	Placed     float64  `json:"placed_s"`    // last placement; -1 if never
	Completed  float64  `json:"completed_s"` // -1 if never
	Racks      int      `json:"racks,omitempty"`
	Nodes      []string `json:"nodes,omitempty"` // of the last placement
	Restarts   int      `json:"restarts,omitempty"`
	BoundAtEnd int      `json:"bound_at_end,omitempty"`
	seq        int
}

// Recorder collects a run. Times are virtual durations since the scenario's
// start; latencies and busy time are on the real clock. Not safe for
// concurrent use: the simulator's step loop is its only caller.
type Recorder struct {
	scheduler string
	// gangs are the gangs submitted; with forgetFinished only those not
	// completed yet.
	gangs          map[string]*gangRecord
	forgetFinished bool
	// submitted counts the gangs submitted, firstSubmit is the earliest.
	submitted   int
	firstSubmit time.Duration
	// finished are the gangs completed, jct sums their completion times.
	finished  []gangWait
	jct       time.Duration
	latencies []time.Duration
	racks     []int
	mixed     int
	busy      time.Duration
	podsBound int
	samples   []Sample
	everPart  map[string]bool
	lastPart  []string
	end       time.Duration
	broken    int
	steps     int
	evictions []Eviction
	// backgroundEvicted counts background pods without GPUs the scheduler
	// deleted, backgroundGPUPods those with GPUs and backgroundGPUs their
	// GPUs.
	backgroundEvicted int
	backgroundGPUPods int
	backgroundGPUs    int64
	needed            int64
	segments          []Segment
}

// Eviction is one gang's loss to preemption in one step.
type Eviction struct {
	Gang string
	// At is the virtual time of the step.
	At time.Duration
	// Pods were deleted, GPUPods of them asked for GPUs (the rest are
	// CPU-only members), and GPUs are what the bound ones held.
	Pods    int
	GPUPods int
	GPUs    int64
	// Partial: members of the gang stayed bound that the scheduler did not
	// evict.
	Partial bool
}

// gangWait is what the metrics need of a gang once it is completed (or at
// the end, of one that is not): its priority and its queue wait.
type gangWait struct {
	priority int32
	wait     time.Duration // from submission to first placement
}

type gangRecord struct {
	name        string
	seq         int // submission order
	workers     int
	gpus        int64 // per worker
	running     int   // index+1 in segments of the open run (0: none)
	priority    int32
	firstPlaced time.Duration
	everPlaced  bool
	submitted   time.Duration
	placed      time.Duration
	completed   time.Duration
	isPlaced    bool
	isDone      bool
	racks       int
	nodes       []string
	restarts    int
	boundEnd    int
}

// NewRecorder starts an empty record for scheduler.
func NewRecorder(scheduler string) *Recorder {
	return &Recorder{scheduler: scheduler, gangs: map[string]*gangRecord{}, everPart: map[string]bool{}}
}

// ForgetFinished makes the recorder keep a completed gang only in its
// totals and percentiles: no GangLog, so that a month of jobs costs the
// simulator a few numbers each (see the soak scenarios).
func (r *Recorder) ForgetFinished() { r.forgetFinished = true }

// Submitted records a gang's submission.
func (r *Recorder) Submitted(gang string, workers int, gpusPerWorker int64, priority int32, t time.Duration) {
	r.gangs[gang] = &gangRecord{name: gang, seq: r.submitted, workers: workers, gpus: gpusPerWorker, priority: priority, submitted: t}
	if r.submitted == 0 || t < r.firstSubmit {
		r.firstSubmit = t
	}
	r.submitted++
}

// Evicted records that the scheduler preempted members of a gang.
func (r *Recorder) Evicted(e Eviction) {
	r.evictions = append(r.evictions, e)
	r.gangs[e.Gang].restarts++
	r.stopRun(r.gangs[e.Gang], e.At, true)
}

// stopRun closes the gang's open run, if any.
func (r *Recorder) stopRun(g *gangRecord, t time.Duration, lost bool) {
	if g.running == 0 {
		return
	}
	seg := &r.segments[g.running-1]
	seg.To, seg.Lost = t.Seconds(), lost
	g.running = 0
}

// BackgroundEvicted records that the scheduler deleted n background pods
// (CPU-only pods that are not jobs').
func (r *Recorder) BackgroundEvicted(n int) { r.backgroundEvicted += n }

// BackgroundGPUPodsEvicted records that the scheduler deleted pods
// background pods holding gpus GPUs between them (a busy cluster's).
func (r *Recorder) BackgroundGPUPodsEvicted(pods int, gpus int64) {
	r.backgroundGPUPods += pods
	r.backgroundGPUs += gpus
}

// NeededForPriority adds GPUs that higher-priority jobs needed beyond the
// free ones when they arrived (see Preemption.GPUsNeededLowerBound).
func (r *Recorder) NeededForPriority(gpus int64) { r.needed += gpus }

// Placement is where a gang's members landed.
type Placement struct {
	// Nodes are the distinct nodes, sorted.
	Nodes         []string
	Racks         int
	SpotNodes     int
	OnDemandNodes int
}

// PlacementOf summarises the nodes a gang's members are bound to (one entry
// per member, repeats allowed).
func PlacementOf(nodes []string, rackOf func(string) string, spot func(string) bool) Placement {
	seen, racks := map[string]bool{}, map[string]bool{}
	var p Placement
	for _, n := range nodes {
		if seen[n] {
			continue
		}
		seen[n], racks[rackOf(n)] = true, true
		p.Nodes = append(p.Nodes, n)
		if spot(n) {
			p.SpotNodes++
		} else {
			p.OnDemandNodes++
		}
	}
	sort.Strings(p.Nodes)
	p.Racks = len(racks)
	return p
}

// Placed records that every member of the gang is bound at t. latency is the
// real time the scheduler took (see BENCHMARKS.md).
func (r *Recorder) Placed(gang string, t, latency time.Duration, p Placement) {
	g := r.gangs[gang]
	g.placed, g.isPlaced, g.racks, g.nodes = t, true, p.Racks, p.Nodes
	if g.running == 0 {
		r.segments = append(r.segments, Segment{From: t.Seconds(), To: -1, GPUs: int64(g.workers) * g.gpus})
		g.running = len(r.segments)
	}
	if !g.everPlaced {
		g.firstPlaced, g.everPlaced = t, true
	}
	r.latencies = append(r.latencies, latency)
	r.racks = append(r.racks, p.Racks)
	if p.SpotNodes > 0 && p.OnDemandNodes > 0 {
		r.mixed++
	}
}

// Completed records that the gang ran for its whole duration.
func (r *Recorder) Completed(gang string, t time.Duration) {
	g := r.gangs[gang]
	g.completed, g.isDone = t, true
	r.stopRun(g, t, false)
	r.finished = append(r.finished, gangWait{priority: g.priority, wait: g.firstPlaced - g.submitted})
	r.jct += g.completed - g.submitted
	if r.forgetFinished {
		delete(r.gangs, gang)
	}
}

// Broken records that the gang lost a member to a node reclaim at t and was
// resubmitted.
func (r *Recorder) Broken(gang string, t time.Duration) {
	r.gangs[gang].restarts++
	r.broken++
	r.stopRun(r.gangs[gang], t, true)
}

// Step records one settled step: the real time the scheduler was busy, the
// bindings it made, the cluster's GPUs, and which gangs are partly bound.
func (r *Recorder) Step(s Sample, busy time.Duration, binds int, partial []string) {
	r.steps++
	r.busy += busy
	r.podsBound += binds
	if n := len(r.samples); n > 0 && r.samples[n-1].T == s.T {
		r.samples[n-1] = s
	} else {
		r.samples = append(r.samples, s)
	}
	for _, g := range partial {
		r.everPart[g] = true
	}
	r.lastPart = partial
}

// End records when the run stopped and how many members each unfinished
// gang had bound then.
func (r *Recorder) End(t time.Duration, boundAtEnd map[string]int) {
	r.end = t
	for name, n := range boundAtEnd {
		if g := r.gangs[name]; g != nil {
			g.boundEnd = n
		}
	}
}

// Steps is how many steps were recorded.
func (r *Recorder) Steps() int { return r.steps }

// Busy is the scheduler's real time busy so far.
func (r *Recorder) Busy() time.Duration { return r.busy }

// Result computes the metrics.
func (r *Recorder) Result() (Metrics, Details, []Sample, []GangLog) {
	m := Metrics{Scheduler: r.scheduler}
	d := Details{PodsBound: r.podsBound, BusySeconds: r.busy.Seconds(), Steps: r.steps, GangsBroken: r.broken}
	if r.busy > 0 {
		m.PodsPerSecond = float64(r.podsBound) / r.busy.Seconds()
	}
	m.GangLatencyP50Ms = ms(Percentile(r.latencies, 50))
	m.GangLatencyP99Ms = ms(Percentile(r.latencies, 99))

	start := r.FirstSubmit()
	m.GangsTotal, m.GangsCompleted = r.submitted, len(r.finished)
	if len(r.finished) > 0 {
		m.MeanJCTS = (r.jct / time.Duration(len(r.finished))).Seconds()
	}
	var waits []time.Duration
	for _, g := range r.finished {
		waits = append(waits, g.wait)
	}
	logs := make([]GangLog, 0, len(r.gangs))
	for _, g := range r.gangs {
		log := GangLog{Name: g.name, Workers: g.workers, Submitted: g.submitted.Seconds(), Placed: -1, Completed: -1,
			Racks: g.racks, Nodes: g.nodes, Restarts: g.restarts, seq: g.seq}
		if g.isPlaced {
			log.Placed = g.placed.Seconds()
		}
		if g.isDone {
			log.Completed = g.completed.Seconds()
		} else {
			log.BoundAtEnd = g.boundEnd
			if g.boundEnd == 0 {
				d.GangsPendingAtEnd++
			}
			waits = append(waits, r.waitOf(g))
		}
		logs = append(logs, log)
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].seq < logs[j].seq })
	m.MakespanS = max(r.end-start, 0).Seconds()
	m.GPUAllocationRatio, d.HeldGPURatio = allocationOver(r.samples, start.Seconds(), r.end.Seconds())
	m.PartialGangs = len(r.everPart)
	m.DeadlockedGangs = len(r.lastPart)
	m.StuckGangs = d.GangsPendingAtEnd
	m.QueueWaitP50S = Percentile(waits, 50).Seconds()
	m.QueueWaitP95S = Percentile(waits, 95).Seconds()
	for _, seg := range r.Segments() {
		if seg.Lost {
			m.LostGPUHours += float64(seg.GPUs) * (seg.To - seg.From) / 3600
		}
	}
	// Until a report puts every scheduler of a run on one window, the
	// common window is this run's own.
	m.CommonAllocationRatio, m.GoodputRatio = WindowRatios(r.samples, r.Segments(), start.Seconds(), r.end.Seconds())
	if len(r.racks) > 0 {
		sum := 0
		for _, n := range r.racks {
			sum += n
		}
		m.MeanRacksPerGang = float64(sum) / float64(len(r.racks))
	}
	m.PreemptibleGangsMixed = r.mixed
	d.Preemption = r.preemption()
	return m, d, append([]Sample(nil), r.samples...), logs
}

// Segments are the gang runs so far; a run still open ends at the end of
// the recording (and is not lost).
func (r *Recorder) Segments() []Segment {
	out := append([]Segment(nil), r.segments...)
	for i := range out {
		if out[i].To < 0 {
			out[i].To = r.end.Seconds()
		}
	}
	return out
}

// FirstSubmit is the virtual time of the first submission (0 for none).
func (r *Recorder) FirstSubmit() time.Duration { return r.firstSubmit }

// EndTime is the virtual time at which the run stopped.
func (r *Recorder) EndTime() time.Duration { return r.end }

// WindowRatios are the GPU allocation (running gangs) and the goodput (runs
// not lost) over the virtual window [from, to] (seconds), each divided by
// the cluster's GPU capacity integrated over the window. samples hold until
// the next sample; the last holds until to.
func WindowRatios(samples []Sample, segments []Segment, from, to float64) (allocation, goodput float64) {
	allocation, _ = allocationOver(samples, from, to)
	capArea := capacityArea(samples, from, to)
	if capArea == 0 {
		return allocation, 0
	}
	var useful float64
	for _, seg := range segments {
		if seg.Lost {
			continue
		}
		if lo, hi := max(seg.From, from), min(seg.To, to); hi > lo {
			useful += float64(seg.GPUs) * (hi - lo)
		}
	}
	return allocation, useful / capArea
}

func capacityArea(samples []Sample, from, to float64) float64 {
	var area float64
	for i, s := range samples {
		next := to
		if i+1 < len(samples) {
			next = min(samples[i+1].T, to)
		}
		if lo := max(s.T, from); next > lo {
			area += float64(s.CapacityGPUs) * (next - lo)
		}
	}
	return area
}

// preemption is nil for a run whose jobs all have one priority and in
// which the scheduler deleted nothing.
func (r *Recorder) preemption() *Preemption {
	if r.submitted == 0 {
		return nil
	}
	gangs := append([]gangWait(nil), r.finished...)
	for _, g := range r.gangs {
		if !g.isDone {
			gangs = append(gangs, gangWait{priority: g.priority, wait: r.waitOf(g)})
		}
	}
	lowest, highest := gangs[0].priority, gangs[0].priority
	for _, g := range gangs {
		lowest, highest = min(lowest, g.priority), max(highest, g.priority)
	}
	if lowest == highest && len(r.evictions) == 0 && r.backgroundEvicted == 0 && r.backgroundGPUPods == 0 {
		return nil
	}
	p := &Preemption{GPUsNeededLowerBound: r.needed}
	var waits []time.Duration
	for _, g := range gangs {
		if g.priority == lowest {
			continue
		}
		p.HighJobs++
		waits = append(waits, g.wait)
	}
	for _, g := range r.gangs {
		if !g.isDone && !g.everPlaced && g.priority > lowest {
			p.HighNotPlaced++
		}
	}
	p.HighWaitP50S = Percentile(waits, 50).Seconds()
	p.HighWaitP99S = Percentile(waits, 99).Seconds()
	for _, e := range r.evictions {
		p.PodsEvicted += e.Pods
		p.GPUsEvicted += e.GPUs
		p.VictimGangs++
		if e.Partial {
			p.VictimGangsPartial++
		}
		if cpuOnly := e.Pods - e.GPUPods; e.GPUPods == 0 {
			p.NonGPUPodsEvicted += cpuOnly
		} else {
			p.CPUMembersWithGang += cpuOnly
		}
	}
	p.PodsEvicted += r.backgroundEvicted + r.backgroundGPUPods
	p.GPUsEvicted += r.backgroundGPUs
	p.NonGPUPodsEvicted += r.backgroundEvicted
	return p
}

// waitOf is an unfinished gang's queue wait: until its first placement,
// or until the end if it never ran.
func (r *Recorder) waitOf(g *gangRecord) time.Duration {
	if g.everPlaced {
		return g.firstPlaced - g.submitted
	}
	return max(r.end-g.submitted, 0)
}

// allocationOver integrates the step function of samples (each holds until
// the next) over [from, to] and divides by the integral of capacity.
func allocationOver(samples []Sample, from, to float64) (running, held float64) {
	var capArea, runArea, heldArea float64
	for i, s := range samples {
		next := to
		if i+1 < len(samples) {
			next = min(samples[i+1].T, to)
		}
		lo := max(s.T, from)
		if next <= lo {
			continue
		}
		dt := next - lo
		capArea += float64(s.CapacityGPUs) * dt
		runArea += float64(s.RunningGPUs) * dt
		heldArea += float64(s.HeldGPUs) * dt
	}
	if capArea == 0 {
		return 0, 0
	}
	return runArea / capArea, heldArea / capArea
}

// Percentile is the nearest-rank percentile (0 for no values).
func Percentile(values []time.Duration, p float64) time.Duration {
	if len(values) == 0 {
		return 0
	}
	sorted := append([]time.Duration(nil), values...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
