package report

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// Markers delimit the generated part of BENCHMARKS.md; the prose around them
// is written by hand and holds no measured number.
const (
	BeginMarker = "<!-- BEGIN GENERATED: hack/bench.sh writes this section; do not edit by hand -->"
	EndMarker   = "<!-- END GENERATED -->"
)

// EqualWorkPrefix names the equal-work scenarios: contention-free, every pod
// fits on arrival, so every scheduler does the same work.
const EqualWorkPrefix = "equal-"

// BusySuffix names the equal-work scenarios on a busy cluster (a
// background that holds most GPUs, workers with anti-affinity); the
// summary shows them in a table of their own.
const BusySuffix = "-busy"

// harnessOnly is the scheduler that schedules nothing (sim.None); its runs
// measure the harness's own cost.
const harnessOnly = "none"

// Spread is the median and range of one figure over runs.
type Spread struct {
	Median, Min, Max float64
	N                int
}

// SpreadOf summarises values (NaN values, figures a run could not give, are
// left out).
func SpreadOf(values []float64) Spread {
	var v []float64
	for _, x := range values {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	sort.Float64s(v)
	median := v[len(v)/2]
	if len(v)%2 == 0 {
		median = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Spread{Median: median, Min: v[0], Max: v[len(v)-1], N: len(v)}
}

// Format prints the median and, when the runs differ, the range:
// "12.3 (11.0–14.2)".
func (s Spread) Format(verb string) string {
	if s.N == 0 {
		return "–"
	}
	med := fmt.Sprintf(verb, s.Median)
	lo, hi := fmt.Sprintf(verb, s.Min), fmt.Sprintf(verb, s.Max)
	if lo == hi {
		return med
	}
	return fmt.Sprintf("%s (%s–%s)", med, lo, hi)
}

// seedRun is one scheduler's run of one seed, with its seed's other runs.
type seedRun struct {
	m     measure.Metrics
	d     measure.Details
	seed  uint64
	peers *Details
	rep   *Report
}

// group is one scenario's results over seeds.
type group struct {
	scenario   string
	nodes      int
	dirs       []string
	reps       []*Report
	dets       []*Details
	schedulers []string // report order
}

func (g *group) runs(scheduler string) []seedRun {
	var out []seedRun
	for i, rep := range g.reps {
		for _, m := range rep.Results {
			if m.Scheduler == scheduler {
				out = append(out, seedRun{m: m, d: g.dets[i].Schedulers[scheduler], seed: rep.Seed, peers: g.dets[i], rep: rep})
			}
		}
	}
	return out
}

// over applies f to the scheduler's run of every seed.
func (g *group) over(scheduler string, f func(seedRun) float64) Spread {
	var v []float64
	for _, r := range g.runs(scheduler) {
		v = append(v, f(r))
	}
	return SpreadOf(v)
}

func (g *group) seeds() []uint64 {
	var out []uint64
	for _, r := range g.reps {
		out = append(out, r.Seed)
	}
	return out
}

func readGroups(dirs []string) ([]*group, *Machine, error) {
	var groups []*group
	byName := map[string]*group{}
	var machine *Machine
	for _, dir := range dirs {
		rep, det, err := Read(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("reading results in %s: %w", dir, err)
		}
		if machine == nil {
			machine = &det.Machine
		}
		g := byName[rep.Scenario]
		if g == nil {
			g = &group{scenario: rep.Scenario, nodes: rep.Nodes}
			byName[rep.Scenario] = g
			groups = append(groups, g)
		}
		g.dirs, g.reps, g.dets = append(g.dirs, dir), append(g.reps, rep), append(g.dets, det)
		for _, m := range rep.Results {
			known := false
			for _, s := range g.schedulers {
				known = known || s == m.Scheduler
			}
			if !known {
				g.schedulers = append(g.schedulers, m.Scheduler)
			}
		}
	}
	if len(groups) == 0 {
		return nil, nil, fmt.Errorf("no results")
	}
	return groups, machine, nil
}

// SummaryOptions say how the results were made.
type SummaryOptions struct {
	Command, Elapsed, Date string
	// Profile is `go tool pprof -top` output of a muster run, and
	// ProfileCommand how it was made ("" when none).
	Profile, ProfileCommand string
	// APIServer is bench/results/apiserver.txt (make bench-api), shown as
	// it is ("" when none).
	APIServer string
	// Planner is the planner benchmarks' `go test -bench` output
	// (bench/results/planner.txt), rendered as a table ("" when none).
	Planner string
}

// Summary renders results directories (one scenario and seed each; several
// seeds of a scenario are aggregated) as the generated section of
// BENCHMARKS.md. Every number in it comes from those files.
func Summary(dirs []string, o SummaryOptions) (string, error) {
	groups, machine, err := readGroups(dirs)
	if err != nil {
		return "", err
	}
	var equal, contended []*group
	for _, g := range groups {
		if strings.HasPrefix(g.scenario, EqualWorkPrefix) {
			equal = append(equal, g)
		} else {
			contended = append(contended, g)
		}
	}
	var b strings.Builder
	b.WriteString(BeginMarker + "\n\n")
	fmt.Fprintf(&b, "Generated %s by `%s`", o.Date, o.Command)
	if o.Elapsed != "" {
		fmt.Fprintf(&b, " in %s", o.Elapsed)
	}
	fmt.Fprintf(&b, ". Machine: %s. Every figure is the median over the seeds listed, with the range in parentheses when the runs differ.\n\n", describeMachine(*machine))
	provenance(&b, groups, o.Date)
	if len(equal) > 0 {
		var idle, busy []*group
		for _, g := range equal {
			if strings.HasSuffix(g.scenario, BusySuffix) {
				busy = append(busy, g)
			} else {
				idle = append(idle, g)
			}
		}
		equalWorkTables(&b, idle, busy)
	}
	if len(contended) > 0 {
		contendedTables(&b, contended)
		preemptionTable(&b, contended)
	}
	refusedPlansTable(&b, groups)
	if o.Planner != "" {
		plannerTable(&b, o.Planner)
	}
	slower(&b, equal, contended)
	if o.Profile != "" {
		fmt.Fprintf(&b, "\nWhere muster's time goes (`%s`):\n\n```\n%s\n```\n", o.ProfileCommand, strings.TrimSpace(o.Profile))
	}
	if o.APIServer != "" {
		fmt.Fprintf(&b, "\nOn the real API server (`make bench-api`, bench/results/apiserver.txt as last written; see the section below for what it measures):\n\n```\n%s\n```\n", strings.TrimSpace(o.APIServer))
	}
	batching(&b, contended)
	b.WriteString("\nPer-run reports (tables, scheduler counters, plot): ")
	for i, g := range groups {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%s](%s)", g.scenario, filepath.ToSlash(filepath.Join(g.dirs[0], MarkdownFile)))
	}
	b.WriteString(".\n\n" + EndMarker + "\n")
	return b.String(), nil
}

// provenance says when and at which commit each scenario's runs were
// made, when the summary merges runs of more than one day or commit (a
// partial rerun kept beside older results). Runs written before reports
// recorded it are dated by the summary's own date.
func provenance(b *strings.Builder, groups []*group, date string) {
	var order []string
	byWhen := map[string][]string{}
	for _, g := range groups {
		whens := map[string]bool{}
		for _, d := range g.dets {
			when := d.Measured
			if when == "" {
				when = date + " (commit not recorded)"
			} else {
				when += atCommit(d.Commit)
			}
			whens[when] = true
		}
		when := strings.Join(slices.Sorted(maps.Keys(whens)), " and ")
		if byWhen[when] == nil {
			order = append(order, when)
		}
		byWhen[when] = append(byWhen[when], g.scenario)
	}
	if len(order) == 1 {
		fmt.Fprintf(b, "Measured %s.\n\n", order[0])
		return
	}
	b.WriteString("The figures come from runs of more than one day or commit, by scenario (absolute pods/s of different days may come from different hosts; compare the ratios, measured within each run):\n\n")
	for _, when := range order {
		fmt.Fprintf(b, "- %s: %s.\n", when, strings.Join(byWhen[when], ", "))
	}
	b.WriteString("\n")
}

// Equal-work figures of one run.
func podsPerSpan(r seedRun) float64 { return float64(r.d.PodsBound) / r.d.SpanSeconds }
func cpuMsPerPod(r seedRun) float64 { return 1000 * r.d.LoopCPUSeconds / float64(r.d.PodsBound) }

func attemptsPerPod(r seedRun) float64 {
	if r.d.PodsBound == 0 {
		return math.NaN()
	}
	return r.d.Extra["schedule_attempts"] / float64(r.d.PodsBound)
}

// ratioToDefault is a figure of r over the same figure of the default
// profile's run of the same seed.
func ratioToDefault(r seedRun, f func(seedRun) float64) float64 {
	d, ok := r.peers.Schedulers["default"]
	if !ok {
		return math.NaN()
	}
	for _, m := range r.rep.Results {
		if m.Scheduler == "default" {
			return f(r) / f(seedRun{m: m, d: d, seed: r.seed, peers: r.peers, rep: r.rep})
		}
	}
	return math.NaN()
}

func seedList(seeds []uint64) string {
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = fmt.Sprint(s)
	}
	return strings.Join(parts, ", ")
}

