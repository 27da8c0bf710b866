package scenario

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Background is what a real cluster has beside the training jobs: CPU-only
// pods on every node, PodDisruptionBudgets over some of them, nodes of two
// GPU sizes, gangs with members that ask for no GPU, and for a busy cluster
// pods that hold most of the GPUs and CPU-heavy pods that workers avoid
// (busy.go). Each part is on when its block is present; a present block's
// omitted fields take the defaults below. Every choice (which nodes are
// small, which pods a budget covers, which gangs get a CPU-only member,
// where the GPU pods go) is drawn from the scenario's seed.
//
//	background:
//	  pods: {agents: 2, services: 1, serviceReplicas: 4, pdbFraction: 0.5, pdbMaxUnavailable: 1, cpu: 250m, memory: 512Mi}
//	  smallNodes: {fraction: 0.25, gpus: 4}
//	  cpuMembers: {fraction: 0.25, cpu: "4", memory: 16Gi}
//	  gpuPods: {fraction: 0.7, freeNodes: 0.25, sizes: {1: 4, 2: 2, 4: 1, 8: 1}, cpuPerGPU: "4", memoryPerGPU: 32Gi}
//	  noisyPods: {fraction: 0.125, cpu: "8", memory: 32Gi}
type Background struct {
	Pods       *BackgroundPods `json:"pods,omitempty"`
	SmallNodes *SmallNodes     `json:"smallNodes,omitempty"`
	CPUMembers *CPUMembers     `json:"cpuMembers,omitempty"`
	GPUPods    *GPUPods        `json:"gpuPods,omitempty"`
	NoisyPods  *NoisyPods      `json:"noisyPods,omitempty"`
}

