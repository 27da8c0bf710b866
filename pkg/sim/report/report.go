// Package report turns the runs of one scenario (one per scheduler, same
// seed) into the files a person and a script read: report.json (the metrics,
// exactly the benchmark's fields), details.json (everything else: machine,
// command, per-scheduler facts), report.md (tables) and allocation.svg (GPU
// allocation over virtual time). It also renders the standard set's summary
// for BENCHMARKS.md.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"k8s.io/component-base/version"

	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// File names in a run's output directory.
const (
	JSONFile     = "report.json"
	DetailsFile  = "details.json"
	MarkdownFile = "report.md"
	PlotFile     = "allocation.svg"
)

// Report is report.json.
type Report struct {
	Scenario string `json:"scenario"`
	Seed     uint64 `json:"seed"`
	Nodes    int    `json:"nodes"`
	GPUs     int64  `json:"gpus"`
	// CommonWindowS is the virtual window, in seconds, over which every
	// scheduler's gpu_allocation_common_window and goodput_common_window
	// are measured (CommonWindow).
	CommonWindowS [2]float64        `json:"common_window_s"`
	Results       []measure.Metrics `json:"results"`
}

// CommonWindow is the window of virtual time every scheduler of a run is
// measured over: from the first submission to the last arrival; when every
// job arrives at once, to the earliest end among the runs (when the fastest
// scheduler had finished everything). It depends on the plan and, for a
// single burst, on the fastest run, never on the run being measured.
func CommonWindow(plan *scenario.Plan, runs []*measure.Run) (from, to float64) {
	if len(plan.Jobs) == 0 {
		return 0, 0
	}
	from, to = plan.Jobs[0].Submit.Seconds(), plan.Jobs[0].Submit.Seconds()
	for _, j := range plan.Jobs {
		from, to = min(from, j.Submit.Seconds()), max(to, j.Submit.Seconds())
	}
	if to > from {
		return from, to
	}
	to = -1
	for _, r := range runs {
		if to < 0 || r.EndS < to {
			to = r.EndS
		}
	}
	return from, max(to, from)
}

// Details is details.json: what report.json leaves out.
type Details struct {
	Scenario    string  `json:"scenario"`
	Description string  `json:"description"`
	Seed        uint64  `json:"seed"`
	Command     string  `json:"command"`
	Machine     Machine `json:"machine"`
	// Measured is the UTC day the run was written, and Commit the muster
	// commit the simulator was built from ("+dirty" with uncommitted
	// changes; empty when the build recorded none): a summary that merges
	// runs of several days says which figures come from which.
	Measured  string `json:"measured,omitempty"`
	Commit    string `json:"commit,omitempty"`
	Jobs      int    `json:"jobs"`
	Pods      int    `json:"pods"`
	Racks     int    `json:"racks"`
	Zones     int    `json:"zones"`
	SpotNodes int    `json:"spot_nodes"`
	// DRANodes are the nodes whose GPUs DRA serves (scenario.DRA).
	DRANodes int `json:"dra_nodes,omitempty"`
	// The realistic background (scenario.Background), zero without one:
	// nodes with fewer GPUs and how many they have, jobs with a CPU-only
	// member, background pods, budgets and the pods they cover.
	GPUsPerNode    int64 `json:"gpus_per_node,omitempty"`
	SmallNodes     int   `json:"small_nodes,omitempty"`
	SmallNodeGPUs  int64 `json:"small_node_gpus,omitempty"`
	CPUMemberJobs  int   `json:"cpu_member_jobs,omitempty"`
	BackgroundPods int   `json:"background_pods,omitempty"`
	PDBs           int   `json:"pdbs,omitempty"`
	PDBPods        int   `json:"pdb_pods,omitempty"`
	// A busy cluster (background.gpuPods, background.noisyPods,
	// workload.antiAffinity): the GPUs background pods hold from the
	// start, the nodes with every GPU free then, how many of those run a
	// noisy pod, and the workers' anti-affinity ("" for none).
	BackgroundGPUs int64                      `json:"background_gpus,omitempty"`
	FreeNodes      int                        `json:"free_nodes,omitempty"`
	NoisyNodes     int                        `json:"noisy_nodes,omitempty"`
	AntiAffinity   string                     `json:"anti_affinity,omitempty"`
	Schedulers     map[string]measure.Details `json:"schedulers"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model,omitempty"`
	MemoryGiB  int    `json:"memory_gib,omitempty"`
	Go         string `json:"go"`
	OS         string `json:"os"`
	Kubernetes string `json:"kubernetes"`
}