func equalWorkTables(b *strings.Builder, idle, busy []*group) {
	if len(idle) > 0 {
		idleTable(b, idle)
	}
	if len(busy) > 0 {
		busyTable(b, busy)
	}
	groups := append(append([]*group(nil), idle...), busy...)
	b.WriteString("\nThe harness's own cost (the `none` runs), per step (a step applies one virtual instant's arrivals and completions):\n\n")
	b.WriteString("| scenario | seeds | steps | real time ms/step | CPU ms/step |\n|---|---|--:|--:|--:|\n")
	for _, g := range groups {
		if len(g.runs(harnessOnly)) == 0 {
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", g.scenario, seedList(g.seeds()),
			g.over(harnessOnly, func(r seedRun) float64 { return float64(r.d.Steps) }).Format("%.0f"),
			g.over(harnessOnly, func(r seedRun) float64 { return 1000 * r.d.LoopWallSeconds / float64(r.d.Steps) }).Format("%.2f"),
			g.over(harnessOnly, func(r seedRun) float64 { return 1000 * r.d.LoopCPUSeconds / float64(r.d.Steps) }).Format("%.2f"))
	}
	targets(b, idle)
}

// equalWorkRows writes one row per scheduler of each group: pods/s, its
// ratio to the default profile's of the same seed, CPU, attempts, racks.
func equalWorkRows(b *strings.Builder, groups []*group) {
	for _, g := range groups {
		for _, s := range g.schedulers {
			if s == harnessOnly {
				continue
			}
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", g.scenario, g.nodes, s,
				g.over(s, podsPerSpan).Format("%.0f"),
				g.over(s, func(r seedRun) float64 { return ratioToDefault(r, podsPerSpan) }).Format("%.2f×"),
				g.over(s, cpuMsPerPod).Format("%.2f"),
				g.over(s, attemptsPerPod).Format("%.2f"),
				g.over(s, func(r seedRun) float64 { return r.m.MeanRacksPerGang }).Format("%.2f"))
		}
	}
}

