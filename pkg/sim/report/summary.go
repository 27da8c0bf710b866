package report

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// Markers delimit the generated part of BENCHMARKS.md; the prose around them
// is written by hand.
const (
	BeginMarker = "<!-- BEGIN GENERATED: hack/bench.sh writes this section; do not edit by hand -->"
	EndMarker   = "<!-- END GENERATED -->"
)

// Summary renders the standard set's results (one directory per scenario)
// as the generated section of BENCHMARKS.md.
func Summary(dirs []string, command, elapsed, date string) (string, error) {
	var b strings.Builder
	b.WriteString(BeginMarker + "\n\n")
	var machine *Machine
	var rows []result
	for _, dir := range dirs {
		rep, det, err := Read(dir)
		if err != nil {
			return "", fmt.Errorf("reading results in %s: %w", dir, err)
		}
		rows = append(rows, result{rep, det})
		if machine == nil {
			machine = &det.Machine
		}
	}
	if len(rows) == 0 {
		return "", fmt.Errorf("no results")
	}
	fmt.Fprintf(&b, "Generated %s by `%s`", date, command)
	if elapsed != "" {
		fmt.Fprintf(&b, " in %s", elapsed)
	}
	fmt.Fprintf(&b, ", seed %d. Machine: %s.\n\n", rows[0].rep.Seed, describeMachine(*machine))
	fmt.Fprintf(&b, "Reproduce one scenario: `go run ./cmd/muster-sim --scenario <name> --schedulers muster,default,native-gang --seed %d --out <dir>`.\n\n", rows[0].rep.Seed)

	b.WriteString("| scenario | scheduler | pods/s | × default | gang latency p50 / p99 (ms) | GPU alloc (running) | GPU held | makespan (s) | mean JCT (s) | gangs done / total | partial | deadlocked | racks / gang | mixed spot gangs | peak RSS (MiB) | process wall (s) |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		base := 0.0
		for _, m := range r.rep.Results {
			if m.Scheduler == "default" {
				base = m.PodsPerSecond
			}
		}
		for _, m := range r.rep.Results {
			d := r.det.Schedulers[m.Scheduler]
			ratio := "–"
			if base > 0 {
				ratio = fmt.Sprintf("%.2f×", m.PodsPerSecond/base)
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %.1f / %.1f | %.3f | %.3f | %.0f | %.0f | %d / %d | %d | %d | %.2f | %d | %.0f | %.1f |\n",
				r.rep.Scenario, m.Scheduler, m.PodsPerSecond, ratio, m.GangLatencyP50Ms, m.GangLatencyP99Ms,
				m.GPUAllocationRatio, d.HeldGPURatio, m.MakespanS, m.MeanJCTS, m.GangsCompleted, m.GangsTotal,
				m.PartialGangs, m.DeadlockedGangs, m.MeanRacksPerGang, m.PreemptibleGangsMixed, d.PeakRSSMiB, d.WallSeconds)
		}
	}
	preemptionTable(&b, rows)
	b.WriteString("\nOpportunistic batching in the default profile:\n\n")
	for _, r := range rows {
		if d, ok := r.det.Schedulers["default"]; ok {
			fmt.Fprintf(&b, "- %s: %s\n", r.rep.Scenario, Batching(d))
		}
	}
	b.WriteString("\nPer-scenario reports (tables, scheduler counters, plot): ")
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%s](bench/results/%s/report.md)", r.rep.Scenario, filepath.Base(dirs[i]))
	}
	b.WriteString(".\n\n" + EndMarker + "\n")
	return b.String(), nil
}

// result is one scenario's results directory.
type result struct {
	rep *Report
	det *Details
}

// preemptionTable adds a table for the scenarios with priorities.
func preemptionTable(b *strings.Builder, results []result) {
	started := false
	for _, r := range results {
		rep, det := r.rep, r.det
		if !hasPreemption(*rep, *det) {
			continue
		}
		if !started {
			b.WriteString("\nPriorities and preemption (definitions: measure.Preemption; the lower bound counts GPUs a higher-priority job needed beyond those free when it arrived):\n\n")
			b.WriteString("| scenario | scheduler | higher-priority jobs (not placed) | their wait p50 / p99 (virtual s) | GPUs evicted (lower bound) | pods evicted | victim gangs (left partly running) |\n")
			b.WriteString("|---|---|--:|--:|--:|--:|--:|\n")
			started = true
		}
		for _, m := range rep.Results {
			fmt.Fprintf(b, "| %s | %s |", rep.Scenario, m.Scheduler)
			p := det.Schedulers[m.Scheduler].Preemption
			if p == nil {
				p = &measure.Preemption{}
			}
			for _, row := range preemptionRows {
				fmt.Fprintf(b, " %s |", row.format(*p))
			}
			b.WriteString("\n")
		}
	}
}

// UpdateFile replaces the generated section of path (or appends one).
func UpdateFile(path, section string) error {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(data)
	begin, end := strings.Index(text, BeginMarker), strings.Index(text, EndMarker)
	if begin >= 0 && end > begin {
		text = text[:begin] + strings.TrimSuffix(section, "\n") + text[end+len(EndMarker):]
	} else {
		if text != "" && !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		text += "\n" + section
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
