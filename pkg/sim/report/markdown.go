package report

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// metricRows lists report.json's fields in table order with how to print them.
var metricRows = []struct {
	name   string
	format func(m measure.Metrics) string
}{
	{"pods_per_second", func(m measure.Metrics) string { return fmt.Sprintf("%.1f", m.PodsPerSecond) }},
	{"gang_latency_p50_ms", func(m measure.Metrics) string { return fmt.Sprintf("%.1f", m.GangLatencyP50Ms) }},
	{"gang_latency_p99_ms", func(m measure.Metrics) string { return fmt.Sprintf("%.1f", m.GangLatencyP99Ms) }},
	{"gpu_allocation_ratio", func(m measure.Metrics) string { return fmt.Sprintf("%.3f", m.GPUAllocationRatio) }},
	{"makespan_s", func(m measure.Metrics) string { return fmt.Sprintf("%.0f", m.MakespanS) }},
	{"mean_jct_s", func(m measure.Metrics) string { return fmt.Sprintf("%.0f", m.MeanJCTS) }},
	{"gangs_total", func(m measure.Metrics) string { return fmt.Sprint(m.GangsTotal) }},
	{"gangs_completed", func(m measure.Metrics) string { return fmt.Sprint(m.GangsCompleted) }},
	{"partial_gangs", func(m measure.Metrics) string { return fmt.Sprint(m.PartialGangs) }},
	{"deadlocked_gangs", func(m measure.Metrics) string { return fmt.Sprint(m.DeadlockedGangs) }},
	{"mean_racks_per_gang", func(m measure.Metrics) string { return fmt.Sprintf("%.2f", m.MeanRacksPerGang) }},
	{"preemptible_gangs_mixed", func(m measure.Metrics) string { return fmt.Sprint(m.PreemptibleGangsMixed) }},
	{"gpu_allocation_common_window", func(m measure.Metrics) string { return fmt.Sprintf("%.3f", m.CommonAllocationRatio) }},
	{"goodput_common_window", func(m measure.Metrics) string { return fmt.Sprintf("%.3f", m.GoodputRatio) }},
	{"lost_gpu_hours", func(m measure.Metrics) string { return fmt.Sprintf("%.1f", m.LostGPUHours) }},
	{"queue_wait_p50_s", func(m measure.Metrics) string { return fmt.Sprintf("%.0f", m.QueueWaitP50S) }},
	{"queue_wait_p95_s", func(m measure.Metrics) string { return fmt.Sprintf("%.0f", m.QueueWaitP95S) }},
	{"stuck_gangs", func(m measure.Metrics) string { return fmt.Sprint(m.StuckGangs) }},
}