// busyTable is equal work on a busy cluster: the same figures as the idle
// table, and what the background holds.
func busyTable(b *strings.Builder, groups []*group) {
	b.WriteString("\n### Equal work on a busy cluster\n\n")
	b.WriteString("Scenarios `bench/scenarios/equal-*-busy.yaml`: from t=0 background pods of priority 0 hold most of the GPUs (below, per scenario) and never finish; " +
		"the jobs' workers take a whole node's GPUs each and have required pod anti-affinity (per scenario below), so NodeResourcesFit refuses every node the background holds GPUs on " +
		"and InterPodAffinity refuses free nodes that run a pod the workers avoid. Every gang still fits on arrival, in one rack too, so every scheduler binds every pod on its first attempt " +
		"(the attempts column checks it). Figures as in the table above.\n\n")
	for _, g := range groups {
		d := g.dets[0]
		fmt.Fprintf(b, "- %s: the background holds %d of %d GPUs (%.0f%%); %d nodes have every GPU free, %d of them run a pod the workers avoid; %d jobs, %d pods",
			g.scenario, d.BackgroundGPUs, g.reps[0].GPUs, 100*float64(d.BackgroundGPUs)/float64(g.reps[0].GPUs), d.FreeNodes, d.NoisyNodes, d.Jobs, d.Pods)
		if d.AntiAffinity != "" {
			fmt.Fprintf(b, "; workers avoid %s", d.AntiAffinity)
		}
		fmt.Fprintf(b, " (seed %d).\n", g.reps[0].Seed)
	}
	b.WriteString("\n| scenario | nodes | scheduler | pods/s | × default | CPU ms/pod | attempts/pod | racks/gang |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|\n")
	equalWorkRows(b, groups)
}