// BackgroundPods are CPU-only pods bound to every node at t=0 and never
// finishing, as node agents and services are: priority 0 (no
// PriorityClass), no GPU, not jobs (no job metric counts them). Per node
// there are Agents DaemonSet pods and Services pods of Deployments; a
// Deployment has ServiceReplicas pods on as many distinct nodes. A seeded
// PDBFraction of the Deployments has a policy/v1 PodDisruptionBudget with
// maxUnavailable PDBMaxUnavailable over its pods, whose status the
// simulator keeps as the disruption controller would.
type BackgroundPods struct {
	// Agents per node (default 2).
	Agents *int `json:"agents,omitempty"`
	// Services: pods of Deployments per node (default 1).
	Services *int `json:"services,omitempty"`
	// ServiceReplicas: pods per Deployment (default 4).
	ServiceReplicas int `json:"serviceReplicas,omitempty"`
	// PDBFraction of the Deployments (rounded down) have a budget
	// (default 0.5).
	PDBFraction *float64 `json:"pdbFraction,omitempty"`
	// PDBMaxUnavailable is each budget's spec.maxUnavailable (default 1; 0
	// allows no eviction at all).
	PDBMaxUnavailable *int `json:"pdbMaxUnavailable,omitempty"`
	// CPU and Memory are each pod's requests (defaults "250m", "512Mi").
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// SmallNodes gives a share of the nodes fewer GPUs: Fraction of the nodes
// (rounded down, spread evenly over racks, which ones seeded) have GPUs
// GPUs instead of cluster.gpusPerNode, and CPU and memory in proportion.
type SmallNodes struct {
	// Fraction of the nodes, in (0, 1) (default 0.25).
	Fraction float64 `json:"fraction,omitempty"`
	// GPUs of a small node, in [1, gpusPerNode) (default gpusPerNode/2).
	GPUs int64 `json:"gpus,omitempty"`
}

// CPUMembers gives a share of the gangs one more member that asks for no
// GPU, as a TFJob's parameter server beside its GPU workers: the gang is
// whole only when it too is bound.
type CPUMembers struct {
	// Fraction of the jobs (rounded to the nearest job, which ones seeded)
	// in [0, 1] (default 0.25).
	Fraction *float64 `json:"fraction,omitempty"`
	// CPU and Memory are the member's requests (defaults "4", "16Gi").
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

func (b *Background) defaults(c Cluster) {
	if p := b.Pods; p != nil {
		p.Agents = orDefault(p.Agents, 2)
		p.Services = orDefault(p.Services, 1)
		if p.ServiceReplicas == 0 {
			p.ServiceReplicas = 4
		}
		p.PDBFraction = orDefault(p.PDBFraction, 0.5)
		p.PDBMaxUnavailable = orDefault(p.PDBMaxUnavailable, 1)
		if p.CPU == "" {
			p.CPU = "250m"
		}
		if p.Memory == "" {
			p.Memory = "512Mi"
		}
	}
	if s := b.SmallNodes; s != nil {
		if s.Fraction == 0 {
			s.Fraction = 0.25
		}
		if s.GPUs == 0 {
			s.GPUs = c.GPUsPerNode / 2
		}
	}
	if m := b.CPUMembers; m != nil {
		m.Fraction = orDefault(m.Fraction, 0.25)
		if m.CPU == "" {
			m.CPU = "4"
		}
		if m.Memory == "" {
			m.Memory = "16Gi"
		}
	}
	if g := b.GPUPods; g != nil {
		g.defaults()
	}
	if n := b.NoisyPods; n != nil {
		n.defaults()
	}
}

func orDefault[T any](v *T, def T) *T {
	if v == nil {
		return &def
	}
	return v
}

// validate reports the first thing that makes the background unusable,
// naming the field.
func (b *Background) validate(c Cluster) error {
	if b.Pods == nil && b.SmallNodes == nil && b.CPUMembers == nil && b.GPUPods == nil && b.NoisyPods == nil {
		return fmt.Errorf("background: set at least one of pods, smallNodes, cpuMembers, gpuPods, noisyPods")
	}
	if p := b.Pods; p != nil {
		switch {
		case *p.Agents < 0 || *p.Services < 0:
			return fmt.Errorf("background.pods.agents and background.pods.services must not be negative")
		case *p.Agents+*p.Services == 0:
			return fmt.Errorf("background.pods: agents + services must be at least 1 (leave out the block for no background pods)")
		case p.ServiceReplicas < 1:
			return fmt.Errorf("background.pods.serviceReplicas must be at least 1")
		case *p.PDBFraction < 0 || *p.PDBFraction > 1:
			return fmt.Errorf("background.pods.pdbFraction must be in [0, 1], got %g", *p.PDBFraction)
		case *p.PDBMaxUnavailable < 0:
			return fmt.Errorf("background.pods.pdbMaxUnavailable must not be negative")
		}
		if err := positiveQuantity("background.pods.cpu", p.CPU); err != nil {
			return err
		}
		if err := positiveQuantity("background.pods.memory", p.Memory); err != nil {
			return err
		}
	}
	if s := b.SmallNodes; s != nil {
		switch {
		case s.Fraction <= 0 || s.Fraction >= 1:
			return fmt.Errorf("background.smallNodes.fraction must be in (0, 1), got %g (for every node small, set cluster.gpusPerNode)", s.Fraction)
		case s.GPUs < 1 || s.GPUs >= c.GPUsPerNode:
			return fmt.Errorf("background.smallNodes.gpus must be in [1, %d) (fewer than cluster.gpusPerNode), got %d", c.GPUsPerNode, s.GPUs)
		}
	}
	if m := b.CPUMembers; m != nil {
		if *m.Fraction < 0 || *m.Fraction > 1 {
			return fmt.Errorf("background.cpuMembers.fraction must be in [0, 1], got %g", *m.Fraction)
		}
		if err := positiveQuantity("background.cpuMembers.cpu", m.CPU); err != nil {
			return err
		}
		if err := positiveQuantity("background.cpuMembers.memory", m.Memory); err != nil {
			return err
		}
	}
	if g := b.GPUPods; g != nil {
		if err := g.validate(c); err != nil {
			return err
		}
	}
	if n := b.NoisyPods; n != nil {
		if err := n.validate(); err != nil {
			return err
		}
	}
	return nil
}

func positiveQuantity(field, value string) error {
	q, err := resource.ParseQuantity(value)
	if err != nil {
		return fmt.Errorf("%s: %q is not a quantity (like 250m, 4, 512Mi): %v", field, value, err)
	}
	if q.Sign() <= 0 {
		return fmt.Errorf("%s must be positive, got %q", field, value)
	}
	return nil
}

// Kinds of background pod: what controls it in a real cluster.
const (
	KindAgent   = "DaemonSet"
	KindService = "Deployment"
)

// BackgroundPod is one pod bound to Node from t=0: CPU-only (the pods
// block's agents and services, and noisy pods) or holding GPUs (gpuPods).
type BackgroundPod struct {
	Name string
	Node string
	// App is the DaemonSet or Deployment it belongs to (its app label),
	// Kind which of the two.
	App  string
	Kind string
	// PDB names the budget that covers it ("" for none).
	PDB string
	// GPUs it holds (background.gpuPods; 0 for the others).
	GPUs int64
	// Noisy: a pod of background.noisyPods (app NoisyApp).
	Noisy bool
}

// PDB is a PodDisruptionBudget over the pods of one Deployment (label app).
type PDB struct {
	Name           string
	App            string
	Pods           int
	MaxUnavailable int
}

// BackgroundPodName is the name of app's pod on node: a reclaimed node's
// replacement gets the same apps under its own name.
func BackgroundPodName(app, node string) string { return app + "-" + node }

// smallNodes picks which nodes have fewer GPUs: the share is spread evenly
// over racks by the running share, as spot nodes are; which nodes in a
// rack is seeded.
func (s *Scenario) smallNodes(seed uint64, nodes []Node) {
	b := s.Background
	if b == nil || b.SmallNodes == nil {
		return
	}
	rng := rand.New(rand.NewPCG(seed, streamSmallNodes))
	for _, i := range spreadOverRacks(rng, nodes, b.SmallNodes.Fraction) {
		nodes[i].GPUs = b.SmallNodes.GPUs
	}
}

// spreadOverRacks picks fraction of the nodes (rounded down), spread evenly
// over racks by the running share; which nodes in a rack is drawn from rng.
func spreadOverRacks(rng *rand.Rand, nodes []Node, fraction float64) []int {
	var racks []string
	byRack := map[string][]int{}
	for i, n := range nodes {
		if _, ok := byRack[n.Rack]; !ok {
			racks = append(racks, n.Rack)
		}
		byRack[n.Rack] = append(byRack[n.Rack], i)
	}
	wanted := int(math.Floor(float64(len(nodes)) * fraction))
	var picked []int
	seen, soFar := 0, 0
	for _, rack := range racks {
		idx := byRack[rack]
		seen += len(idx)
		owed := min(int(math.Floor(float64(seen)*fraction))-soFar, len(idx), wanted-soFar)
		for _, k := range rng.Perm(len(idx))[:max(owed, 0)] {
			picked = append(picked, idx[k])
		}
		soFar += max(owed, 0)
	}
	return picked
}

// backgroundPods lays out the background pods of the nodes at the start:
// per node its agents, then its service pods. The pods of each service
// layer (one pod per node) go to the Deployments in a seeded node order,
// ServiceReplicas consecutive nodes each (the last Deployment may be
// smaller); a seeded PDBFraction of the Deployments get a budget.
func (s *Scenario) backgroundPods(seed uint64, nodes []Node) ([]BackgroundPod, []PDB) {
	b := s.Background
	if b == nil || b.Pods == nil || len(nodes) == 0 {
		return nil, nil
	}
	p := b.Pods
	rng := rand.New(rand.NewPCG(seed, streamBackground))
	// service[layer][node index] is the Deployment of that node's pod.
	type deployment struct {
		name string
		pods int
	}
	var deployments []deployment
	service := make([][]int, *p.Services)
	for layer := range service {
		service[layer] = make([]int, len(nodes))
		for i, n := range rng.Perm(len(nodes)) {
			if i%p.ServiceReplicas == 0 {
				deployments = append(deployments, deployment{})
			}
			d := len(deployments) - 1
			service[layer][n] = d
			deployments[d].pods++
		}
	}
	width := len(fmt.Sprint(max(len(deployments)-1, 0)))
	for i := range deployments {
		deployments[i].name = fmt.Sprintf("svc-%0*d", width, i)
	}
	withPDB := map[int]bool{}
	for _, d := range rng.Perm(len(deployments))[:int(math.Floor(float64(len(deployments))**p.PDBFraction))] {
		withPDB[d] = true
	}
	var pdbs []PDB
	for i, d := range deployments {
		if withPDB[i] {
			pdbs = append(pdbs, PDB{Name: d.name, App: d.name, Pods: d.pods, MaxUnavailable: *p.PDBMaxUnavailable})
		}
	}
	var pods []BackgroundPod
	for i, n := range nodes {
		for a := 0; a < *p.Agents; a++ {
			app := fmt.Sprintf("agent-%d", a)
			pods = append(pods, BackgroundPod{Name: BackgroundPodName(app, n.Name), Node: n.Name, App: app, Kind: KindAgent})
		}
		for layer := range service {
			d := service[layer][i]
			pod := BackgroundPod{Name: BackgroundPodName(deployments[d].name, n.Name), Node: n.Name, App: deployments[d].name, Kind: KindService}
			if withPDB[d] {
				pod.PDB = deployments[d].name
			}
			pods = append(pods, pod)
		}
	}
	return pods, pdbs
}

// cpuMembers gives a seeded share of the jobs (rounded to the nearest job)
// one CPU-only member.
func (s *Scenario) cpuMembers(seed uint64, jobs []Job) {
	b := s.Background
	if b == nil || b.CPUMembers == nil || len(jobs) == 0 {
		return
	}
	rng := rand.New(rand.NewPCG(seed, streamCPUMembers))
	k := int(math.Round(float64(len(jobs)) * *b.CPUMembers.Fraction))
	picked := rng.Perm(len(jobs))[:k]
	sort.Ints(picked)
	for _, i := range picked {
		jobs[i].CPUMembers = 1
	}
}
