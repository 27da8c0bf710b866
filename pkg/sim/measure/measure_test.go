package measure

import (
	"encoding/json"
	"math"
	"reflect"
	"sort"
	"testing"
	"time"
)

const s = time.Second

// A hand-written run of three gangs on a 24-GPU cluster:
//
//	t=0   a (2 workers × 4 GPUs) and b (2 × 4) submitted; a placed whole,
//	      b gets one member (partial).
//	t=10  c (1 × 8) submitted and placed; b still partial.
//	t=20  a completes; b's second member is bound, b runs.
//	t=30  c completes; b completes at t=50.
func sampleRun() *Recorder {
	r := NewRecorder("muster")
	r.Submitted("a", 2, 4, 0, 0)
	r.Submitted("b", 2, 4, 0, 0)
	r.Placed("a", 0, 4*time.Millisecond, Placement{Nodes: []string{"n1"}, Racks: 1, OnDemandNodes: 1})
	r.Step(Sample{T: 0, CapacityGPUs: 24, HeldGPUs: 12, RunningGPUs: 8}, 100*time.Millisecond, 3, []string{"b"})
	r.Submitted("c", 1, 8, 0, 10*s)
	r.Placed("c", 10*s, 2*time.Millisecond, Placement{Nodes: []string{"n2"}, Racks: 1, SpotNodes: 1})
	r.Step(Sample{T: 10, CapacityGPUs: 24, HeldGPUs: 20, RunningGPUs: 16}, 50*time.Millisecond, 1, []string{"b"})
	r.Completed("a", 20*s)
	r.Placed("b", 20*s, 10*time.Millisecond, Placement{Nodes: []string{"n1", "n3"}, Racks: 2, SpotNodes: 1, OnDemandNodes: 1})
	r.Step(Sample{T: 20, CapacityGPUs: 24, HeldGPUs: 16, RunningGPUs: 16}, 50*time.Millisecond, 1, nil)
	r.Completed("c", 30*s)
	r.Step(Sample{T: 30, CapacityGPUs: 24, HeldGPUs: 8, RunningGPUs: 8}, 0, 0, nil)
	r.Completed("b", 50*s)
	r.Step(Sample{T: 50, CapacityGPUs: 24}, 0, 0, nil)
	r.End(50*s, nil)
	return r
}

func TestResult(t *testing.T) {
	m, d, series, gangs := sampleRun().Result()
	want := Metrics{
		Scheduler: "muster",
		// 5 bindings in 200ms of busy time.
		PodsPerSecond: 25,
		// latencies 2, 4, 10 ms: nearest rank p50 = 2nd = 4, p99 = 3rd = 10.
		GangLatencyP50Ms: 4, GangLatencyP99Ms: 10,
		// running GPU-seconds 8*10 + 16*10 + 16*10 + 8*20 = 560 of 24*50 = 1200.
		GPUAllocationRatio: 560.0 / 1200,
		MakespanS:          50,
		// JCTs 20, 50, 20.
		MeanJCTS:   30,
		GangsTotal: 3, GangsCompleted: 3,
		PartialGangs: 1, DeadlockedGangs: 0,
		// racks 1, 1, 2.
		MeanRacksPerGang:      4.0 / 3,
		PreemptibleGangsMixed: 1,
	}
	if !approxEqual(m, want) {
		t.Errorf("metrics:\n got %+v\nwant %+v", m, want)
	}
	// held GPU-seconds 12*10 + 20*10 + 16*10 + 8*20 = 640 of 1200.
	if math.Abs(d.HeldGPURatio-640.0/1200) > 1e-9 || d.PodsBound != 5 || d.Steps != 5 {
		t.Errorf("details: held %.3f, pods bound %d, steps %d; want %.3f, 5, 5", d.HeldGPURatio, d.PodsBound, d.Steps, 640.0/1200)
	}
	if len(series) != 5 || len(gangs) != 3 || gangs[1].Name != "b" || gangs[1].Placed != 20 {
		t.Errorf("series %d samples, gangs %+v", len(series), gangs)
	}
}

