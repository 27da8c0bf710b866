package report

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

func testPlan(t *testing.T) *scenario.Plan {
	t.Helper()
	s, err := scenario.Parse([]byte("name: two\ncluster: {nodes: 2, gpusPerNode: 8, nodesPerRack: 2}\nworkload: {waves: [{duration: 1m, gangs: [2x8]}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Expand(3)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testRuns() []*measure.Run {
	run := func(name string, pps, alloc float64, partial int, extra map[string]float64) *measure.Run {
		return &measure.Run{
			Metrics: measure.Metrics{Scheduler: name, PodsPerSecond: pps, GPUAllocationRatio: alloc, GangsTotal: 1, PartialGangs: partial},
			Details: measure.Details{PeakRSSMiB: 100, EndReason: "all jobs finished", Extra: extra},
			Series:  []measure.Sample{{T: 0, CapacityGPUs: 16, HeldGPUs: 16, RunningGPUs: 16}, {T: 60, CapacityGPUs: 16}},
			EndS:    60,
		}
	}
	return []*measure.Run{
		run("muster", 300, 1, 0, map[string]float64{"muster_gangs_scheduled": 1}),
		run("default", 150, 0.5, 1, map[string]float64{"gate_opportunistic_batching": 1, "batch_attempts_no_hint": 2}),
	}
}

func TestWriteAndSummary(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "two")
	if err := Write(out, testPlan(t), testRuns(), "muster-sim --scenario two", Machine{CPUs: 2, GOMAXPROCS: 2, Go: "go1.26", OS: "linux/amd64", Kubernetes: "v1.37.2"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{JSONFile, DetailsFile, MarkdownFile, PlotFile} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	var raw map[string]json.RawMessage
	data, _ := os.ReadFile(filepath.Join(out, JSONFile))
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"scenario", "seed", "nodes", "gpus", "results"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("report.json lacks %q", k)
		}
	}
	rep, det, err := Read(out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scenario != "two" || rep.Seed != 3 || rep.GPUs != 16 || len(rep.Results) != 2 || det.Jobs != 1 || det.Pods != 2 {
		t.Errorf("read back %+v / %+v", rep, det)
	}

	md, _ := os.ReadFile(filepath.Join(out, MarkdownFile))
	for _, want := range []string{"| pods_per_second | 300.0 | 150.0 |", "| partial_gangs | 0 | 1 |",
		"OpportunisticBatching feature gate was on; 0 of 2 scheduling attempts used a batching hint, so batching was effectively off"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	svg, _ := os.ReadFile(filepath.Join(out, PlotFile))
	if !strings.HasPrefix(string(svg), "<svg") || strings.Count(string(svg), "<polyline") != 4 {
		t.Errorf("plot is not an SVG with two lines per scheduler")
	}

	section, err := Summary([]string{out}, SummaryOptions{Command: "make bench", Elapsed: "1m2s", Date: "2026-01-02"})
	if err != nil {
		t.Fatal(err)
	}
	// One burst: the common window ends when the faster run ended (60 s);
	// muster ran over all of it, default over half (partial at the end).
	if !strings.Contains(section, "| two | 3 | muster | 0 / 1 | 0 | 0 | 0 | 1.000 |") || !strings.Contains(section, "in 1m2s") {
		t.Errorf("summary:\n%s", section)
	}

	bench := filepath.Join(dir, "BENCHMARKS.md")
	if err := os.WriteFile(bench, []byte("# Benchmarks\n\nintro\n\n"+BeginMarker+"\nold\n"+EndMarker+"\n\nclosing note\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateFile(bench, section); err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(bench)
	if strings.Contains(string(text), "old") || !strings.Contains(string(text), "intro") || !strings.Contains(string(text), "closing note") ||
		strings.Count(string(text), BeginMarker) != 1 {
		t.Errorf("BENCHMARKS.md after update:\n%s", text)
	}
}

func TestSpreadOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Spread
		text string
	}{
		{[]float64{3, 1, 2}, Spread{2, 1, 3, 3}, "2.0 (1.0–3.0)"},
		{[]float64{4, 1, 2, 3}, Spread{2.5, 1, 4, 4}, "2.5 (1.0–4.0)"},
		{[]float64{5, 5}, Spread{5, 5, 5, 2}, "5.0"},
		{[]float64{math.NaN(), 7}, Spread{7, 7, 7, 1}, "7.0"},
	} {
		got := SpreadOf(c.in)
		if got != c.want || got.Format("%.1f") != c.text {
			t.Errorf("SpreadOf(%v) = %+v %q, want %+v %q", c.in, got, got.Format("%.1f"), c.want, c.text)
		}
	}
	if s := SpreadOf(nil); s.N != 0 || s.Format("%.1f") != "–" {
		t.Errorf("SpreadOf(nil) = %+v", s)
	}
}

// The common window is the plan's arrivals, or for one burst the earliest
// end: never the measured run's own end.
func TestCommonWindow(t *testing.T) {
	plan := testPlan(t) // one job at t=0
	runs := []*measure.Run{{EndS: 90}, {EndS: 60}, {EndS: 7200}}
	if from, to := CommonWindow(plan, runs); from != 0 || to != 60 {
		t.Errorf("burst: window %v–%v, want 0–60", from, to)
	}
	plan.Jobs = append(plan.Jobs, plan.Jobs[0])
	plan.Jobs[1].Submit = 45 * time.Second
	if from, to := CommonWindow(plan, runs); from != 0 || to != 45 {
		t.Errorf("stream: window %v–%v, want 0–45 (the last arrival)", from, to)
	}
}

// Equal-work figures: pods over the span and the ratio to the default
// profile's run of the same seed; nothing is taken out for the harness.
func TestEqualWorkFigures(t *testing.T) {
	peers := &Details{Schedulers: map[string]measure.Details{
		"muster":  {PodsBound: 100, SpanSeconds: 0.5, LoopWallSeconds: 1.5, LoopCPUSeconds: 2, Steps: 4},
		"default": {PodsBound: 100, SpanSeconds: 2, LoopWallSeconds: 3, LoopCPUSeconds: 5, Steps: 4},
		"none":    {PodsBound: 100, SpanSeconds: 0.25, LoopWallSeconds: 1, LoopCPUSeconds: 1, Steps: 4},
	}}
	rep := &Report{Results: []measure.Metrics{{Scheduler: "muster"}, {Scheduler: "default"}, {Scheduler: "none"}}}
	r := seedRun{m: rep.Results[0], d: peers.Schedulers["muster"], peers: peers, rep: rep}
	if got := podsPerSpan(r); got != 200 {
		t.Errorf("pods/s = %v, want 200", got)
	}
	if got := cpuMsPerPod(r); got != 20 { // 2 s / 100 pods
		t.Errorf("CPU ms/pod = %v, want 20", got)
	}
	if got := ratioToDefault(r, podsPerSpan); got != 4 { // 200 / 50
		t.Errorf("ratio to default = %v, want 4", got)
	}
	var b strings.Builder
	targets(&b, []*group{{scenario: "equal-steady-g8-n5000", nodes: 5000, reps: []*Report{rep}, dets: []*Details{peers}}})
	assert.Contains(t, b.String(), "- equal-steady-g8-n5000 (8-worker gangs, 5000 nodes), target ≥ 2.0×: muster ÷ default pods/s 4.00×, met in every run.")
	assert.NotContains(t, b.String(), "net of the harness")
	assert.NotContains(t, b.String(), "The harness alone", "the none run does less harness work than a scheduler's: no ceiling from it")
}

// The preemption tables of report.md and of the summary show the non-GPU
// pods each scheduler evicted; report.md describes the background.
func TestNonGPUPodsEvictedColumn(t *testing.T) {
	s, err := scenario.Parse([]byte(`name: bg
cluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4}
workload: {waves: [{duration: 1m, gangs: [2x8]}, {at: 10s, duration: 1m, priority: 10, gangs: [1x8]}]}
background: {pods: {}, smallNodes: {fraction: 0.5}, cpuMembers: {fraction: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := s.Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	runs := testRuns()
	runs[0].Details.Preemption = &measure.Preemption{HighJobs: 1, PodsEvicted: 3, GPUsEvicted: 16, VictimGangs: 1, CPUMembersWithGang: 1}
	runs[1].Details.Preemption = &measure.Preemption{HighJobs: 1, PodsEvicted: 5, GPUsEvicted: 8, VictimGangs: 1, VictimGangsPartial: 1, NonGPUPodsEvicted: 4}
	out := filepath.Join(t.TempDir(), "bg")
	if err := Write(out, plan, runs, "muster-sim --scenario bg", Machine{CPUs: 2, GOMAXPROCS: 2}); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(out, MarkdownFile))
	for _, want := range []string{
		"| non-GPU pods evicted | 0 | 4 |",
		"| CPU-only members evicted with their gang | 1 | 0 |",
		"- 2 of the nodes have 4 GPUs (the others 8).",
		"2 jobs have a CPU-only member",
		"- Background: 12 CPU-only pods of priority 0",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	section, err := Summary([]string{out}, SummaryOptions{Command: "make bench", Date: "2026-01-02"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| left partly running | non-GPU pods evicted |", "| bg | muster | 0 | 0 / 0 | 16 | 0 | 1 | 0 | 0 |", "| bg | default | 0 | 0 / 0 | 8 | 0 | 1 | 1 | 4 |"} {
		if !strings.Contains(section, want) {
			t.Errorf("summary lacks %q:\n%s", want, section)
		}
	}
}

// Busy equal-work scenarios get a table of their own after the idle one,
// with what the background holds, and no issue-15 target.
func TestBusyEqualWorkTable(t *testing.T) {
	det := func(busy bool) *Details {
		d := &Details{Jobs: 2, Pods: 16, Schedulers: map[string]measure.Details{
			"muster":  {PodsBound: 16, SpanSeconds: 0.1},
			"default": {PodsBound: 16, SpanSeconds: 0.4},
		}}
		if busy {
			d.BackgroundGPUs, d.FreeNodes, d.NoisyNodes, d.AntiAffinity = 5600, 251, 31, "noisy pods"
		}
		return d
	}
	rep := func(name string) *Report {
		return &Report{Scenario: name, Seed: 1, Nodes: 1000, GPUs: 8000, Results: []measure.Metrics{{Scheduler: "muster"}, {Scheduler: "default"}}}
	}
	idle := &group{scenario: "equal-burst-g8-n5000", nodes: 5000, schedulers: []string{"muster", "default"}, reps: []*Report{rep("equal-burst-g8-n5000")}, dets: []*Details{det(false)}}
	busy := &group{scenario: "equal-burst-g8x8-n5000-busy", nodes: 5000, schedulers: []string{"muster", "default"}, reps: []*Report{rep("equal-burst-g8x8-n5000-busy")}, dets: []*Details{det(true)}}
	var b strings.Builder
	equalWorkTables(&b, []*group{idle}, []*group{busy})
	out := b.String()
	idleAt, busyAt := strings.Index(out, "### Equal work: throughput"), strings.Index(out, "### Equal work on a busy cluster")
	if idleAt < 0 || busyAt < idleAt {
		t.Fatalf("want the idle table, then the busy one:\n%s", out)
	}
	assert.Contains(t, out, "- equal-burst-g8x8-n5000-busy: the background holds 5600 of 8000 GPUs (70%); 251 nodes have every GPU free, 31 of them run a pod the workers avoid; 2 jobs, 16 pods; workers avoid noisy pods (seed 1).")
	assert.Contains(t, out[busyAt:], "| equal-burst-g8x8-n5000-busy | 5000 | muster | 160 | 4.00× |")
	assert.NotContains(t, out[:busyAt], "equal-burst-g8x8-n5000-busy |", "the busy scenario is not in the idle table")
	assert.Contains(t, out, "- equal-burst-g8-n5000 (8-worker gangs, 5000 nodes), target ≥ 2.0×")
	assert.NotContains(t, out, "- equal-burst-g8x8-n5000-busy (", "no issue-15 target for a busy scenario")
}

func TestPlansRefusedPer100(t *testing.T) {
	d := measure.Details{Extra: map[string]float64{"muster_plans_installed": 200, "muster_plans_dropped_plan_broken": 1, "muster_plans_dropped_rejected": 2, "muster_plans_dropped_timeout": 5}}
	got, ok := PlansRefusedPer100(d)
	if !ok || got != 1.5 {
		t.Errorf("PlansRefusedPer100 = %v, %v; want 1.5 (3 refused of 200, timeouts not counted)", got, ok)
	}
	if _, ok := PlansRefusedPer100(measure.Details{Extra: map[string]float64{"schedule_attempts": 9}}); ok {
		t.Error("a run without plans reports a share of refused plans")
	}
}

// A summary says on which day and at which commit its figures were
// measured, by scenario when a partial rerun sits beside older results.
func TestSummarySaysWhenEachScenarioWasMeasured(t *testing.T) {
	dir := t.TempDir()
	write := func(name, scenarioName, measured, commit string) string {
		out := filepath.Join(dir, name)
		plan := testPlan(t)
		plan.Scenario.Name = scenarioName
		if err := Write(out, plan, testRuns(), "muster-sim", Machine{CPUs: 2, GOMAXPROCS: 2}); err != nil {
			t.Fatal(err)
		}
		_, det, err := Read(out)
		if err != nil {
			t.Fatal(err)
		}
		if det.Measured != time.Now().UTC().Format(time.DateOnly) {
			t.Errorf("details.json measured %q, want today", det.Measured)
		}
		// As an older run left it (measured "" when written before runs
		// recorded it).
		det.Measured, det.Commit = measured, commit
		data, err := json.Marshal(det)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, DetailsFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return out
	}
	older := write("older", "old-scenario", "", "")
	rerun := write("rerun", "new-scenario", "2026-12-07", "abc1234")
	rerun2 := write("rerun2", "new-scenario", "2026-12-07", "abc1234")

	one, err := Summary([]string{rerun, rerun2}, SummaryOptions{Command: "make bench", Date: "2026-12-07"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(one, "Measured 2026-12-07 at abc1234.") || strings.Contains(one, "more than one day") {
		t.Errorf("one day and commit, summary:\n%s", one)
	}
	merged, err := Summary([]string{older, rerun}, SummaryOptions{Command: "make bench", Date: "2026-12-03"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"runs of more than one day or commit, by scenario",
		"- 2026-12-03 (commit not recorded): old-scenario.", "- 2026-12-07 at abc1234: new-scenario."} {
		if !strings.Contains(merged, want) {
			t.Errorf("merged summary lacks %q:\n%s", want, merged)
		}
	}
}
