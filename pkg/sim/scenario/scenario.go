// Package scenario reads the simulator's scenario files (bench/scenarios/*.yaml)
// and expands one, with a seed, into the exact cluster, jobs and spot reclaims
// a run replays. Expansion is pure: the same file and seed always give the
// same Plan, whichever scheduler runs it.
//
// A scenario's optional top-level `background:` block (type Background)
// makes the cluster look like a real one rather than a clean one: CPU-only
// pods of priority 0 bound to every node from the start (DaemonSet agents
// and Deployment replicas), PodDisruptionBudgets over some of the
// Deployments, a share of nodes with fewer GPUs, and a share of gangs with a
// member that asks for no GPU (a TFJob's parameter server). Its random
// choices come from the scenario's seed like every other.
//
// `cluster.dra` (type DRA) serves the GPUs of some or all nodes by dynamic
// resource allocation, ResourceSlices and a DeviceClass that backs
// nvidia.com/gpu, instead of the nodes' allocatable.
//
// A busy cluster (busy.go): `background.gpuPods` holds most GPUs from the
// start, `background.noisyPods` puts CPU-heavy pods on some idle nodes, and
// `workload.antiAffinity` gives workers required pod anti-affinity against
// those pods and other jobs' pods.
package scenario

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Scenario is one scenario file.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Tick quantises virtual time: every event happens at a multiple of it,
	// so events close together are applied in one step (default 1s).
	Tick Duration `json:"tick,omitempty"`
	// Horizon ends the run even if jobs are still queued (default 48h).
	Horizon  Duration `json:"horizon,omitempty"`
	Cluster  Cluster  `json:"cluster"`
	Workload Workload `json:"workload"`
	Churn    *Churn   `json:"churn,omitempty"`
	// Background adds what a real cluster has beside the jobs (see
	// Background); absent, the cluster is clean.
	Background *Background `json:"background,omitempty"`
	// Soak samples what the scheduler keeps as the run goes (see Soak);
	// absent, nothing is sampled.
	Soak *Soak `json:"soak,omitempty"`
}

// Soak makes a run a test of a scheduler's life of months: every
// SampleEvery of virtual time the run records the live heap after a full
// garbage collection and, for muster, the size of every structure it keys
// by gang, pod, node, domain or slice (mustergang.Plugin.Sizes).
type Soak struct {
	SampleEvery Duration `json:"sampleEvery"`
	// RefuseJobPatches is the share of Jobs (seeded) whose patches the API
	// refuses for good (403, as an admission webhook denying updates
	// would): muster's failed-plan records for them can never be written.
	RefuseJobPatches float64 `json:"refuseJobPatches,omitempty"`
}

// Cluster is the shape of the simulated cluster.
type Cluster struct {
	Nodes        int   `json:"nodes"`
	GPUsPerNode  int64 `json:"gpusPerNode"`
	NodesPerRack int   `json:"nodesPerRack"`
	// Zones: racks are spread round-robin over this many zones (default 1).
	Zones int `json:"zones,omitempty"`
	// SpotFraction of the nodes (rounded down, spread evenly over racks) carry
	// the spot label cloud.google.com/gke-spot=true.
	SpotFraction float64 `json:"spotFraction,omitempty"`
	CPU          string  `json:"cpu,omitempty"`    // default "64"
	Memory       string  `json:"memory,omitempty"` // default "512Gi"
	// DRA serves the GPUs of some or all nodes by dynamic resource
	// allocation (ResourceSlices and a DeviceClass backing nvidia.com/gpu)
	// instead of allocatable (see DRA); absent, every node's GPUs are
	// device-plugin GPUs.
	DRA *DRA `json:"dra,omitempty"`
}

// Workload says which jobs are submitted when. Waves and Poisson may be
// combined; jobs are numbered in submission order.
type Workload struct {
	Waves   []Wave   `json:"waves,omitempty"`
	Poisson *Poisson `json:"poisson,omitempty"`
	// PodOrder is how the pods of jobs submitted in the same step are
	// created: "interleaved" (default: one seeded shuffle across all of
	// them, as several Job controllers racing would) or "grouped" (job by
	// job, in submission order).
	PodOrder string `json:"podOrder,omitempty"`
	// AntiAffinity gives every GPU worker required pod anti-affinity (see
	// AntiAffinity); absent, workers have none.
	AntiAffinity *AntiAffinity `json:"antiAffinity,omitempty"`
}

// Wave is a list of jobs submitted together.
type Wave struct {
	At       Duration `json:"at,omitempty"`
	Duration Duration `json:"duration"`
	// Gangs are shapes "WxG" (W workers of G GPUs), optionally repeated
	// "N*WxG". Jobs are submitted in this order (shuffled when Shuffle).
	Gangs   []string `json:"gangs"`
	Shuffle bool     `json:"shuffle,omitempty"`
	// Policy is the jobs' muster.dev/preemptible annotation ("" = avoid).
	Policy string `json:"policy,omitempty"`
	// Priority is the jobs' pod priority (and their PodGroups'), as a
	// PriorityClass would give it: a job may preempt jobs of strictly lower
	// priority. Default 0.
	Priority int32 `json:"priority,omitempty"`
}