func TestDeadlockedAtEnd(t *testing.T) {
	r := NewRecorder("default")
	r.Submitted("a", 4, 1, 0, 0)
	r.Submitted("b", 4, 1, 0, 0)
	r.Step(Sample{T: 0, CapacityGPUs: 8, HeldGPUs: 8}, time.Second, 4, []string{"a", "b"})
	// Nothing can change; the simulator carries the run to the horizon.
	r.Step(Sample{T: 3600, CapacityGPUs: 8, HeldGPUs: 8}, 0, 0, []string{"a", "b"})
	r.End(3600*s, map[string]int{"a": 2, "b": 2})
	m, d, _, gangs := r.Result()
	if m.PartialGangs != 2 || m.DeadlockedGangs != 2 || m.GangsCompleted != 0 {
		t.Errorf("partial %d, deadlocked %d, completed %d; want 2, 2, 0", m.PartialGangs, m.DeadlockedGangs, m.GangsCompleted)
	}
	if m.GPUAllocationRatio != 0 || d.HeldGPURatio != 1 || m.MakespanS != 3600 {
		t.Errorf("allocation %.2f, held %.2f, makespan %.0f; want 0, 1, 3600", m.GPUAllocationRatio, d.HeldGPURatio, m.MakespanS)
	}
	if m.GangLatencyP50Ms != 0 || m.MeanJCTS != 0 || gangs[0].BoundAtEnd != 2 || d.GangsPendingAtEnd != 0 {
		t.Errorf("no gang ran, yet latency %.1f, JCT %.1f; bound at end %d, pending %d", m.GangLatencyP50Ms, m.MeanJCTS, gangs[0].BoundAtEnd, d.GangsPendingAtEnd)
	}
}

// A gang partial in one observation and whole in the next counts as partial
// but not deadlocked.
func TestPartialThenWhole(t *testing.T) {
	r := NewRecorder("default")
	r.Submitted("a", 2, 4, 0, 0)
	r.Step(Sample{T: 0, CapacityGPUs: 8, HeldGPUs: 4}, time.Second, 1, []string{"a"})
	r.Placed("a", 10*s, time.Millisecond, Placement{Racks: 1})
	r.Step(Sample{T: 10, CapacityGPUs: 8, HeldGPUs: 8, RunningGPUs: 8}, time.Second, 1, nil)
	r.End(10*s, nil)
	m, _, _, _ := r.Result()
	if m.PartialGangs != 1 || m.DeadlockedGangs != 0 {
		t.Errorf("partial %d, deadlocked %d; want 1, 0", m.PartialGangs, m.DeadlockedGangs)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		values []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(5, 1, 3, 2, 4), 50, 3 * time.Millisecond},
		{ms(5, 1, 3, 2, 4), 99, 5 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
	} {
		if got := Percentile(c.values, c.p); got != c.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", c.values, c.p, got, c.want)
		}
	}
}

// report.json's per-scheduler objects have exactly the fields.
func TestMetricsFields(t *testing.T) {
	data, err := json.Marshal(Metrics{})
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range fields {
		got = append(got, k)
	}
	sort.Strings(got)
	want := []string{"deadlocked_gangs", "gang_latency_p50_ms", "gang_latency_p99_ms", "gangs_completed", "gangs_total",
		"goodput_common_window", "gpu_allocation_common_window", "gpu_allocation_ratio", "lost_gpu_hours", "makespan_s",
		"mean_jct_s", "mean_racks_per_gang", "partial_gangs", "pods_per_second", "preemptible_gangs_mixed",
		"queue_wait_p50_s", "queue_wait_p95_s", "scheduler", "stuck_gangs"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields %v, want %v", got, want)
	}
}

