package sim

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/schedulercmd"
	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/report"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// The schedulers log to stderr; keep test output readable.
func TestMain(m *testing.M) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	if config := os.Getenv(childEnv); config != "" {
		os.Exit(runTestChild(config))
	}
	os.Exit(m.Run())
}

// childEnv makes the test binary a simulator child (a JSON ChildConfig):
// native gang scheduling needs a process of its own.
const childEnv = "MUSTER_SIM_TEST_CHILD"

func runTestChild(config string) int {
	var c ChildConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := RunChild(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runInChild runs one scheduler over a scenario file and seed in a child
// process of this test binary.
func runInChild(t *testing.T, scenarioPath, scheduler string, seed uint64) *measure.Run {
	t.Helper()
	c := ChildConfig{ScenarioPath: scenarioPath, Scheduler: scheduler, Seed: seed, Out: t.TempDir(),
		SettleQuiet: time.Millisecond, StepTimeout: time.Minute}
	config, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(config))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child %s: %v\n%s", scheduler, err, out)
	}
	run, err := report.ReadRun(RunPath(c.Out, scheduler))
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// Native gang scheduling once sat in its backoff queue on an empty cluster
// at the end of exact-fill seed 2 (the pod group failed with an error, and
// the simulator only moved the clock to the next scenario event): the run
// stopped with 40 of 41 jobs done and allocation 0.024. Pods in backoff are
// now retried within the step.
func TestNativeGangIsNotStrandedInBackoff(t *testing.T) {
	r := runInChild(t, "../../bench/scenarios/exact-fill.yaml", NativeGang, 2)
	if m := r.Metrics; m.GangsCompleted != m.GangsTotal || m.GPUAllocationRatio < 0.8 {
		t.Errorf("native gang on exact-fill seed 2: %d of %d jobs done, allocation %.3f (%s)",
			m.GangsCompleted, m.GangsTotal, m.GPUAllocationRatio, r.Details.EndReason)
	}
}

func smallPlan(tb testing.TB, seed uint64) *scenario.Plan {
	tb.Helper()
	return benchPlan(tb, "small.yaml", seed)
}

// benchPlan is the plan of bench/scenarios/file for seed.
func benchPlan(tb testing.TB, file string, seed uint64) *scenario.Plan {
	tb.Helper()
	p, err := loadPlan("../../bench/scenarios/"+file, seed)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func run(tb testing.TB, plan *scenario.Plan, scheduler string) *measure.Run {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Run(ctx, Options{Plan: plan, Scheduler: scheduler, StepTimeout: time.Minute})
	if err != nil {
		tb.Fatalf("running %s: %v", scheduler, err)
	}
	return r
}

// placement keeps what the seed decides and drops what the real clock does
// (throughput, latency, busy time).
func placement(r *measure.Run) (measure.Metrics, []measure.GangLog, []measure.Sample) {
	m := r.Metrics
	m.PodsPerSecond, m.GangLatencyP50Ms, m.GangLatencyP99Ms = 0, 0, 0
	return m, r.Gangs, r.Series
}

// The same seed gives muster the same placements, and so the same placement
// metrics; the run holds no partial gang and completes every job.
func TestSameSeedSamePlacement(t *testing.T) {
	plan := smallPlan(t, 1)
	first := run(t, plan, Muster)
	second := run(t, smallPlan(t, 1), Muster)

	m1, g1, s1 := placement(first)
	m2, g2, s2 := placement(second)
	if !reflect.DeepEqual(m1, m2) {
		t.Errorf("placement metrics differ between two runs of seed 1:\n%+v\n%+v", m1, m2)
	}
	if !reflect.DeepEqual(g1, g2) {
		t.Errorf("gang placements differ between two runs of seed 1:\n%+v\n%+v", g1, g2)
	}
	if !reflect.DeepEqual(s1, s2) {
		t.Errorf("allocation series differ between two runs of seed 1")
	}
	if m1.GangsTotal != len(plan.Jobs) || m1.GangsCompleted != m1.GangsTotal {
		t.Errorf("muster completed %d of %d gangs (want all %d)", m1.GangsCompleted, m1.GangsTotal, len(plan.Jobs))
	}
	if m1.PartialGangs != 0 || m1.DeadlockedGangs != 0 {
		t.Errorf("muster left partial gangs: %d partial, %d deadlocked", m1.PartialGangs, m1.DeadlockedGangs)
	}
	if first.Details.PodsBound != plan.TotalPods() || first.Details.StalledSteps != 0 {
		t.Errorf("bound %d of %d pods with %d stalled steps", first.Details.PodsBound, plan.TotalPods(), first.Details.StalledSteps)
	}
	for _, g := range first.Gangs {
		if g.Placed < g.Submitted || g.Completed <= g.Placed {
			t.Errorf("gang %s: submitted %.0fs, placed %.0fs, completed %.0fs", g.Name, g.Submitted, g.Placed, g.Completed)
		}
	}
}

// The default profile runs the same plan through the same harness: every pod
// is bound eventually on small (it has room for every gang in turn).
func TestDefaultProfileRuns(t *testing.T) {
	plan := smallPlan(t, 1)
	r := run(t, plan, Default)
	if r.Metrics.GangsCompleted != len(plan.Jobs) || r.Details.StalledSteps != 0 {
		t.Errorf("default completed %d of %d gangs, %d stalled steps (%s)", r.Metrics.GangsCompleted, len(plan.Jobs), r.Details.StalledSteps, r.Details.EndReason)
	}
	if r.Details.Extra["gate_opportunistic_batching"] != 1 {
		t.Errorf("OpportunisticBatching is on by default in 1.37; extra = %v", r.Details.Extra)
	}
}

// Native gang scheduling turns on a process-wide feature gate, which would
// change every later scheduler in the process; it is refused here and run in
// a child process by RunAll.
func TestNativeGangNeedsItsOwnProcess(t *testing.T) {
	if err := ensureGate(Muster); err != nil {
		t.Fatalf("muster in a fresh process: %v", err)
	}
	if _, err := ParseSchedulers("muster,nope"); err == nil {
		t.Error("ParseSchedulers accepted an unknown scheduler")
	}
	if got, err := ParseSchedulers(" default,muster,default "); err != nil || !reflect.DeepEqual(got, []string{Default, Muster}) {
		t.Errorf("ParseSchedulers = %v, %v", got, err)
	}
}

func TestMusterConfigIsTheShippedProfile(t *testing.T) {
	cfg, err := MusterConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != "muster" {
		t.Fatalf("profiles %+v, want one named muster", cfg.Profiles)
	}
	p := cfg.Profiles[0].Plugins
	if p.QueueSort.Enabled[0].Name != "MusterGang" {
		t.Errorf("queueSort = %+v, want MusterGang", p.QueueSort.Enabled)
	}
	for _, pl := range p.PostFilter.Enabled {
		if pl.Name == "DefaultPreemption" {
			t.Error("DefaultPreemption is enabled; the shipped profile disables it")
		}
	}
}

// BenchmarkSmall drives each scheduler through the small scenario; pods/s is
// the simulator's metric (bindings per second of scheduler busy time).
func BenchmarkSmall(b *testing.B) {
	for _, name := range []string{Muster, Default} {
		b.Run(name, func(b *testing.B) {
			var pps float64
			for i := 0; i < b.N; i++ {
				r := run(b, smallPlan(b, 1), name)
				pps += r.Metrics.PodsPerSecond
			}
			b.ReportMetric(pps/float64(b.N), "pods/s")
		})
	}
}

// Off a terminal the bar writes a line per 10% and one at the end, and
// nothing for runs shorter than two seconds.
func TestProgressLines(t *testing.T) {
	var out strings.Builder
	quiet := NewProgress(&out, "muster", false)
	quiet.Update(ProgressState{Done: 5, Total: 10})
	quiet.Done(ProgressState{Done: 10, Total: 10})
	if out.Len() != 0 {
		t.Fatalf("a run under two seconds printed %q", out.String())
	}
	p := NewProgress(&out, "muster", false)
	p.start = p.start.Add(-progressDelay)
	for done := 0; done <= 10; done++ {
		p.Update(ProgressState{Done: done, Total: 10, Virtual: time.Duration(done) * time.Minute})
		p.Update(ProgressState{Done: done, Total: 10, Virtual: time.Duration(done) * time.Minute})
	}
	p.Done(ProgressState{Done: 10, Total: 10})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 11 || !strings.Contains(lines[10], "100%  10/10 jobs done") {
		t.Errorf("got %d lines, want 11 ending at 100%%:\n%s", len(lines), out.String())
	}
}

// cleanPriority is the priority scenario as it was before it got the
// realistic background: one node size, so every GPU a higher-priority job
// needs beyond the free ones can come from whole 8-GPU-worker gangs, and the
// lower bound on GPUs evicted is nearly tight.
const cleanPriority = `
name: priority-clean
tick: 1s
horizon: 12h
cluster: {nodes: 32, gpusPerNode: 8, nodesPerRack: 8, zones: 1}
workload:
  podOrder: interleaved
  waves:
  - {at: 0s, duration: 4h, shuffle: true, gangs: ["3*4x8", "8*2x8", "4*1x8"]}
  - {at: 10m, duration: 30m, priority: 1000, gangs: ["2x8"]}
  - {at: 20m, duration: 30m, priority: 1000, gangs: ["3x8"]}
  - {at: 30m, duration: 30m, priority: 1000, gangs: ["4x4"]}
  - {at: 40m, duration: 30m, priority: 1000, gangs: ["1x8"]}
  - {at: 50m, duration: 30m, priority: 1000, gangs: ["4x8"]}
`

// On the priority scenario (realistic background: two node sizes, CPU-only
// pods under budgets, parameter servers) muster places every
// higher-priority job in the step it arrives, evicting whole gangs only and
// no pod that asks for no GPU; on a clean cluster of one node size it
// evicts no more GPUs than one gang beyond what no scheduler can avoid. The
// default profile's pod-by-pod preemption leaves victim gangs partly
// running.
func TestPriorityPreemptsWholeGangs(t *testing.T) {
	plan := benchPlan(t, "priority.yaml", 1)
	if len(plan.Background) == 0 || plan.SmallNodes() == 0 || plan.CPUMemberJobs() == 0 {
		t.Fatal("the priority scenario has lost its realistic background")
	}
	r := run(t, plan, Muster)
	p := r.Details.Preemption
	if p == nil {
		t.Fatal("no preemption record for a scenario with two priorities")
	}
	if p.HighNotPlaced != 0 || p.HighWaitP99S != 0 {
		t.Errorf("higher-priority jobs: %d not placed, wait p99 %.0fs; want all placed on arrival", p.HighNotPlaced, p.HighWaitP99S)
	}
	if p.VictimGangs == 0 || p.VictimGangsPartial != 0 {
		t.Errorf("victim gangs %d, left partly running %d; want some, none partial", p.VictimGangs, p.VictimGangsPartial)
	}
	if p.NonGPUPodsEvicted != 0 {
		t.Errorf("muster evicted %d pods that ask for no GPU apart from their gang's GPU members; want 0", p.NonGPUPodsEvicted)
	}
	if m := r.Metrics; m.GangsCompleted != m.GangsTotal || m.PartialGangs != 0 || r.Details.StalledSteps != 0 {
		t.Errorf("muster completed %d of %d, %d partial, %d stalled steps", m.GangsCompleted, m.GangsTotal, m.PartialGangs, r.Details.StalledSteps)
	}

	d := run(t, plan, Default).Details.Preemption
	if d == nil || d.VictimGangsPartial == 0 {
		t.Errorf("default profile: %+v; want victim gangs left partly running (pod-by-pod preemption)", d)
	}

	clean := parsePlan(t, cleanPriority, 1)
	c := run(t, clean, Muster).Details.Preemption
	if c == nil || c.GPUsEvicted < c.GPUsNeededLowerBound || c.GPUsEvicted > c.GPUsNeededLowerBound+16 || c.VictimGangsPartial != 0 {
		t.Errorf("clean cluster: %+v; want GPUs evicted within one 16-GPU gang of the lower bound, no victim left partly running", c)
	}
}

// The other schedulers get each job's preemptible policy as node affinity:
// forbid and require bind, avoid (also the default) and prefer only score.
func TestSpotAffinityTranslatesThePolicy(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		required bool
		op       v1.NodeSelectorOperator
	}{
		{"forbid", true, v1.NodeSelectorOpDoesNotExist},
		{"require", true, v1.NodeSelectorOpIn},
		{"prefer", false, v1.NodeSelectorOpIn},
		{"avoid", false, v1.NodeSelectorOpDoesNotExist},
		{"", false, v1.NodeSelectorOpDoesNotExist},
	} {
		na := spotAffinity(tc.policy).NodeAffinity
		var terms []v1.NodeSelectorTerm
		if na.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			terms = na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		}
		for _, p := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, p.Preference)
		}
		if len(terms) != 1 || (na.RequiredDuringSchedulingIgnoredDuringExecution != nil) != tc.required ||
			terms[0].MatchExpressions[0].Key != configv1.LabelGKESpot || terms[0].MatchExpressions[0].Operator != tc.op {
			t.Errorf("policy %q: %+v; want required=%v, %s on %s", tc.policy, na, tc.required, tc.op, configv1.LabelGKESpot)
		}
	}
}