// Poisson submits Jobs jobs with exponential inter-arrival times.
type Poisson struct {
	Jobs             int      `json:"jobs"`
	Start            Duration `json:"start,omitempty"`
	MeanInterarrival Duration `json:"meanInterarrival"`
	// Workers and GPUsPerWorker are weighted choices: value → weight.
	Workers       map[int]float64 `json:"workers"`
	GPUsPerWorker map[int]float64 `json:"gpusPerWorker"`
	Duration      LogNormal       `json:"duration"`
	// Policies is a weighted choice of the muster.dev/preemptible annotation
	// (empty: every job "avoid").
	Policies map[string]float64 `json:"policies,omitempty"`
	// Priorities is a weighted choice of the jobs' pod priority (empty:
	// every job 0); jobs of a higher priority preempt lower ones.
	Priorities map[int]float64 `json:"priorities,omitempty"`
}

// LogNormal is a log-normal distribution of durations, clamped to [Min, Max].
type LogNormal struct {
	Median Duration `json:"median"`
	Sigma  float64  `json:"sigma"`
	Min    Duration `json:"min,omitempty"`
	Max    Duration `json:"max,omitempty"`
}

// Churn reclaims spot nodes during the run: a reclaim notice (the taint
// cloud.google.com/impending-node-termination:NoSchedule), the node's deletion
// Notice later, and a replacement node ReplaceAfter the deletion.
type Churn struct {
	Start        Duration `json:"start,omitempty"`
	End          Duration `json:"end"`
	MeanInterval Duration `json:"meanInterval"`
	Notice       Duration `json:"notice"`
	ReplaceAfter Duration `json:"replaceAfter,omitempty"`
	// NodesPerEvent spot nodes of one zone are reclaimed together (default 1).
	NodesPerEvent int `json:"nodesPerEvent,omitempty"`
}

// Duration is a time.Duration written as "30s", "20m", "1h30m".
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a Go duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		d.Duration = v
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds: %s", b)
	}
	d.Duration = time.Duration(secs * float64(time.Second))
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// D is shorthand for building a Duration in code.
func D(d time.Duration) Duration { return Duration{d} }

// Load reads and validates a scenario file.
func Load(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse decodes and validates a scenario, rejecting unknown fields so a typo
// never silently changes a benchmark.
func Parse(data []byte) (*Scenario, error) {
	var s Scenario
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, err
	}
	s.defaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Scenario) defaults() {
	if s.Tick.Duration == 0 {
		s.Tick = D(time.Second)
	}
	if s.Horizon.Duration == 0 {
		s.Horizon = D(48 * time.Hour)
	}
	if s.Cluster.Zones == 0 {
		s.Cluster.Zones = 1
	}
	if s.Cluster.CPU == "" {
		s.Cluster.CPU = "64"
	}
	if s.Cluster.Memory == "" {
		s.Cluster.Memory = "512Gi"
	}
	if s.Workload.PodOrder == "" {
		s.Workload.PodOrder = "interleaved"
	}
	if s.Churn != nil && s.Churn.NodesPerEvent == 0 {
		s.Churn.NodesPerEvent = 1
	}
	if s.Background != nil {
		s.Background.defaults(s.Cluster)
	}
	if s.Cluster.DRA != nil {
		s.Cluster.DRA.defaults()
	}
}

// Validate reports the first thing that makes the scenario unusable.
func (s *Scenario) Validate() error {
	c := s.Cluster
	switch {
	case s.Name == "":
		return fmt.Errorf("name is required")
	case c.Nodes < 1:
		return fmt.Errorf("cluster.nodes must be at least 1")
	case c.GPUsPerNode < 1:
		return fmt.Errorf("cluster.gpusPerNode must be at least 1")
	case c.NodesPerRack < 1:
		return fmt.Errorf("cluster.nodesPerRack must be at least 1")
	case c.SpotFraction < 0 || c.SpotFraction > 1:
		return fmt.Errorf("cluster.spotFraction must be in [0, 1]")
	case s.Tick.Duration <= 0:
		return fmt.Errorf("tick must be positive")
	}
	if s.Workload.PodOrder != "interleaved" && s.Workload.PodOrder != "grouped" {
		return fmt.Errorf("workload.podOrder must be interleaved or grouped, got %q", s.Workload.PodOrder)
	}
	if len(s.Workload.Waves) == 0 && s.Workload.Poisson == nil {
		return fmt.Errorf("workload needs waves or poisson")
	}
	if err := s.Workload.validate(c); err != nil {
		return err
	}
	if so := s.Soak; so != nil {
		switch {
		case so.SampleEvery.Duration <= 0:
			return fmt.Errorf("soak.sampleEvery must be positive")
		case so.RefuseJobPatches < 0 || so.RefuseJobPatches > 1:
			return fmt.Errorf("soak.refuseJobPatches must be in [0, 1]")
		}
	}
	if ch := s.Churn; ch != nil {
		switch {
		case c.SpotFraction == 0:
			return fmt.Errorf("churn needs spot nodes (cluster.spotFraction > 0)")
		case ch.MeanInterval.Duration <= 0 || ch.End.Duration <= ch.Start.Duration:
			return fmt.Errorf("churn needs a positive meanInterval and end after start")
		case ch.Notice.Duration < 0 || ch.ReplaceAfter.Duration < 0:
			return fmt.Errorf("churn.notice and churn.replaceAfter must not be negative")
		}
	}
	if s.Background != nil {
		if err := s.Background.validate(c); err != nil {
			return err
		}
	}
	if c.DRA != nil {
		if err := c.DRA.validate(c); err != nil {
			return err
		}
	}
	if a := s.Workload.AntiAffinity; a != nil {
		if err := a.validate(s.Background); err != nil {
			return err
		}
	}
	return nil
}