func approxEqual(a, b Metrics) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return a.Scheduler == b.Scheduler && near(a.PodsPerSecond, b.PodsPerSecond) &&
		near(a.GangLatencyP50Ms, b.GangLatencyP50Ms) && near(a.GangLatencyP99Ms, b.GangLatencyP99Ms) &&
		near(a.GPUAllocationRatio, b.GPUAllocationRatio) && near(a.MakespanS, b.MakespanS) && near(a.MeanJCTS, b.MeanJCTS) &&
		a.GangsTotal == b.GangsTotal && a.GangsCompleted == b.GangsCompleted && a.PartialGangs == b.PartialGangs &&
		a.DeadlockedGangs == b.DeadlockedGangs && near(a.MeanRacksPerGang, b.MeanRacksPerGang) &&
		a.PreemptibleGangsMixed == b.PreemptibleGangsMixed
}

// Waits count only jobs above the lowest priority, a job never placed waits
// until the end, and a gang evicted twice counts twice.
// A recorder that forgets finished gangs computes the same metrics and
// details (percentiles and preemption figures included) as one that keeps
// them, and logs only the gangs that did not finish.
func TestForgetFinishedKeepsTheMetrics(t *testing.T) {
	run := func(r *Recorder) *Recorder {
		r.Submitted("low-a", 2, 8, 0, 0)
		r.Submitted("low-b", 1, 8, 0, 0)
		r.Placed("low-a", 0, time.Millisecond, Placement{Racks: 1})
		r.Placed("low-b", 0, 2*time.Millisecond, Placement{Racks: 2})
		r.Submitted("high-a", 2, 8, 100, 10*s)
		r.Evicted(Eviction{Gang: "low-a", Pods: 2, GPUPods: 2, GPUs: 16})
		r.Placed("high-a", 10*s, 3*time.Millisecond, Placement{Racks: 1})
		r.Completed("low-b", 30*s)
		r.Submitted("high-b", 1, 8, 100, 20*s)
		r.Placed("high-b", 50*s, 0, Placement{})
		r.Completed("high-a", 60*s)
		r.Submitted("high-c", 1, 8, 100, 40*s)
		r.Step(Sample{T: 60, CapacityGPUs: 24, HeldGPUs: 8, RunningGPUs: 8}, 0, 4, nil)
		r.End(100*s, map[string]int{"high-b": 1})
		return r
	}
	keeping := run(NewRecorder("muster"))
	forgetting := NewRecorder("muster")
	forgetting.ForgetFinished()
	run(forgetting)
	mk, dk, _, logsKept := keeping.Result()
	mf, df, _, logsForgetting := forgetting.Result()
	if mk != mf {
		t.Errorf("metrics differ:\n keeping   %+v\n forgetting %+v", mk, mf)
	}
	if !reflect.DeepEqual(dk, df) || df.Preemption == nil {
		t.Errorf("details differ:\n keeping   %+v %+v\n forgetting %+v %+v", dk, dk.Preemption, df, df.Preemption)
	}
	var names []string
	for _, l := range logsForgetting {
		names = append(names, l.Name)
	}
	if want := []string{"low-a", "high-b", "high-c"}; !reflect.DeepEqual(names, want) || len(logsKept) != 5 {
		t.Errorf("gangs logged: keeping %d, forgetting %v; want 5 and %v", len(logsKept), names, want)
	}
	if len(forgetting.gangs) != 3 {
		t.Errorf("the forgetting recorder keeps %d gangs, want the 3 unfinished", len(forgetting.gangs))
	}
}

