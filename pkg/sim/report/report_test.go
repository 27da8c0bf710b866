package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

	section, err := Summary([]string{out}, "make bench", "1m2s", "2026-01-02")
	if err != nil {
		t.Fatal(err)
	}
	// muster at 300 pods/s against default's 150.
	if !strings.Contains(section, "| two | muster | 300.0 | 2.00× |") || !strings.Contains(section, "in 1m2s") {
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