func idleTable(b *strings.Builder, groups []*group) {
	b.WriteString("### Equal work: throughput where every pod fits\n\n")
	b.WriteString("Contention-free scenarios (`bench/scenarios/equal-*.yaml`): gangs of 1-GPU workers, at most a third of the GPUs asked for at any time, so every scheduler binds every pod on its first attempt (the attempts column checks it). " +
		"*pods/s* = pods ÷ (first pod released → last binding), real time. No figure here subtracts the harness's cost: the `none` run (below) binds every pod itself as it creates it, so it does less harness work than a scheduler's run, and a constant taken off both sides would only raise every ratio. " +
		"*CPU ms/pod* is the child process's CPU time (user + system, scheduler and harness) over the step loop ÷ pods. Each seed runs the schedulers in a rotated order, so each runs first once per " +
		"as many seeds as there are schedulers.\n\n")
	b.WriteString("| scenario | nodes | scheduler | pods/s | × default | CPU ms/pod | attempts/pod | racks/gang |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|\n")
	equalWorkRows(b, groups)
}

// The throughput targets: muster ÷ default pods/s on equal work.
var throughputTargets = []struct {
	workers, nodes int
	want           float64
}{
	{8, 5000, 2}, {2, 5000, 1.5}, {8, 15000, 1.5}, {2, 15000, 1.5}, {64, 15000, 1.5},
}

func targets(b *strings.Builder, groups []*group) {
	var lines []string
	for _, t := range throughputTargets {
		for _, g := range groups {
			if g.nodes != t.nodes || !strings.Contains(g.scenario, fmt.Sprintf("-g%d-", t.workers)) {
				continue
			}
			ratio := g.over("muster", func(r seedRun) float64 { return ratioToDefault(r, podsPerSpan) })
			if ratio.N == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("- %s (%d-worker gangs, %d nodes), target ≥ %.1f×: muster ÷ default pods/s %s, %s.",
				g.scenario, t.workers, t.nodes, t.want, ratio.Format("%.2f×"), verdict(ratio, t.want)))
		}
	}
	if len(lines) > 0 {
		b.WriteString("\nTargets of issue 15 (muster ÷ default profile, pods/s, same seed):\n\n" + strings.Join(lines, "\n") + "\n")
	}
}

func verdict(ratio Spread, want float64) string {
	switch {
	case ratio.N == 0:
		return "not measured"
	case ratio.Median < want:
		return "**not met**"
	case ratio.Min < want:
		return "met by the median, not in every run"
	}
	return "met in every run"
}