func TestPreemption(t *testing.T) {
	r := NewRecorder("muster")
	r.Submitted("low-a", 2, 8, 0, 0)
	r.Submitted("low-b", 1, 8, 0, 0)
	r.Placed("low-a", 0, 0, Placement{})
	r.Placed("low-b", 0, 0, Placement{})
	r.Submitted("high-a", 2, 8, 100, 10*s)
	r.NeededForPriority(16)
	r.Evicted(Eviction{Gang: "low-a", Pods: 2, GPUPods: 2, GPUs: 16})
	r.Placed("high-a", 10*s, 0, Placement{})
	r.Submitted("high-b", 1, 8, 100, 20*s)
	r.NeededForPriority(8)
	r.Evicted(Eviction{Gang: "low-b", Pods: 1, GPUPods: 1, GPUs: 8, Partial: true})
	r.Evicted(Eviction{Gang: "low-a", Pods: 1, GPUPods: 1, GPUs: 8})
	r.Placed("high-b", 50*s, 0, Placement{})
	r.Placed("high-b", 70*s, 0, Placement{}) // placed again after a restart: the first placement counts
	r.Submitted("high-c", 1, 8, 100, 40*s)
	r.End(100*s, nil)
	_, d, _, logs := r.Result()
	want := &Preemption{HighJobs: 3, HighWaitP50S: 30, HighWaitP99S: 60, HighNotPlaced: 1, PodsEvicted: 4, GPUsEvicted: 32,
		GPUsNeededLowerBound: 24, VictimGangs: 3, VictimGangsPartial: 1}
	if !reflect.DeepEqual(d.Preemption, want) {
		t.Errorf("preemption = %+v, want %+v", d.Preemption, want)
	}
	if logs[0].Restarts != 2 || logs[1].Restarts != 1 {
		t.Errorf("restarts of low-a, low-b = %d, %d; want 2, 1", logs[0].Restarts, logs[1].Restarts)
	}

	one := NewRecorder("muster")
	one.Submitted("a", 1, 8, 5, 0)
	one.Submitted("b", 1, 8, 5, 0)
	one.End(0, nil)
	if _, d, _, _ := one.Result(); d.Preemption != nil {
		t.Errorf("a run of one priority reported preemption %+v", d.Preemption)
	}
}

// Non-GPU pods evicted are background pods and CPU-only members evicted
// without any GPU member of their gang; CPU-only members taken with their
// gang's GPU members are counted apart. A run of one priority in which the
// scheduler deleted something still reports it.
func TestNonGPUPodsEvicted(t *testing.T) {
	r := NewRecorder("default")
	for _, g := range []string{"whole", "worker-only", "ps-only"} {
		r.Submitted(g, 2, 8, 0, 0)
		r.Placed(g, 0, 0, Placement{})
	}
	r.Submitted("high", 4, 8, 100, 10*s)
	// whole: 2 workers and the PS in one step; worker-only: one worker;
	// ps-only: the PS alone; and three background pods in two steps.
	r.Evicted(Eviction{Gang: "whole", At: 10 * s, Pods: 3, GPUPods: 2, GPUs: 16})
	r.Evicted(Eviction{Gang: "worker-only", At: 10 * s, Pods: 1, GPUPods: 1, GPUs: 8, Partial: true})
	r.Evicted(Eviction{Gang: "ps-only", At: 10 * s, Pods: 1, Partial: true})
	r.BackgroundEvicted(2)
	r.BackgroundEvicted(1)
	r.Placed("high", 10*s, 0, Placement{})
	r.End(20*s, nil)
	_, d, _, _ := r.Result()
	p := d.Preemption
	if p == nil {
		t.Fatal("no preemption record")
	}
	if p.NonGPUPodsEvicted != 1+3 || p.CPUMembersWithGang != 1 || p.PodsEvicted != 3+1+1+3 || p.GPUsEvicted != 24 || p.VictimGangs != 3 {
		t.Errorf("non-GPU %d (want 4), with gang %d (want 1), pods %d (want 8), GPUs %d (want 24), victim gangs %d (want 3)",
			p.NonGPUPodsEvicted, p.CPUMembersWithGang, p.PodsEvicted, p.GPUsEvicted, p.VictimGangs)
	}

	one := NewRecorder("default")
	one.Submitted("a", 1, 8, 0, 0)
	one.BackgroundEvicted(1)
	one.End(0, nil)
	if _, d, _, _ := one.Result(); d.Preemption == nil || d.Preemption.NonGPUPodsEvicted != 1 || d.Preemption.HighJobs != 0 {
		t.Errorf("one priority, a background pod evicted: preemption %+v; want it reported", d.Preemption)
	}
}