var detailRows = []struct {
	name   string
	format func(d measure.Details) string
}{
	{"GPU share held by any bound pod (time-averaged)", func(d measure.Details) string { return fmt.Sprintf("%.3f", d.HeldGPURatio) }},
	{"pods bound", func(d measure.Details) string { return fmt.Sprint(d.PodsBound) }},
	{"gangs broken by node reclaims", func(d measure.Details) string { return fmt.Sprint(d.GangsBroken) }},
	{"gangs with nothing bound at the end", func(d measure.Details) string { return fmt.Sprint(d.GangsPendingAtEnd) }},
	{"scheduling attempts", func(d measure.Details) string { return fmt.Sprintf("%.0f", d.Extra["schedule_attempts"]) }},
	{"scheduling attempts per bound pod: scheduled / unschedulable / error", func(d measure.Details) string {
		a := AttemptsPerPod(d)
		return fmt.Sprintf("%.2f / %.2f / %.2f", a.Scheduled, a.Unschedulable, a.Error)
	}},
	{"ms of busy time per attempt", func(d measure.Details) string { return fmt.Sprintf("%.2f", MsPerAttempt(d)) }},
	{"plans refused by a member's own cycle, per 100 plans (muster)", func(d measure.Details) string {
		if per100, ok := PlansRefusedPer100(d); ok {
			return fmt.Sprintf("%.2f (%.0f of %.0f)", per100, PlansRefused(d), d.Extra["muster_plans_installed"])
		}
		return "–"
	}},
	{"real time busy (s)", func(d measure.Details) string { return fmt.Sprintf("%.2f", d.BusySeconds) }},
	{"first release → last binding (s)", func(d measure.Details) string { return fmt.Sprintf("%.2f", d.SpanSeconds) }},
	{"step loop: real time / process CPU (s)", func(d measure.Details) string {
		return fmt.Sprintf("%.2f / %.2f", d.LoopWallSeconds, d.LoopCPUSeconds)
	}},
	{"clock moved past pod backoff / to muster's timers", func(d measure.Details) string {
		return fmt.Sprintf("%d / %d", d.ClockMovesPodBackoff, d.ClockMovesGangBackoff)
	}},
	{"ran as (1: first)", func(d measure.Details) string { return fmt.Sprint(d.RunOrder) }},
	{"setup: scheduler.New, informer sync (s)", func(d measure.Details) string { return fmt.Sprintf("%.2f", d.SetupSeconds) }},
	{"wall time of the process (s)", func(d measure.Details) string { return fmt.Sprintf("%.1f", d.WallSeconds) }},
	{"peak RSS (MiB)", func(d measure.Details) string { return fmt.Sprintf("%.0f", d.PeakRSSMiB) }},
	{"steps", func(d measure.Details) string { return fmt.Sprint(d.Steps) }},
	{"steps that never went idle", func(d measure.Details) string { return fmt.Sprint(d.StalledSteps) }},
	{"end", func(d measure.Details) string { return d.EndReason }},
}

// preemptionRows describe measure.Preemption for runs with priorities (or
// in which the scheduler deleted pods).
var preemptionRows = []struct {
	name   string
	format func(p measure.Preemption) string
}{
	{"higher-priority jobs (not placed)", func(p measure.Preemption) string { return fmt.Sprintf("%d (%d)", p.HighJobs, p.HighNotPlaced) }},
	{"their wait p50 / p99 (virtual s)", func(p measure.Preemption) string {
		return fmt.Sprintf("%.0f / %.0f", p.HighWaitP50S, p.HighWaitP99S)
	}},
	{"GPUs evicted (lower bound needed)", func(p measure.Preemption) string {
		return fmt.Sprintf("%d (%d)", p.GPUsEvicted, p.GPUsNeededLowerBound)
	}},
	{"pods evicted", func(p measure.Preemption) string { return fmt.Sprint(p.PodsEvicted) }},
	{"non-GPU pods evicted", func(p measure.Preemption) string { return fmt.Sprint(p.NonGPUPodsEvicted) }},
	{"CPU-only members evicted with their gang", func(p measure.Preemption) string { return fmt.Sprint(p.CPUMembersWithGang) }},
	{"victim gangs (left partly running)", func(p measure.Preemption) string {
		return fmt.Sprintf("%d (%d)", p.VictimGangs, p.VictimGangsPartial)
	}},
}

// draRows describe measure.DRA for runs on a DRA cluster.
var draRows = []struct {
	name   string
	format func(d measure.DRA) string
}{
	{"bindings to DRA nodes checked (claim allocated on the node, reserved, in the pod's status)", func(d measure.DRA) string { return fmt.Sprint(d.ClaimsChecked) }},
	{"claims released when their pod went", func(d measure.DRA) string { return fmt.Sprint(d.ClaimsReleased) }},
	{"peak devices allocated", func(d measure.DRA) string { return fmt.Sprint(d.PeakDevicesAllocated) }},
	{"bindings ≥ 0.5 s after their claim was created", func(d measure.DRA) string { return fmt.Sprint(d.SlowBindings) }},
	{"broken checks", func(d measure.DRA) string { return fmt.Sprint(d.ViolationCount) }},
}

func hasPreemption(rep Report, det Details) bool {
	for _, m := range rep.Results {
		if det.Schedulers[m.Scheduler].Preemption != nil {
			return true
		}
	}
	return false
}

