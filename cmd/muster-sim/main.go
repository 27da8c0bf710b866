// Command muster-sim runs muster's demo on an in-process control plane, and
// the simulated-cluster benchmarks: the real scheduler (muster, the default
// profile, native gang scheduling) against a simulated cluster, side by side
// on one seed.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/demo"
	"github.com/muster-sched/muster/pkg/sim"
	"github.com/muster-sched/muster/pkg/sim/report"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

const usage = `usage:
  muster-sim demo [--logs]
      the main job on an in-process control plane
  muster-sim [run] --scenario NAME|FILE [--schedulers muster,default,...] [--seed 1] [--rotate] [--out DIR]
      simulated-cluster benchmark; writes DIR/report.json, report.md, allocation.svg
  muster-sim summarize --update BENCHMARKS.md [--profile top.txt] DIR...
      renders results (one scenario and seed per DIR; seeds of a scenario aggregated) into BENCHMARKS.md
  muster-sim soak [--scenario large] [--runs 2]
      runs muster through a scenario repeatedly in one process; goroutines and heap after each run
`

func main() {
	args := os.Args[1:]
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch cmd {
	case "demo":
		err = runDemo(ctx, args)
	case "run":
		err = runSim(ctx, args)
	case "summarize":
		err = summarize(args)
	case "soak":
		err = soak(ctx, args)
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "muster-sim %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	logs := fs.Bool("logs", false, "show control plane and scheduler logs on stderr instead of in out/demo.log")
	_ = fs.Parse(args)
	var logOut io.Writer = os.Stderr
	if !*logs {
		if err := os.MkdirAll("out", 0o755); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join("out", "demo.log"))
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		logOut = f
		fmt.Printf("control plane and scheduler logs: %s\n", f.Name())
	}
	if err := demo.Run(ctx, demo.Options{Out: os.Stdout, Logs: logOut}); err != nil {
		return fmt.Errorf("demo failed: %w", err)
	}

	// Part two: the simulator's small scenario, muster beside kube-scheduler's
	// default profile and native gang scheduling. (The simulator is the one
	// place that plays scenarios and decides what a partial gang is.)
	out := filepath.Join("out", "demo-small")
	fmt.Printf("\nscenario small in the simulator (16 nodes × 8 GPUs, 7 gangs in two waves): muster, default, native-gang (seed 1)...\n")
	if err := runSim(ctx, []string{"--scenario", "small", "--schedulers", "muster,default,native-gang", "--seed", "1",
		"--out", out, "--progress", "never"}); err != nil {
		return err
	}
	rep, _, err := report.Read(out)
	if err != nil {
		return err
	}
	if err := printResults(rep); err != nil {
		return err
	}
	fmt.Printf("plot of GPU allocation over time: %s\nfull report: %s\n", filepath.Join(out, report.PlotFile), filepath.Join(out, report.MarkdownFile))
	return nil
}

func printResults(rep *report.Report) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SCHEDULER\tGANGS DONE\tPARTIAL\tDEADLOCKED\tGPU ALLOC\tMAKESPAN (s)\tRACKS/GANG")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s\t%d/%d\t%d\t%d\t%.3f\t%.0f\t%.2f\n", r.Scheduler, r.GangsCompleted, r.GangsTotal, r.PartialGangs,
			r.DeadlockedGangs, r.GPUAllocationRatio, r.MakespanS, r.MeanRacksPerGang)
	}
	return w.Flush()
}