func contendedTables(b *strings.Builder, groups []*group) {
	b.WriteString("\n### Contended scenarios: outcomes\n\n")
	b.WriteString("*alloc* and *goodput* are over the common window (first submission → last arrival; for a single burst, → the earliest end among the schedulers), the same for every scheduler of a seed; goodput leaves out gang runs cut short by a reclaim or a preemption. " +
		"*wait* is submission → first placement (virtual). *partial*: gangs ever partly bound; *deadlocked*: partly bound at the end; *stuck*: not done and nothing bound at the end.\n\n")
	b.WriteString("| scenario | seeds | scheduler | done / total | partial | deadlocked | stuck | alloc (common) | goodput (common) | lost GPU-h | wait p50 / p95 (s) | mean JCT (s) | racks/gang | mixed spot gangs |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, g := range groups {
		for _, s := range g.schedulers {
			metric := func(f func(measure.Metrics) float64) Spread {
				return g.over(s, func(r seedRun) float64 { return f(r.m) })
			}
			total := metric(func(m measure.Metrics) float64 { return float64(m.GangsTotal) })
			fmt.Fprintf(b, "| %s | %s | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s / %s | %s | %s | %s |\n", g.scenario, seedList(g.seeds()), s,
				metric(func(m measure.Metrics) float64 { return float64(m.GangsCompleted) }).Format("%.0f"), total.Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return float64(m.PartialGangs) }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return float64(m.DeadlockedGangs) }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return float64(m.StuckGangs) }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return m.CommonAllocationRatio }).Format("%.3f"),
				metric(func(m measure.Metrics) float64 { return m.GoodputRatio }).Format("%.3f"),
				metric(func(m measure.Metrics) float64 { return m.LostGPUHours }).Format("%.1f"),
				metric(func(m measure.Metrics) float64 { return m.QueueWaitP50S }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return m.QueueWaitP95S }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return m.MeanJCTS }).Format("%.0f"),
				metric(func(m measure.Metrics) float64 { return m.MeanRacksPerGang }).Format("%.2f"),
				metric(func(m measure.Metrics) float64 { return float64(m.PreemptibleGangsMixed) }).Format("%.0f"))
		}
	}
	b.WriteString("\n### Contended scenarios: scheduling cost\n\n")
	b.WriteString("Attempts per bound pod by result (kube-scheduler's `scheduler_schedule_attempts_total`; a restarted gang's pods are bound again and count again) and the scheduler's busy real time per attempt " +
		"(busy: applying a step's changes plus resume → idle). No ratio to the default profile: under contention the schedulers do different work.\n\n")
	b.WriteString("| scenario | scheduler | attempts/pod: scheduled | unschedulable | error | ms per attempt | busy s | native pod-group attempts: scheduled / unschedulable |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, g := range groups {
		for _, s := range g.schedulers {
			attempts := func(f func(Attempts) float64) Spread {
				return g.over(s, func(r seedRun) float64 { return f(AttemptsPerPod(r.d)) })
			}
			podGroups := "–"
			if rs := g.runs(s); len(rs) > 0 {
				if _, ok := rs[0].d.Extra["podgroup_attempts_scheduled"]; ok {
					podGroups = g.over(s, func(r seedRun) float64 { return r.d.Extra["podgroup_attempts_scheduled"] }).Format("%.0f") + " / " +
						g.over(s, func(r seedRun) float64 { return r.d.Extra["podgroup_attempts_unschedulable"] }).Format("%.0f")
				}
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", g.scenario, s,
				attempts(func(a Attempts) float64 { return a.Scheduled }).Format("%.2f"),
				attempts(func(a Attempts) float64 { return a.Unschedulable }).Format("%.2f"),
				attempts(func(a Attempts) float64 { return a.Error }).Format("%.2f"),
				g.over(s, func(r seedRun) float64 { return MsPerAttempt(r.d) }).Format("%.2f"),
				g.over(s, func(r seedRun) float64 { return r.d.BusySeconds }).Format("%.1f"),
				podGroups)
		}
	}
}

// refusedPlansTable adds, for every scenario muster ran, the plans a
// member's own cycle refused per 100 plans (PlansRefusedPer100).
func refusedPlansTable(b *strings.Builder, groups []*group) {
	started := false
	for _, g := range groups {
		for _, s := range g.schedulers {
			rs := g.runs(s)
			if len(rs) == 0 {
				continue
			}
			if _, ok := PlansRefusedPer100(rs[0].d); !ok {
				continue
			}
			if !started {
				b.WriteString("\n### Plans a member's own cycle refused\n\n")
				b.WriteString("muster's plans that a member's own scheduling cycle refused (`muster_gang_rejections_total` causes plan_broken and rejected) per 100 plans installed (`muster_gang_plans_total`). " +
					"The plan's dry run screens hostname anti-affinity and DRA devices with muster's own model; each refusal is one the model or a race got wrong. Target: at most 1.\n\n")
				b.WriteString("| scenario | scheduler | refused per 100 plans | plans |\n|---|---|--:|--:|\n")
				started = true
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", g.scenario, s,
				g.over(s, func(r seedRun) float64 { v, _ := PlansRefusedPer100(r.d); return v }).Format("%.2f"),
				g.over(s, func(r seedRun) float64 { return r.d.Extra["muster_plans_installed"] }).Format("%.0f"))
		}
	}
}