// Over as many seeds as there are schedulers, each runs first once.
func TestRotatedOrder(t *testing.T) {
	names := []string{"a", "b", "c"}
	first := map[string]int{}
	for seed := uint64(1); seed <= 3; seed++ {
		order := RotatedOrder(names, seed)
		if len(order) != 3 {
			t.Fatalf("seed %d: order %v", seed, order)
		}
		first[order[0]]++
	}
	if first["a"] != 1 || first["b"] != 1 || first["c"] != 1 || RotatedOrder(names, 1)[0] != "a" {
		t.Errorf("first runs per scheduler %v; want each once, seed 1 as listed", first)
	}
}

// The packing control is the default profile with MostAllocated scoring on
// muster's weights, and nothing else changed.
func TestMostAllocatedControl(t *testing.T) {
	cfg, err := schedulercmd.DecodeConfig([]byte(mostAllocatedConfig), DefaultMostAllocated)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Profiles[0]
	if p.SchedulerName != v1.DefaultSchedulerName || len(p.PluginConfig) == 0 {
		t.Fatalf("profile %+v", p)
	}
	found := false
	for _, pc := range p.PluginConfig {
		if args, ok := pc.Args.(*schedulerapi.NodeResourcesFitArgs); ok {
			s := args.ScoringStrategy
			found = s.Type == schedulerapi.MostAllocated && len(s.Resources) == 3 && s.Resources[0].Name == configv1.DefaultGPUResourceName && s.Resources[0].Weight == 5
		}
	}
	if !found {
		t.Errorf("NodeResourcesFit args are not MostAllocated with nvidia.com/gpu weight 5: %+v", p.PluginConfig)
	}
}