// validate checks the workload's waves and Poisson arrivals against the
// cluster c.
func (wl Workload) validate(c Cluster) error {
	for i, w := range wl.Waves {
		if w.Duration.Duration <= 0 {
			return fmt.Errorf("workload.waves[%d].duration must be positive", i)
		}
		if err := validPolicy(w.Policy); err != nil {
			return fmt.Errorf("workload.waves[%d].policy: %w", i, err)
		}
		if w.Priority < 0 || w.Priority > maxUserPriority {
			return fmt.Errorf("workload.waves[%d].priority must be in [0, %d]", i, maxUserPriority)
		}
		for _, g := range w.Gangs {
			shape, err := ParseShape(g)
			if err != nil {
				return fmt.Errorf("workload.waves[%d]: %w", i, err)
			}
			if shape.GPUs > c.GPUsPerNode {
				return fmt.Errorf("workload.waves[%d]: %q asks for more GPUs per worker than a node has", i, g)
			}
		}
	}
	if p := wl.Poisson; p != nil {
		switch {
		case p.Jobs < 1:
			return fmt.Errorf("workload.poisson.jobs must be at least 1")
		case p.MeanInterarrival.Duration <= 0:
			return fmt.Errorf("workload.poisson.meanInterarrival must be positive")
		case p.Duration.Median.Duration <= 0 || p.Duration.Sigma < 0:
			return fmt.Errorf("workload.poisson.duration needs a positive median and a non-negative sigma")
		}
		if err := validWeights("workers", p.Workers); err != nil {
			return err
		}
		if err := validWeights("gpusPerWorker", p.GPUsPerWorker); err != nil {
			return err
		}
		for g := range p.GPUsPerWorker {
			if int64(g) > c.GPUsPerNode {
				return fmt.Errorf("workload.poisson.gpusPerWorker: %d is more than a node has", g)
			}
		}
		for pol, w := range p.Policies {
			if err := validPolicy(pol); err != nil || w < 0 {
				return fmt.Errorf("workload.poisson.policies: %q: invalid policy or negative weight", pol)
			}
		}
		for prio, w := range p.Priorities {
			if prio < 0 || prio > maxUserPriority || w < 0 {
				return fmt.Errorf("workload.poisson.priorities: %d: a priority must be in [0, %d], its weight not negative", prio, maxUserPriority)
			}
		}
	}
	return nil
}

// maxUserPriority is the highest value a user's PriorityClass may have.
const maxUserPriority = 1_000_000_000

func validWeights(name string, m map[int]float64) error {
	total := 0.0
	for v, w := range m {
		if v < 1 || w < 0 {
			return fmt.Errorf("workload.poisson.%s: values must be at least 1 and weights non-negative", name)
		}
		total += w
	}
	if total <= 0 {
		return fmt.Errorf("workload.poisson.%s needs a positive total weight", name)
	}
	return nil
}

func validPolicy(p string) error {
	switch p {
	case "", "forbid", "avoid", "prefer", "require":
		return nil
	}
	return fmt.Errorf("unknown preemptible policy %q", p)
}

// Shape is a gang shape: Workers workers of GPUs GPUs each.
type Shape struct {
	Count   int
	Workers int
	GPUs    int64
}

var shapePattern = regexp.MustCompile(`^(?:(\d+)\*)?(\d+)x(\d+)$`)

// ParseShape reads "WxG" or "N*WxG".
func ParseShape(s string) (Shape, error) {
	m := shapePattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Shape{}, fmt.Errorf("gang shape %q: want WORKERSxGPUS or COUNT*WORKERSxGPUS", s)
	}
	shape := Shape{Count: 1}
	if m[1] != "" {
		shape.Count, _ = strconv.Atoi(m[1])
	}
	shape.Workers, _ = strconv.Atoi(m[2])
	g, _ := strconv.Atoi(m[3])
	shape.GPUs = int64(g)
	if shape.Count < 1 || shape.Workers < 1 || shape.GPUs < 1 {
		return Shape{}, fmt.Errorf("gang shape %q: counts must be at least 1", s)
	}
	return shape, nil
}
