package report

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// plannerTargets are issue 15's bounds on planning one gang, by cluster
// size: ms per plan, median of the runs (beside throughputTargets).
var plannerTargets = map[int]float64{5000: 1, 15000: 2}

// benchLine matches one result line of `go test -bench`:
// "BenchmarkCompute/nodes=5000/8x8gpu-avoid-2   2823   434805 ns/op ...".
var benchLine = regexp.MustCompile(`^(Benchmark[^/\s]+)/nodes=(\d+)/(\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op`)

// benchRepeat matches a further run of the case named last: when a
// benchmark logs while it sets up (as the framework does, to stderr), go
// test prints the case's name only before its first run.
var benchRepeat = regexp.MustCompile(`^\s+\d+\s+([\d.]+) ns/op`)

// plannerCase is one benchmark case and its runs (ms per plan).
type plannerCase struct {
	bench, name string
	nodes       int
	ms          []float64
}

// parsePlanner reads the cases of `go test -bench -count N` output in the
// order they first appear.
func parsePlanner(out string) []*plannerCase {
	var cases []*plannerCase
	byKey := map[string]*plannerCase{}
	var last *plannerCase
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			if r := benchRepeat.FindStringSubmatch(sc.Text()); r != nil && last != nil {
				if ns, err := strconv.ParseFloat(r[1], 64); err == nil {
					last.ms = append(last.ms, ns/1e6)
				}
			}
			continue
		}
		nodes, _ := strconv.Atoi(m[2])
		ns, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			continue
		}
		key := m[1] + "/" + m[2] + "/" + m[3]
		c := byKey[key]
		if c == nil {
			c = &plannerCase{bench: m[1], name: m[3], nodes: nodes}
			byKey[key] = c
			cases = append(cases, c)
		}
		c.ms = append(c.ms, ns/1e6)
		last = c
	}
	return cases
}

// checkBench is the benchmark of muster's filter check alone for the same
// gangs as planBench (its name before was BenchmarkFrameworkFloor, still
// read from older results); its cases are shown beside the plan's, not as
// rows of their own.
const (
	planBench     = "BenchmarkPlanGang"
	checkBench    = "BenchmarkFilterCheck"
	oldCheckBench = "BenchmarkFrameworkFloor"
)

// plannerTable renders the planner benchmarks (make bench's
// bench/results/planner.txt): ms per gang plan, median and range, the
// filter check alone for the same gang, and the targets per cluster size.
func plannerTable(b *strings.Builder, out string) {
	cases := parsePlanner(out)
	if len(cases) == 0 {
		return
	}
	checks := map[string]Spread{}
	for _, c := range cases {
		if c.bench == checkBench || c.bench == oldCheckBench {
			checks[fmt.Sprintf("%d/%s", c.nodes, c.name)] = SpreadOf(c.ms)
		}
	}
	b.WriteString("\n### Planning one gang\n\n")
	b.WriteString("`BenchmarkCompute` is the planner alone over a busy snapshot of 8-GPU nodes in 32-node racks; `BenchmarkPlanGang` is the whole plan in the first member's PreFilter as the scheduler pays it, over empty nodes: node views, the planner, and the profile's own PreFilter and Filter plugins confirming every choice for every member (`-onepernode`: workers with a one-per-node pod anti-affinity, for which InterPodAffinity's PreFilter reads every node once per member). ms per plan, median (range) of the runs (bench/results/planner.txt).\n\n")
	b.WriteString("The filter check (`BenchmarkFilterCheck`) is the part of muster's plan that confirms a perfect guess: each member's PodInfo, the profile's PreFilter plugins, and its Filter plugins on the one node the plan chose. It is muster's own dry run (the members' scheduling cycles then run the same plugins again), not a lower bound on what a scheduler on this framework pays; *plan ÷ check* is the planner's search over that confirmation.\n\n")
	b.WriteString("| benchmark | nodes | gang | ms per plan | runs | filter check, ms | plan ÷ check | target |\n|---|--:|---|--:|--:|--:|--:|---|\n")
	type benchNodes struct {
		bench string
		nodes int
	}
	worst := map[benchNodes]float64{}
	var order []benchNodes
	targeted, missed := 0, 0
	for _, c := range cases {
		if c.bench == checkBench || c.bench == oldCheckBench {
			continue
		}
		s := SpreadOf(c.ms)
		check, ratio := "–", "–"
		if f, ok := checks[fmt.Sprintf("%d/%s", c.nodes, c.name)]; ok && c.bench == planBench {
			check, ratio = f.Format("%.3f"), fmt.Sprintf("%.2f×", s.Median/f.Median)
		}
		target := "–"
		if want, ok := plannerTargets[c.nodes]; ok {
			met := "met"
			targeted++
			if s.Median > want {
				met = "**not met**"
				missed++
			}
			target = fmt.Sprintf("≤ %g ms: %s", want, met)
			k := benchNodes{c.bench, c.nodes}
			if _, seen := worst[k]; !seen {
				order = append(order, k)
			}
			worst[k] = max(worst[k], s.Median)
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %d | %s | %s | %s |\n", c.bench, c.nodes, c.name, s.Format("%.3f"), s.N, check, ratio, target)
	}
	for _, k := range order {
		fmt.Fprintf(b, "\n%s, slowest median at %d nodes: %.3f ms (target ≤ %g ms).", k.bench, k.nodes, worst[k], plannerTargets[k.nodes])
	}
	if targeted > 0 {
		fmt.Fprintf(b, "\n\nTargets not met: %d of %d cases.", missed, targeted)
	}
	b.WriteString("\n")
}