// A gang whose run is cut short by a reclaim counts as allocated while it
// runs but not as goodput; the window decides what is counted; a job never
// placed waits until the end and is stuck when nothing of it is bound.
//
//	16-GPU cluster. t=0: a (2 × 4) placed. t=0: b (1 × 8) submitted, placed
//	at 10, its node reclaimed at 30, placed again at 40, completes at 100.
//	a completes at 60. c (1 × 16) submitted at 20, never placed; end at 100.
func TestGoodputWindowAndWaits(t *testing.T) {
	r := NewRecorder("muster")
	r.Submitted("a", 2, 4, 0, 0)
	r.Submitted("b", 1, 8, 0, 0)
	r.Placed("a", 0, 0, Placement{})
	r.Step(Sample{T: 0, CapacityGPUs: 16, HeldGPUs: 8, RunningGPUs: 8}, 0, 2, nil)
	r.Placed("b", 10*s, 0, Placement{})
	r.Step(Sample{T: 10, CapacityGPUs: 16, HeldGPUs: 16, RunningGPUs: 16}, 0, 1, nil)
	r.Submitted("c", 1, 16, 0, 20*s)
	r.Step(Sample{T: 20, CapacityGPUs: 16, HeldGPUs: 16, RunningGPUs: 16}, 0, 0, nil)
	r.Broken("b", 30*s)
	r.Step(Sample{T: 30, CapacityGPUs: 16, HeldGPUs: 8, RunningGPUs: 8}, 0, 0, nil)
	r.Placed("b", 40*s, 0, Placement{})
	r.Step(Sample{T: 40, CapacityGPUs: 16, HeldGPUs: 16, RunningGPUs: 16}, 0, 1, nil)
	r.Completed("a", 60*s)
	r.Step(Sample{T: 60, CapacityGPUs: 16, HeldGPUs: 8, RunningGPUs: 8}, 0, 0, nil)
	r.Completed("b", 100*s)
	r.Step(Sample{T: 100, CapacityGPUs: 16}, 0, 0, nil)
	r.End(100*s, map[string]int{"c": 0})
	m, _, series, _ := r.Result()

	// Running: 8*10 + 16*20 + 8*10 + 16*20 + 8*40 = 1120 of 1600; b's first
	// run (8 GPUs × 20 s) was lost: goodput 960 of 1600.
	if !near(m.CommonAllocationRatio, 1120.0/1600) || !near(m.GoodputRatio, 960.0/1600) {
		t.Errorf("own window: allocation %.4f, goodput %.4f; want %.4f, %.4f", m.CommonAllocationRatio, m.GoodputRatio, 1120.0/1600, 960.0/1600)
	}
	if !near(m.LostGPUHours, 8*20.0/3600) {
		t.Errorf("lost %.5f GPU-hours, want %.5f", m.LostGPUHours, 8*20.0/3600)
	}
	// Over [0, 20] (the last arrival): 8*10 + 16*10 = 240 of 320, all goodput
	// but b's lost run (8*10): 160 of 320.
	alloc, good := WindowRatios(series, r.Segments(), 0, 20)
	if !near(alloc, 240.0/320) || !near(good, 160.0/320) {
		t.Errorf("window [0, 20]: allocation %.4f, goodput %.4f; want 0.75, 0.5", alloc, good)
	}
	// Waits: a 0, b 10 (its first placement), c 80 (never placed, until the
	// end). p50 = 2nd of 3 = 10, p95 = 3rd = 80.
	if m.QueueWaitP50S != 10 || m.QueueWaitP95S != 80 {
		t.Errorf("queue wait p50 %.0f, p95 %.0f; want 10, 80", m.QueueWaitP50S, m.QueueWaitP95S)
	}
	if m.StuckGangs != 1 || m.DeadlockedGangs != 0 {
		t.Errorf("stuck %d, deadlocked %d; want 1, 0", m.StuckGangs, m.DeadlockedGangs)
	}
}

func near(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
