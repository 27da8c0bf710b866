package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/report"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// ChildFlag is the hidden flag with which cmd/muster-sim runs one scheduler
// in a child process.
const ChildFlag = "sim-child"

// ScenariosDir is where scenario files live, relative to the module root.
const ScenariosDir = "bench/scenarios"

// ResolveScenario finds a scenario file: nameOrPath itself if it is a file,
// else <dir>/<name>.yaml, where dir defaults to bench/scenarios of the module
// that contains the working directory.
func ResolveScenario(nameOrPath, dir string) (string, error) {
	if info, err := os.Stat(nameOrPath); err == nil && !info.IsDir() {
		return nameOrPath, nil
	}
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			return "", fmt.Errorf("scenario %q is not a file and %w; pass --scenarios-dir", nameOrPath, err)
		}
		dir = filepath.Join(root, ScenariosDir)
	}
	path := filepath.Join(dir, strings.TrimSuffix(nameOrPath, ".yaml")+".yaml")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("scenario %q: %w", nameOrPath, err)
	}
	return path, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// ChildConfig is what a child process needs to run one scheduler.
type ChildConfig struct {
	ScenarioPath string
	Scheduler    string
	Seed         uint64
	Out          string
	SettleQuiet  time.Duration
	StepTimeout  time.Duration
	Progress     *Progress
	// CPUProfile writes the process's CPU profile to
	// runs/<scheduler>.pprof, or in a soak one per sample period
	// (Options.CPUProfiles).
	CPUProfile bool
}

// Args renders the child's command line (after the executable).
func (c ChildConfig) Args() []string {
	return []string{"--" + ChildFlag, "--scenario", c.ScenarioPath, "--scheduler", c.Scheduler,
		"--seed", strconv.FormatUint(c.Seed, 10), "--out", c.Out,
		"--settle-quiet", c.SettleQuiet.String(), "--step-timeout", c.StepTimeout.String()}
}

// RunPath is where a child leaves its run for the parent.
func RunPath(out, scheduler string) string {
	return filepath.Join(out, "runs", scheduler+".json")
}

// LogPath is where a child's scheduler logs go.
func LogPath(out, scheduler string) string {
	return filepath.Join(out, "runs", scheduler+".log")
}

// loadPlan loads the scenario at path and expands it for seed.
func loadPlan(path string, seed uint64) (*scenario.Plan, error) {
	sc, err := scenario.Load(path)
	if err != nil {
		return nil, err
	}
	return sc.Expand(seed)
}

// RunChild is the child process's work: run one scheduler, write its run.
func RunChild(ctx context.Context, c ChildConfig) error {
	plan, err := loadPlan(c.ScenarioPath, c.Seed)
	if err != nil {
		return err
	}
	opts := Options{Plan: plan, Scheduler: c.Scheduler, Progress: c.Progress, SettleQuiet: c.SettleQuiet, StepTimeout: c.StepTimeout,
		HeapProfiles: filepath.Join(c.Out, "runs")}
	switch {
	case c.CPUProfile && plan.Scenario.Soak != nil:
		opts.CPUProfiles = opts.HeapProfiles
	case c.CPUProfile:
		stop, err := startCPUProfile(filepath.Join(c.Out, "runs", c.Scheduler+".pprof"))
		if err != nil {
			return err
		}
		defer stop()
	}
	run, err := Run(ctx, opts)
	if err != nil {
		return err
	}
	return report.WriteRun(RunPath(c.Out, c.Scheduler), run)
}

// Invocation is one muster-sim run: a scenario, several schedulers, one seed.
type Invocation struct {
	// Exe is the muster-sim binary to re-execute for each scheduler.
	Exe          string
	ScenarioPath string
	// Schedulers in report order; RunOrder, when set, is the order in which
	// they run (the same names).
	Schedulers  []string
	RunOrder    []string
	Seed        uint64
	Out         string
	SettleQuiet time.Duration
	StepTimeout time.Duration
	// ExtraArgs are passed to every child (e.g. log verbosity).
	ExtraArgs []string
	// Stderr receives the children's progress bars and errors.
	Stderr io.Writer
	// Command is recorded in the report as the way to reproduce it.
	Command    string
	Kubernetes string
}

// RunAll runs each scheduler in its own child process, one after another
// (GenericWorkload is process-wide, and parallel runs would share the two
// cores and skew each other's timing), then writes the report.
func RunAll(ctx context.Context, inv Invocation) error {
	plan, err := loadPlan(inv.ScenarioPath, inv.Seed)
	if err != nil {
		return err
	}
	order := inv.RunOrder
	if len(order) == 0 {
		order = inv.Schedulers
	}
	byName := map[string]*measure.Run{}
	for i, name := range order {
		c := ChildConfig{ScenarioPath: inv.ScenarioPath, Scheduler: name, Seed: inv.Seed, Out: inv.Out,
			SettleQuiet: inv.SettleQuiet, StepTimeout: inv.StepTimeout}
		_ = os.Remove(RunPath(inv.Out, name))
		cmd := exec.CommandContext(ctx, inv.Exe, append(c.Args(), inv.ExtraArgs...)...)
		cmd.Stdout, cmd.Stderr = inv.Stderr, inv.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("scheduler %s on %s failed: %w (scheduler log: %s)", name, plan.Scenario.Name, err, LogPath(inv.Out, name))
		}
		run, err := report.ReadRun(RunPath(inv.Out, name))
		if err != nil {
			return err
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			run.Details.PeakRSSMiB = float64(ru.Maxrss) / 1024 // Linux reports KiB
		}
		run.Details.RunOrder = i + 1
		if err := report.WriteRun(RunPath(inv.Out, name), run); err != nil {
			return err
		}
		byName[name] = run
	}
	runs := make([]*measure.Run, 0, len(inv.Schedulers))
	for _, name := range inv.Schedulers {
		if byName[name] == nil {
			return fmt.Errorf("scheduler %s is not in the run order %v", name, order)
		}
		runs = append(runs, byName[name])
	}
	return report.Write(inv.Out, plan, runs, inv.Command, report.ThisMachine(inv.Kubernetes))
}

// RotatedOrder is names rotated by seed-1: over len(names) consecutive
// seeds each scheduler runs first once (machine state such as the page
// cache and CPU frequency then favours none of them).
func RotatedOrder(names []string, seed uint64) []string {
	if len(names) == 0 {
		return nil
	}
	k := int((seed + uint64(len(names)) - 1) % uint64(len(names)))
	return append(append([]string(nil), names[k:]...), names[:k]...)
}