// Markdown renders report.md.
func Markdown(rep Report, det Details) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# muster-sim: %s, seed %d\n\n", rep.Scenario, rep.Seed)
	if det.Description != "" {
		fmt.Fprintf(&b, "%s\n\n", det.Description)
	}
	writeSetup(&b, rep, det)
	writeTables(&b, rep, det)
	writeCounters(&b, rep, det)
	fmt.Fprintf(&b, "GPU allocation over virtual time: [%s](%s).\n", PlotFile, PlotFile)
	return b.String()
}

// writeSetup describes the run: the cluster, the workload, the command, when
// and where it was measured.
func writeSetup(b *strings.Builder, rep Report, det Details) {
	fmt.Fprintf(b, "- Cluster: %d nodes, %d GPUs, %d racks, %d zones, %d spot nodes.\n", rep.Nodes, rep.GPUs, det.Racks, det.Zones, det.SpotNodes)
	if det.SmallNodes > 0 {
		fmt.Fprintf(b, "- %d of the nodes have %d GPUs (the others %d).\n", det.SmallNodes, det.SmallNodeGPUs, det.GPUsPerNode)
	}
	if det.DRANodes > 0 {
		fmt.Fprintf(b, "- DRA: the GPUs of %d of the %d nodes are DRA devices (one ResourceSlice per node; DeviceClass gpu.nvidia.com backs nvidia.com/gpu); any other node advertises them in allocatable.\n",
			det.DRANodes, rep.Nodes)
	}
	fmt.Fprintf(b, "- Workload: %d jobs (gangs), %d pods", det.Jobs, det.Pods)
	if det.CPUMemberJobs > 0 {
		fmt.Fprintf(b, "; %d jobs have a CPU-only member (a parameter server)", det.CPUMemberJobs)
	}
	b.WriteString(".\n")
	if det.BackgroundPods > 0 {
		kind := "CPU-only pods"
		if det.BackgroundGPUs > 0 {
			kind = "pods"
		}
		fmt.Fprintf(b, "- Background: %d %s of priority 0 bound from the start (not jobs: no job metric counts them), %d PodDisruptionBudgets over %d of them.\n",
			det.BackgroundPods, kind, det.PDBs, det.PDBPods)
	}
	if det.BackgroundGPUs > 0 || det.NoisyNodes > 0 {
		fmt.Fprintf(b, "- Busy cluster: background pods hold %d of the %d GPUs (%.0f%%) from the start; %d nodes have every GPU free, %d of them run a noisy CPU pod.\n",
			det.BackgroundGPUs, rep.GPUs, 100*float64(det.BackgroundGPUs)/float64(rep.GPUs), det.FreeNodes, det.NoisyNodes)
	}
	if det.AntiAffinity != "" {
		fmt.Fprintf(b, "- Workers have required pod anti-affinity on the node against %s.\n", det.AntiAffinity)
	}
	fmt.Fprintf(b, "- Command: `%s`\n", det.Command)
	if det.Measured != "" {
		fmt.Fprintf(b, "- Measured: %s%s.\n", det.Measured, atCommit(det.Commit))
	}
	fmt.Fprintf(b, "- Machine: %s.\n\n", describeMachine(det.Machine))

}