func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	scenarioArg := fs.String("scenario", "", "scenario name (a file in --scenarios-dir) or path to a scenario file")
	scenariosDir := fs.String("scenarios-dir", "", "directory of scenario files (default: bench/scenarios of the enclosing module)")
	schedulers := fs.String("schedulers", strings.Join(sim.StandardSchedulers, ","), "schedulers to compare, in report order (known: "+strings.Join(sim.Schedulers, ", ")+")")
	rotate := fs.Bool("rotate", false, "run the schedulers in an order rotated by the seed (seed 1 as listed, seed 2 from the second, ...), so that over several seeds each runs first")
	seed := fs.Uint64("seed", 1, "seed of every random choice (cluster, jobs, pod order, reclaims)")
	out := fs.String("out", "", "output directory (default bench/results/<scenario>)")
	quiet := fs.Duration("settle-quiet", time.Millisecond, "how long the scheduler must stay idle before a step counts as settled")
	stepTimeout := fs.Duration("step-timeout", 3*time.Minute, "real-time limit of one step")
	verbosity := fs.Int("v", 0, "scheduler log verbosity (logs go to <out>/runs/<scheduler>.log)")
	child := fs.Bool(sim.ChildFlag, false, "internal: run one scheduler in this process")
	scheduler := fs.String("scheduler", "", "internal: the scheduler a child runs")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (on a terminal: redrawn; else a line per 10%), never")
	cpuProfile := fs.Bool("cpuprofile", false, "write a CPU profile of each scheduler's process to <out>/runs/<scheduler>.pprof; in a soak, one per sample period, <scheduler>.cpu-<hours>h.pprof")
	featureGates := fs.String("feature-gates", "", "kube-scheduler feature gates for every scheduler alike (key=true|false,...), set in each scheduler's process over its own (muster's, GenericWorkload for native gangs)")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *scenarioArg == "" {
		fs.Usage()
		return fmt.Errorf("--scenario is required")
	}
	path, err := sim.ResolveScenario(*scenarioArg, *scenariosDir)
	if err != nil {
		return err
	}
	if *out == "" {
		*out = filepath.Join("bench", "results", strings.TrimSuffix(filepath.Base(path), ".yaml"))
	}

	if *child {
		return runOneScheduler(ctx, sim.ChildConfig{ScenarioPath: path, Scheduler: *scheduler, Seed: *seed, Out: *out,
			SettleQuiet: *quiet, StepTimeout: *stepTimeout, CPUProfile: *cpuProfile}, *featureGates, *verbosity, *progress)
	}

	names, err := sim.ParseSchedulers(*schedulers)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var order []string
	if *rotate {
		order = sim.RotatedOrder(names, *seed)
	}
	start := time.Now()
	err = sim.RunAll(ctx, sim.Invocation{
		Exe: exe, ScenarioPath: path, Schedulers: names, RunOrder: order, Seed: *seed, Out: *out,
		SettleQuiet: *quiet, StepTimeout: *stepTimeout, Stderr: os.Stderr,
		ExtraArgs: []string{fmt.Sprintf("--v=%d", *verbosity), "--progress=" + *progress, fmt.Sprintf("--cpuprofile=%t", *cpuProfile),
			"--feature-gates=" + *featureGates},
		// The command as run, every flag included (--rotate changes the
		// order the schedulers run in, so a reproduction needs it).
		Command:    "muster-sim " + strings.Join(os.Args[1:], " "),
		Kubernetes: kubernetesVersion(),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s, %s and %s in %s (%s)\n", filepath.Join(*out, report.JSONFile), report.MarkdownFile, report.PlotFile,
		*out, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// runOneScheduler runs the scheduler of cfg in this process: the child
// process a run starts for each scheduler.
func runOneScheduler(ctx context.Context, cfg sim.ChildConfig, featureGates string, verbosity int, progress string) error {
	if featureGates != "" {
		// Checked here, set after the scheduler's own defaults.
		if err := utilfeature.DefaultMutableFeatureGate.DeepCopy().Set(featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
		sim.FeatureGates = featureGates
	}
	logFile, err := childLogs(cfg.Out, cfg.Scheduler, verbosity)
	if err != nil {
		return err
	}
	defer logFile.Close()
	if progress != "never" {
		cfg.Progress = sim.NewProgress(os.Stderr, cfg.Scheduler, sim.IsTerminal(os.Stderr))
	}
	return sim.RunChild(ctx, cfg)
}

// childLogs sends klog (the scheduler's logs) to <out>/runs/<scheduler>.log.
func childLogs(out, scheduler string, verbosity int) (*os.File, error) {
	path := sim.LogPath(out, scheduler)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	_ = kfs.Set("v", fmt.Sprint(verbosity))
	_ = kfs.Set("logtostderr", "false")
	_ = kfs.Set("alsologtostderr", "false")
	_ = kfs.Set("stderrthreshold", "FATAL")
	// One output for every severity: without one_output klog writes an
	// error to the INFO, WARNING and ERROR outputs, here one file, thrice.
	_ = kfs.Set("one_output", "true")
	klog.SetOutput(f)
	return f, nil
}

func summarize(args []string) error {
	fs := flag.NewFlagSet("summarize", flag.ExitOnError)
	update := fs.String("update", "BENCHMARKS.md", "file whose generated section is replaced")
	elapsed := fs.String("elapsed", "", "how long the whole set took (shown in the summary)")
	command := fs.String("command", "make bench", "command shown as the way to reproduce")
	profile := fs.String("profile", "", "file with `go tool pprof -top` output of a muster run, shown in the summary")
	profileCommand := fs.String("profile-command", "", "how the profile was made")
	apiServer := fs.String("apiserver", "", "bench/results/apiserver.txt (make bench-api) to show in the summary")
	planner := fs.String("planner", "", "bench/results/planner.txt (the planner benchmarks' go test -bench output) to show in the summary")
	date := fs.String("date", time.Now().UTC().Format("2006-01-02"), "the day the results were measured (a summary regenerated later keeps it)")
	_ = fs.Parse(args)
	if fs.NArg() == 0 {
		return fmt.Errorf("name at least one results directory")
	}
	o := report.SummaryOptions{Command: *command, Elapsed: *elapsed, Date: *date, ProfileCommand: *profileCommand}
	// Files shown in the summary, each when named.
	for _, f := range []struct {
		path string
		into *string
	}{{*profile, &o.Profile}, {*apiServer, &o.APIServer}, {*planner, &o.Planner}} {
		if f.path == "" {
			continue
		}
		data, err := os.ReadFile(f.path)
		if err != nil {
			return err
		}
		*f.into = string(data)
	}
	section, err := report.Summary(fs.Args(), o)
	if err != nil {
		return err
	}
	return report.UpdateFile(*update, section)
}

func kubernetesVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// soak runs muster through a scenario several times in this process and
// reports goroutines and heap after each run: a leak shows as growth.
func soak(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	scenarioArg := fs.String("scenario", "large", "scenario name or path")
	runs := fs.Int("runs", 2, "how many runs")
	seed := fs.Uint64("seed", 1, "seed")
	_ = fs.Parse(args)
	path, err := sim.ResolveScenario(*scenarioArg, "")
	if err != nil {
		return err
	}
	sc, err := scenario.Load(path)
	if err != nil {
		return err
	}
	plan, err := sc.Expand(*seed)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "RUN\tWALL\tGANGS DONE\tPARTIAL\tGOROUTINES AFTER\tHEAP IN USE AFTER (MiB)")
	for i := 1; i <= *runs; i++ {
		start := time.Now()
		r, err := sim.Run(ctx, sim.Options{Plan: plan, Scheduler: sim.Muster})
		if err != nil {
			return err
		}
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Fprintf(w, "%d\t%s\t%d/%d\t%d\t%d\t%.1f\n", i, time.Since(start).Round(100*time.Millisecond),
			r.Metrics.GangsCompleted, r.Metrics.GangsTotal, r.Metrics.PartialGangs, runtime.NumGoroutine(), float64(m.HeapInuse)/(1<<20))
	}
	return w.Flush()
}