// None binds every pod itself (no scheduling attempt) and refuses a
// scenario in which a pod does not fit on arrival.
func TestNoneIsTheHarnessAlone(t *testing.T) {
	plan := benchPlan(t, "equal-burst-g8-n1000.yaml", 1)
	r := run(t, plan, None)
	if r.Details.PodsBound != plan.TotalPods() || r.Metrics.GangsCompleted != len(plan.Jobs) || r.Details.Extra["schedule_attempts"] != 0 {
		t.Errorf("none: %d of %d pods bound, %d of %d jobs done, %.0f attempts", r.Details.PodsBound, plan.TotalPods(),
			r.Metrics.GangsCompleted, len(plan.Jobs), r.Details.Extra["schedule_attempts"])
	}
	// The harness binds as it creates the pods: no scheduler latency, and
	// never a negative one.
	if r.Metrics.GangLatencyP50Ms != 0 || r.Metrics.GangLatencyP99Ms != 0 {
		t.Errorf("none: gang latency p50 %.1f ms, p99 %.1f ms; want 0", r.Metrics.GangLatencyP50Ms, r.Metrics.GangLatencyP99Ms)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := Run(ctx, Options{Plan: smallPlan(t, 1), Scheduler: None, StepTimeout: time.Minute}); err == nil || !strings.Contains(err.Error(), "every pod fits") {
		t.Errorf("none on small (the second wave waits for capacity): err = %v", err)
	}
}