// ThisMachine reads what it can about the current machine.
func ThisMachine(kubernetes string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, Kubernetes: kubernetes}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kib int
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kib); err == nil {
			m.MemoryGiB = (kib + 512*1024) / (1024 * 1024)
		}
	}
	return m
}

// BuildCommit is the commit this binary was built from (short), with
// "+dirty" when the tree had uncommitted changes: the VCS stamp Go records,
// or else the commit the build set in component-base's version
// (hack/bench.sh and make build do, for machines that build with
// -buildvcs=false); "" when neither says (go run, go test).
func BuildCommit() string {
	var revision, modified string
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	if revision == "" {
		if c := version.Get().GitCommit; c != "" && !strings.HasPrefix(c, "$Format") && c != "unknown" {
			revision = c
		}
	}
	if rev, dirty := strings.CutSuffix(revision, "+dirty"); dirty {
		revision, modified = rev, "true"
	}
	if len(revision) > 7 {
		revision = revision[:7]
	}
	if revision != "" && modified == "true" {
		revision += "+dirty"
	}
	return revision
}

// Write writes the four files for runs (in the order given) into dir.
func Write(dir string, plan *scenario.Plan, runs []*measure.Run, command string, machine Machine) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rep := Report{Scenario: plan.Scenario.Name, Seed: plan.Seed, Nodes: len(plan.Nodes), GPUs: plan.TotalGPUs()}
	det := Details{
		Scenario: plan.Scenario.Name, Description: strings.TrimSpace(plan.Scenario.Description), Seed: plan.Seed,
		Command: command, Machine: machine, Jobs: len(plan.Jobs), Pods: plan.TotalPods(),
		Measured: time.Now().UTC().Format(time.DateOnly), Commit: BuildCommit(),
		Schedulers: map[string]measure.Details{},
	}
	racks, zones := map[string]bool{}, map[string]bool{}
	for _, n := range plan.Nodes {
		racks[n.Rack], zones[n.Zone] = true, true
		if n.Spot {
			det.SpotNodes++
		}
	}
	det.Racks, det.Zones = len(racks), len(zones)
	det.GPUsPerNode = plan.Scenario.Cluster.GPUsPerNode
	det.DRANodes = plan.DRANodes()
	if det.SmallNodes = plan.SmallNodes(); det.SmallNodes > 0 {
		det.SmallNodeGPUs = plan.Scenario.Background.SmallNodes.GPUs
	}
	det.CPUMemberJobs = plan.CPUMemberJobs()
	det.BackgroundPods, det.PDBs = len(plan.Background), len(plan.PDBs)
	for _, pdb := range plan.PDBs {
		det.PDBPods += pdb.Pods
	}
	if det.BackgroundGPUs = plan.BackgroundGPUs(); det.BackgroundGPUs > 0 || plan.Scenario.Background != nil && plan.Scenario.Background.NoisyPods != nil {
		det.FreeNodes, det.NoisyNodes = plan.FreeNodes()
	}
	if a := plan.Scenario.Workload.AntiAffinity; a != nil {
		var against []string
		if a.OtherGangs {
			against = append(against, "other jobs' pods")
		}
		if a.NoisyPods {
			against = append(against, "noisy pods")
		}
		det.AntiAffinity = strings.Join(against, " and ")
	}
	from, to := CommonWindow(plan, runs)
	rep.CommonWindowS = [2]float64{from, to}
	for _, r := range runs {
		r.Metrics.CommonAllocationRatio, r.Metrics.GoodputRatio = measure.WindowRatios(r.Series, r.Segments, from, to)
		rep.Results = append(rep.Results, r.Metrics)
		det.Schedulers[r.Metrics.Scheduler] = r.Details
	}
	if err := writeJSON(filepath.Join(dir, JSONFile), rep); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, DetailsFile), det); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, MarkdownFile), []byte(Markdown(rep, det)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, PlotFile), []byte(SVG(rep, runs)), 0o644)
}

// Read loads report.json and details.json from dir.
func Read(dir string) (*Report, *Details, error) {
	var rep Report
	var det Details
	if err := readJSON(filepath.Join(dir, JSONFile), &rep); err != nil {
		return nil, nil, err
	}
	if err := readJSON(filepath.Join(dir, DetailsFile), &det); err != nil {
		return nil, nil, err
	}
	return &rep, &det, nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// WriteRun and ReadRun move one scheduler's run between the child process
// and the parent.
func WriteRun(path string, run *measure.Run) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeJSON(path, run)
}

// ReadRun reads what WriteRun wrote.
func ReadRun(path string) (*measure.Run, error) {
	var run measure.Run
	if err := readJSON(path, &run); err != nil {
		return nil, err
	}
	return &run, nil
}