// writeTables writes the metrics and run facts per scheduler, and the
// preemption and DRA tables when the run has them.
func writeTables(b *strings.Builder, rep Report, det Details) {
	fmt.Fprintf(b, "## Metrics\n\nDefinitions: BENCHMARKS.md. Virtual time for makespan, JCT and allocation; real time for pods/s and latency. Common window: %.0f–%.0f s.\n\n", rep.CommonWindowS[0], rep.CommonWindowS[1])
	header(b, rep)
	for _, row := range metricRows {
		fmt.Fprintf(b, "| %s |", row.name)
		for _, m := range rep.Results {
			fmt.Fprintf(b, " %s |", row.format(m))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n## Run facts\n\n")
	header(b, rep)
	for _, row := range detailRows {
		fmt.Fprintf(b, "| %s |", row.name)
		for _, m := range rep.Results {
			fmt.Fprintf(b, " %s |", row.format(det.Schedulers[m.Scheduler]))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	if hasPreemption(rep, det) {
		b.WriteString("## Priorities and preemption\n\n")
		header(b, rep)
		for _, row := range preemptionRows {
			fmt.Fprintf(b, "| %s |", row.name)
			for _, m := range rep.Results {
				p := det.Schedulers[m.Scheduler].Preemption
				if p == nil {
					p = &measure.Preemption{}
				}
				fmt.Fprintf(b, " %s |", row.format(*p))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	if det.DRANodes > 0 {
		b.WriteString("## Dynamic resource allocation\n\nChecked after every step (measure.DRA); a run that breaks a check fails.\n\n")
		header(b, rep)
		for _, row := range draRows {
			fmt.Fprintf(b, "| %s |", row.name)
			for _, m := range rep.Results {
				if d := det.Schedulers[m.Scheduler].DRA; d != nil {
					fmt.Fprintf(b, " %s |", row.format(*d))
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
}

// writeCounters writes the schedulers' own counters, the default profile's
// batching, the feature gate's setting and the soak samples.
func writeCounters(b *strings.Builder, rep Report, det Details) {
	extraKeys := map[string]bool{}
	for _, d := range det.Schedulers {
		for k := range d.Extra {
			if k != "schedule_attempts" {
				extraKeys[k] = true
			}
		}
	}
	if len(extraKeys) > 0 {
		b.WriteString("Scheduler counters (from the scheduler's own metrics):\n\n")
		header(b, rep)
		for _, k := range slices.Sorted(maps.Keys(extraKeys)) {
			fmt.Fprintf(b, "| %s |", k)
			for _, m := range rep.Results {
				if v, ok := det.Schedulers[m.Scheduler].Extra[k]; ok {
					fmt.Fprintf(b, " %.0f |", v)
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	if d, ok := det.Schedulers["default"]; ok {
		fmt.Fprintf(b, "Opportunistic batching in the default profile: %s\n\n", Batching(d))
	}
	var fastPath []string
	for _, m := range rep.Results {
		if v, ok := det.Schedulers[m.Scheduler].Extra["gate_interpod_affinity_hostname_fast_path"]; ok {
			fastPath = append(fastPath, fmt.Sprintf("%s %s", m.Scheduler, map[bool]string{true: "on", false: "off"}[v == 1]))
		}
	}
	if len(fastPath) > 0 {
		fmt.Fprintf(b, "InterPodAffinityHostnameFastPath (feature gate): %s.\n\n", strings.Join(fastPath, ", "))
	}
	for _, m := range rep.Results {
		if d := det.Schedulers[m.Scheduler]; len(d.Soak) > 0 {
			b.WriteString(SoakTable(m.Scheduler, d))
		}
	}
}

// SoakTable renders a soak's samples (measure.SoakSample): one row per
// sample, the heap and the cluster's size, then every structure the
// scheduler keeps.
func SoakTable(scheduler string, d measure.Details) string {
	var b strings.Builder
	names := map[string]bool{}
	for _, s := range d.Soak {
		for k := range s.Structures {
			names[k] = true
		}
	}
	structures := slices.Sorted(maps.Keys(names))
	fmt.Fprintf(&b, "## What %s keeps over the soak\n\n", scheduler)
	b.WriteString("Sampled every soak.sampleEvery of virtual time and once at the end; heap: live heap of the whole process after a full GC (the scheduler's and the simulator's own records of every job so far).")
	if d.RefusedJobPatches > 0 {
		fmt.Fprintf(&b, " Job patches refused for good by the simulated API (soak.refuseJobPatches): %d.", d.RefusedJobPatches)
	}
	b.WriteString(" Since the sample before (real time): ms busy per scheduling attempt; ms per plan computed (muster_gang_plan_duration_seconds), and plans.")
	b.WriteString("\n\n| virtual day | heap MiB | nodes | job pods | jobs submitted | jobs finished | nodes replaced | ms busy per attempt | ms per plan | plans |")
	for _, k := range structures {
		fmt.Fprintf(&b, " %s |", k)
	}
	b.WriteString("\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	b.WriteString(strings.Repeat("--:|", len(structures)))
	b.WriteString("\n")
	var last measure.SoakSample
	for _, s := range d.Soak {
		fmt.Fprintf(&b, "| %.1f | %.0f | %d | %d | %d | %d | %d | %s | %s | %.0f |", s.VirtualHours/24, s.HeapMiB, s.Nodes, s.Pods, s.JobsSubmitted, s.JobsFinished, s.NodesReplaced,
			perMs(s.BusySeconds-last.BusySeconds, s.Attempts-last.Attempts), perMs(s.PlanSeconds-last.PlanSeconds, s.Plans-last.Plans), s.Plans-last.Plans)
		last = s
		for _, k := range structures {
			fmt.Fprintf(&b, " %d |", s.Structures[k])
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	return b.String()
}

// perMs is seconds per item in milliseconds, "–" without items.
func perMs(seconds, items float64) string {
	if items <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", 1000*seconds/items)
}

// Batching says whether opportunistic batching was on for a run and whether
// it ever placed a pod from a hint.
func Batching(d measure.Details) string {
	gate := "on"
	if d.Extra["gate_opportunistic_batching"] == 0 {
		gate = "off"
	}
	used := d.Extra["batch_attempts_hint_used"]
	total := used + d.Extra["batch_attempts_no_hint"] + d.Extra["batch_attempts_hint_not_used"]
	effect := "so batching was effectively off"
	if used > 0 {
		effect = "so batching was active"
	}
	return fmt.Sprintf("the OpportunisticBatching feature gate was %s; %.0f of %.0f scheduling attempts used a batching hint, %s.", gate, used, total, effect)
}

func header(b *strings.Builder, rep Report) {
	b.WriteString("| |")
	for _, m := range rep.Results {
		fmt.Fprintf(b, " %s |", m.Scheduler)
	}
	b.WriteString("\n|---|")
	for range rep.Results {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
}

// atCommit is " at <commit>", or "" when the build recorded none.
func atCommit(commit string) string {
	if commit == "" {
		return ""
	}
	return " at " + commit
}

func describeMachine(m Machine) string {
	s := fmt.Sprintf("%d CPUs (GOMAXPROCS %d)", m.CPUs, m.GOMAXPROCS)
	if m.CPUModel != "" {
		s += ", " + m.CPUModel
	}
	if m.MemoryGiB > 0 {
		s += fmt.Sprintf(", %d GiB", m.MemoryGiB)
	}
	return s + fmt.Sprintf(", %s %s, k8s.io/kubernetes %s", m.Go, m.OS, m.Kubernetes)
}

// Attempts are scheduling attempts per bound pod, by result.
type Attempts struct{ Scheduled, Unschedulable, Error float64 }

// AttemptsPerPod divides the scheduler's attempts by result by the pods
// bound (a restarted gang's pods count again).
func AttemptsPerPod(d measure.Details) Attempts {
	if d.PodsBound == 0 {
		return Attempts{}
	}
	n := float64(d.PodsBound)
	return Attempts{d.Extra["schedule_attempts_scheduled"] / n, d.Extra["schedule_attempts_unschedulable"] / n, d.Extra["schedule_attempts_error"] / n}
}

// MsPerAttempt is the scheduler's busy time per scheduling attempt.
func MsPerAttempt(d measure.Details) float64 {
	if d.Extra["schedule_attempts"] == 0 {
		return 0
	}
	return 1000 * d.BusySeconds / d.Extra["schedule_attempts"]
}

// PlansRefused counts muster's plans that a member's own scheduling cycle
// refused: a member that could not go to its planned node (plan_broken) or
// was rejected at Reserve or Permit (rejected). The plan's dry run screens
// some filters with muster's own model; these count where it was wrong.
func PlansRefused(d measure.Details) float64 {
	return d.Extra["muster_plans_dropped_plan_broken"] + d.Extra["muster_plans_dropped_rejected"]
}

// PlansRefusedPer100 is PlansRefused per 100 plans installed; false when
// the run counted no plans (not muster, or no plan made).
func PlansRefusedPer100(d measure.Details) (float64, bool) {
	plans := d.Extra["muster_plans_installed"]
	if plans == 0 {
		return 0, false
	}
	return 100 * PlansRefused(d) / plans, true
}
