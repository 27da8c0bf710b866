package scenario

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// A busy cluster: most GPUs already held when the jobs arrive, and pods
// that training workers refuse to share a node with.
//
//	background:
//	  gpuPods: {fraction: 0.7, freeNodes: 0.25, sizes: {1: 4, 2: 2, 4: 1, 8: 1}, cpuPerGPU: "4", memoryPerGPU: 32Gi}
//	  noisyPods: {fraction: 0.125, cpu: "8", memory: 32Gi}
//	workload:
//	  antiAffinity: {otherGangs: true, noisyPods: true}

// GPUPods hold a share of the cluster's GPUs from t=0 and never finish, as
// other teams' inference services, notebooks and long jobs do on a busy
// cluster: Deployment replicas of priority 0 (no PriorityClass), not jobs
// (no job metric counts them). FreeNodes of the nodes (rounded down,
// spread evenly over racks, which ones in a rack seeded) keep every GPU
// free. Fraction of the cluster's GPUs (rounded down) go to the other
// nodes pod by pod: each pod takes a seeded node among those with GPUs
// still free, and a size drawn from Sizes among the sizes that fit both
// that node's free GPUs and what is left of the fraction (when none fits,
// the pod takes what fits). Some nodes so end full and others with a few
// GPUs free, and only the free nodes can take a worker of a whole node's
// GPUs. Each pod asks for CPUPerGPU and MemoryPerGPU per GPU.
type GPUPods struct {
	// Fraction of the cluster's GPUs held, in (0, 1) (default 0.7).
	Fraction float64 `json:"fraction,omitempty"`
	// FreeNodes is the share of the nodes with every GPU free, in [0, 1)
	// (default 0.25).
	FreeNodes *float64 `json:"freeNodes,omitempty"`
	// Sizes weighs the pods' GPU counts (default {1: 4, 2: 2, 4: 1, 8: 1}).
	Sizes map[int]float64 `json:"sizes,omitempty"`
	// CPUPerGPU and MemoryPerGPU are each pod's requests per GPU it holds
	// (defaults "4", "32Gi").
	CPUPerGPU    string `json:"cpuPerGPU,omitempty"`
	MemoryPerGPU string `json:"memoryPerGPU,omitempty"`
}