// preemptionTable adds a table for the scenarios with priorities.
func preemptionTable(b *strings.Builder, groups []*group) {
	started := false
	for _, g := range groups {
		for _, s := range g.schedulers {
			runs := g.runs(s)
			if len(runs) == 0 || runs[0].d.Preemption == nil {
				continue
			}
			if !started {
				b.WriteString("\nPriorities and preemption (definitions: measure.Preemption; the lower bound counts GPUs a higher-priority job needed beyond those free when it arrived, in that run; *non-GPU pods evicted* are pods that asked for no GPU deleted without any GPU member of their gang, target 0):\n\n")
				b.WriteString("| scenario | scheduler | higher-priority jobs not placed | their wait p50 / p99 (virtual s) | GPUs evicted | lower bound | victim gangs | left partly running | non-GPU pods evicted |\n")
				b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
				started = true
			}
			p := func(f func(measure.Preemption) float64) string {
				return g.over(s, func(r seedRun) float64 {
					if r.d.Preemption == nil {
						return math.NaN()
					}
					return f(*r.d.Preemption)
				}).Format("%.0f")
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s / %s | %s | %s | %s | %s | %s |\n", g.scenario, s,
				p(func(x measure.Preemption) float64 { return float64(x.HighNotPlaced) }),
				p(func(x measure.Preemption) float64 { return x.HighWaitP50S }),
				p(func(x measure.Preemption) float64 { return x.HighWaitP99S }),
				p(func(x measure.Preemption) float64 { return float64(x.GPUsEvicted) }),
				p(func(x measure.Preemption) float64 { return float64(x.GPUsNeededLowerBound) }),
				p(func(x measure.Preemption) float64 { return float64(x.VictimGangs) }),
				p(func(x measure.Preemption) float64 { return float64(x.VictimGangsPartial) }),
				p(func(x measure.Preemption) float64 { return float64(x.NonGPUPodsEvicted) }))
		}
	}
}

// slower lists, from the tables above, every figure in which another
// scheduler's median beats muster's.
func slower(b *strings.Builder, equal, contended []*group) {
	var lines []string
	for _, g := range equal {
		mine := g.over("muster", podsPerSpan)
		for _, s := range g.schedulers {
			if s == "muster" || s == harnessOnly {
				continue
			}
			if other := g.over(s, podsPerSpan); other.N > 0 && mine.N > 0 && other.Median > mine.Median {
				lines = append(lines, fmt.Sprintf("- %s: %s binds %.0f pods/s, muster %.0f.", g.scenario, s, other.Median, mine.Median))
			}
		}
	}
	type figure struct {
		name   string
		verb   string
		higher bool // higher is better
		f      func(seedRun) float64
	}
	figures := []figure{
		{"GPU allocation (common window)", "%.3f", true, func(r seedRun) float64 { return r.m.CommonAllocationRatio }},
		{"goodput (common window)", "%.3f", true, func(r seedRun) float64 { return r.m.GoodputRatio }},
		{"queue wait p50 (s)", "%.0f", false, func(r seedRun) float64 { return r.m.QueueWaitP50S }},
		{"queue wait p95 (s)", "%.0f", false, func(r seedRun) float64 { return r.m.QueueWaitP95S }},
		{"mean JCT (s)", "%.0f", false, func(r seedRun) float64 {
			if r.m.GangsCompleted < r.m.GangsTotal {
				return math.NaN() // a mean over fewer jobs is not comparable
			}
			return r.m.MeanJCTS
		}},
		{"ms per scheduling attempt", "%.2f", false, func(r seedRun) float64 { return MsPerAttempt(r.d) }},
	}
	for _, g := range contended {
		for _, fig := range figures {
			mine := g.over("muster", fig.f)
			for _, s := range g.schedulers {
				if s == "muster" {
					continue
				}
				other := g.over(s, fig.f)
				if other.N == 0 || mine.N == 0 {
					continue
				}
				if mv, ov := fmt.Sprintf(fig.verb, mine.Median), fmt.Sprintf(fig.verb, other.Median); mv == ov {
					continue
				}
				if (fig.higher && other.Median > mine.Median) || (!fig.higher && other.Median < mine.Median) {
					lines = append(lines, fmt.Sprintf("- %s, %s: %s %s, muster %s.", g.scenario, fig.name, s,
						fmt.Sprintf(fig.verb, other.Median), fmt.Sprintf(fig.verb, mine.Median)))
				}
			}
		}
	}
	b.WriteString("\n### Where muster is slower or worse\n\nEvery median above in which another scheduler beats muster (generated from the tables):\n\n")
	if len(lines) == 0 {
		b.WriteString("- none.\n")
		return
	}
	b.WriteString(strings.Join(lines, "\n") + "\n")
}

func batching(b *strings.Builder, groups []*group) {
	var lines []string
	for _, g := range groups {
		if d, ok := g.dets[0].Schedulers["default"]; ok {
			lines = append(lines, fmt.Sprintf("- %s (seed %d): %s", g.scenario, g.reps[0].Seed, Batching(d)))
		}
	}
	if len(lines) > 0 {
		b.WriteString("\nOpportunistic batching in the default profile:\n\n" + strings.Join(lines, "\n") + "\n")
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