// NoisyPods are CPU-heavy pods of a batch framework that runs beside the
// training jobs with a scheduler of its own (Spark executors, say) and
// fills idle GPU nodes: Fraction of the nodes whose GPUs are all free at
// t=0 (after gpuPods; rounded down) run one each, rack by rack (racks in a
// seeded order, every free node of a rack before the next rack), as such a
// framework asks for rack locality. They carry the label app=NoisyApp and
// are Deployment replicas of priority 0, not jobs. Workers whose workload
// says antiAffinity.noisyPods refuse their nodes.
type NoisyPods struct {
	// Fraction of the nodes with every GPU free, in (0, 1] (default 0.125).
	Fraction float64 `json:"fraction,omitempty"`
	// CPU and Memory are each pod's requests (defaults "8", "32Gi").
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// NoisyApp is the app label of the noisy pods (background.noisyPods).
const NoisyApp = "cpu-batch"

// AntiAffinity gives every GPU worker required pod anti-affinity on the
// node (topologyKey kubernetes.io/hostname), as training jobs ask for to
// keep noisy neighbours off their nodes. The same pods go to every
// scheduler, so the framework's InterPodAffinity filter refuses the same
// nodes to each.
type AntiAffinity struct {
	// OtherGangs: a worker shares no node with a pod of another job (pods
	// whose batch.kubernetes.io/job-name label is set and is not its own
	// job's): one training job per node.
	OtherGangs bool `json:"otherGangs,omitempty"`
	// NoisyPods: a worker shares no node with a noisy pod (label
	// app=NoisyApp in the background's namespace); needs
	// background.noisyPods.
	NoisyPods bool `json:"noisyPods,omitempty"`
}

func (g *GPUPods) defaults() {
	if g.Fraction == 0 {
		g.Fraction = 0.7
	}
	g.FreeNodes = orDefault(g.FreeNodes, 0.25)
	if len(g.Sizes) == 0 {
		g.Sizes = map[int]float64{1: 4, 2: 2, 4: 1, 8: 1}
	}
	if g.CPUPerGPU == "" {
		g.CPUPerGPU = "4"
	}
	if g.MemoryPerGPU == "" {
		g.MemoryPerGPU = "32Gi"
	}
}

func (n *NoisyPods) defaults() {
	if n.Fraction == 0 {
		n.Fraction = 0.125
	}
	if n.CPU == "" {
		n.CPU = "8"
	}
	if n.Memory == "" {
		n.Memory = "32Gi"
	}
}

func (g *GPUPods) validate(c Cluster) error {
	switch {
	case g.Fraction <= 0 || g.Fraction >= 1:
		return fmt.Errorf("background.gpuPods.fraction must be in (0, 1), got %g", g.Fraction)
	case *g.FreeNodes < 0 || *g.FreeNodes >= 1:
		return fmt.Errorf("background.gpuPods.freeNodes must be in [0, 1), got %g", *g.FreeNodes)
	case c.DRA != nil:
		return fmt.Errorf("background.gpuPods cannot be combined with cluster.dra: a background pod bound to a DRA node would need an allocated ResourceClaim")
	}
	total := 0.0
	for size, w := range g.Sizes {
		if size < 1 || int64(size) > c.GPUsPerNode || w < 0 {
			return fmt.Errorf("background.gpuPods.sizes: %d: sizes must be in [1, %d] (cluster.gpusPerNode) and weights non-negative", size, c.GPUsPerNode)
		}
		total += w
	}
	if total <= 0 {
		return fmt.Errorf("background.gpuPods.sizes needs a positive total weight")
	}
	if err := positiveQuantity("background.gpuPods.cpuPerGPU", g.CPUPerGPU); err != nil {
		return err
	}
	if err := positiveQuantity("background.gpuPods.memoryPerGPU", g.MemoryPerGPU); err != nil {
		return err
	}
	// With nodes of one size the held GPUs must fit on the nodes not kept
	// free; with small nodes it depends on which nodes are kept free, and
	// Expand checks it.
	free := int(math.Floor(float64(c.Nodes) * *g.FreeNodes))
	held := int64(math.Floor(float64(int64(c.Nodes)*c.GPUsPerNode) * g.Fraction))
	if room := int64(c.Nodes-free) * c.GPUsPerNode; held > room {
		return fmt.Errorf("background.gpuPods: fraction %g of the cluster's GPUs is %d GPUs, more than the %d GPUs of the %d nodes not kept free (freeNodes %g)",
			g.Fraction, held, room, c.Nodes-free, *g.FreeNodes)
	}
	return nil
}

func (n *NoisyPods) validate() error {
	if n.Fraction <= 0 || n.Fraction > 1 {
		return fmt.Errorf("background.noisyPods.fraction must be in (0, 1], got %g", n.Fraction)
	}
	if err := positiveQuantity("background.noisyPods.cpu", n.CPU); err != nil {
		return err
	}
	return positiveQuantity("background.noisyPods.memory", n.Memory)
}

func (a *AntiAffinity) validate(b *Background) error {
	switch {
	case !a.OtherGangs && !a.NoisyPods:
		return fmt.Errorf("workload.antiAffinity: set otherGangs or noisyPods (leave out the block for no anti-affinity)")
	case a.NoisyPods && (b == nil || b.NoisyPods == nil):
		return fmt.Errorf("workload.antiAffinity.noisyPods needs background.noisyPods: no pod carries the label app=%s to avoid", NoisyApp)
	}
	return nil
}

// gpuPods lays out the background's GPU pods (GPUPods) on nodes.
func (s *Scenario) gpuPods(seed uint64, nodes []Node) ([]BackgroundPod, error) {
	b := s.Background
	if b == nil || b.GPUPods == nil || len(nodes) == 0 {
		return nil, nil
	}
	g := b.GPUPods
	rng := rand.New(rand.NewPCG(seed, streamGPUPods))
	kept := map[int]bool{}
	for _, i := range spreadOverRacks(rng, nodes, *g.FreeNodes) {
		kept[i] = true
	}
	free := make([]int64, len(nodes))
	var open []int // nodes that still have GPUs free, in node order at first
	var total, room int64
	for i, n := range nodes {
		total += n.GPUs
		if kept[i] {
			continue
		}
		free[i] = n.GPUs
		room += n.GPUs
		open = append(open, i)
	}
	left := int64(math.Floor(float64(total) * g.Fraction))
	if left > room {
		return nil, fmt.Errorf("background.gpuPods: fraction %g of the cluster's GPUs is %d GPUs, more than the %d GPUs of the nodes not kept free (freeNodes %g)",
			g.Fraction, left, room, *g.FreeNodes)
	}
	sizes := slices.Sorted(maps.Keys(g.Sizes))
	onNode := make([]int, len(nodes))
	var pods []BackgroundPod
	for left > 0 {
		k := rng.IntN(len(open))
		i := open[k]
		size := sizeUpTo(rng, sizes, g.Sizes, min(free[i], left))
		app := fmt.Sprintf("gpu-%d", onNode[i])
		pods = append(pods, BackgroundPod{Name: BackgroundPodName(app, nodes[i].Name), Node: nodes[i].Name, App: app, Kind: KindService, GPUs: size})
		onNode[i]++
		free[i] -= size
		left -= size
		if free[i] == 0 {
			open[k] = open[len(open)-1]
			open = open[:len(open)-1]
		}
	}
	// Node by node, then in the order each node got them.
	index := map[string]int{}
	for i, n := range nodes {
		index[n.Name] = i
	}
	sort.SliceStable(pods, func(a, b int) bool { return index[pods[a].Node] < index[pods[b].Node] })
	return pods, nil
}

// sizeUpTo draws a pod size from the weighted sizes no larger than limit;
// when none is that small, the pod takes limit.
func sizeUpTo(rng *rand.Rand, sizes []int, weights map[int]float64, limit int64) int64 {
	var fit []int
	total := 0.0
	for _, s := range sizes {
		if int64(s) <= limit && weights[s] > 0 {
			fit = append(fit, s)
			total += weights[s]
		}
	}
	if len(fit) == 0 {
		return limit
	}
	return int64(weighted(rng, fit, weights))
}

// noisyPods puts one noisy pod (NoisyPods) on a share of the nodes whose
// GPUs the background leaves all free, rack by rack.
func (s *Scenario) noisyPods(seed uint64, nodes []Node, gpuPods []BackgroundPod) []BackgroundPod {
	b := s.Background
	if b == nil || b.NoisyPods == nil {
		return nil
	}
	held := map[string]bool{}
	for _, p := range gpuPods {
		held[p.Node] = true
	}
	var racks []string
	freeIn := map[string][]int{}
	total := 0
	for i, n := range nodes {
		if held[n.Name] {
			continue
		}
		if _, ok := freeIn[n.Rack]; !ok {
			racks = append(racks, n.Rack)
		}
		freeIn[n.Rack] = append(freeIn[n.Rack], i)
		total++
	}
	wanted := int(math.Floor(float64(total) * b.NoisyPods.Fraction))
	rng := rand.New(rand.NewPCG(seed, streamNoisyPods))
	var picked []int
	for _, r := range rng.Perm(len(racks)) {
		for _, i := range freeIn[racks[r]] {
			if len(picked) == wanted {
				break
			}
			picked = append(picked, i)
		}
	}
	sort.Ints(picked)
	pods := make([]BackgroundPod, 0, len(picked))
	for _, i := range picked {
		pods = append(pods, BackgroundPod{Name: BackgroundPodName(NoisyApp, nodes[i].Name), Node: nodes[i].Name, App: NoisyApp, Kind: KindService, Noisy: true})
	}
	return pods
}

// BackgroundGPUs are the GPUs the background's pods hold at the start.
func (p *Plan) BackgroundGPUs() int64 {
	var n int64
	for _, bp := range p.Background {
		n += bp.GPUs
	}
	return n
}

// FreeNodes are the nodes on which no background pod holds a GPU at the
// start, and NoisyNodes those of them that run a noisy pod.
func (p *Plan) FreeNodes() (free, noisy int) {
	held, isNoisy := map[string]bool{}, map[string]bool{}
	for _, bp := range p.Background {
		if bp.GPUs > 0 {
			held[bp.Node] = true
		}
		if bp.Noisy {
			isNoisy[bp.Node] = true
		}
	}
	return len(p.Nodes) - len(held), len(isNoisy)
}
