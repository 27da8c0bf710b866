package scenario

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// Seeded random streams, one per concern, so that adding jobs never moves
// the spot nodes and a new reclaim never changes the jobs.
const (
	streamNodes uint64 = iota + 1
	streamWaves
	streamPoisson
	streamChurn
	streamSmallNodes
	streamBackground
	streamCPUMembers
	streamDRA
	streamGPUPods
	streamNoisyPods
	// StreamPodOrder is the base of the per-step pod order streams.
	StreamPodOrder uint64 = 1 << 32
)

// Plan is a scenario expanded with a seed: everything a run replays.
type Plan struct {
	Scenario *Scenario
	Seed     uint64
	Nodes    []Node
	// Jobs in submission order (Seq ascending, Submit non-decreasing).
	Jobs     []Job
	Reclaims []Reclaim
	// Background pods bound to the nodes at the start (scenario.Background):
	// the pods block's node by node, then the GPU pods node by node, then
	// the noisy pods; and the PodDisruptionBudgets over some of them.
	Background []BackgroundPod
	PDBs       []PDB
}

// Node is one simulated node. Slot numbers spot nodes so a reclaim can name
// "whatever node fills spot slot k now" across replacements.
type Node struct {
	Name string
	Rack string
	Zone string
	GPUs int64
	Spot bool
	Slot int // index among spot nodes; -1 for on-demand nodes
	// DRA: the node's GPUs are DRA devices of a ResourceSlice, not
	// allocatable (cluster.dra).
	DRA bool
}

// Job is one gang: a batch/v1 Job of Workers pods with GPUs GPUs each,
// and CPUMembers more that ask for no GPU (a TFJob's parameter server).
type Job struct {
	Seq      int
	Name     string
	Submit   time.Duration
	Workers  int
	GPUs     int64
	Duration time.Duration
	Policy   string
	Priority int32
	// CPUMembers are members with no GPU (background.cpuMembers), indexed
	// after the workers.
	CPUMembers int
}

// Members is the gang's size: its GPU workers and its CPU-only members.
func (j *Job) Members() int { return j.Workers + j.CPUMembers }

// Reclaim takes NodesPerEvent spot nodes of one zone away at At.
type Reclaim struct {
	At    time.Duration
	Slots []int
}

// TotalGPUs is the cluster's GPU capacity at the start.
func (p *Plan) TotalGPUs() int64 {
	var n int64
	for _, node := range p.Nodes {
		n += node.GPUs
	}
	return n
}

// TotalPods is the number of pods of all jobs (first attempts); background
// pods are not jobs' and not counted.
func (p *Plan) TotalPods() int {
	n := 0
	for _, j := range p.Jobs {
		n += j.Members()
	}
	return n
}

// SmallNodes counts the nodes with fewer GPUs than cluster.gpusPerNode.
func (p *Plan) SmallNodes() int {
	n := 0
	for _, node := range p.Nodes {
		if node.GPUs < p.Scenario.Cluster.GPUsPerNode {
			n++
		}
	}
	return n
}

// CPUMemberJobs counts the jobs with CPU-only members.
func (p *Plan) CPUMemberJobs() int {
	n := 0
	for _, j := range p.Jobs {
		if j.CPUMembers > 0 {
			n++
		}
	}
	return n
}

// Expand turns the scenario into a Plan for seed.
func (s *Scenario) Expand(seed uint64) (*Plan, error) {
	p := &Plan{Scenario: s, Seed: seed}
	p.Nodes = s.nodes(seed)
	s.smallNodes(seed, p.Nodes)
	s.draNodes(seed, p.Nodes)
	jobs, err := s.jobs(seed)
	if err != nil {
		return nil, err
	}
	p.Jobs = jobs
	p.Reclaims = s.reclaims(seed, p.Nodes)
	p.Background, p.PDBs = s.backgroundPods(seed, p.Nodes)
	gpuPods, err := s.gpuPods(seed, p.Nodes)
	if err != nil {
		return nil, err
	}
	p.Background = append(p.Background, gpuPods...)
	p.Background = append(p.Background, s.noisyPods(seed, p.Nodes, gpuPods)...)
	return p, nil
}

// Quantize rounds d up to the scenario's tick.
func (s *Scenario) Quantize(d time.Duration) time.Duration {
	t := s.Tick.Duration
	return (d + t - 1) / t * t
}

// nodes lays out racks of NodesPerRack (the last may be short), racks
// round-robin over zones, and spreads the spot share evenly so every rack has
// about the same fraction of spot nodes; which nodes in a rack are spot is
// seeded.
func (s *Scenario) nodes(seed uint64) []Node {
	c := s.Cluster
	rng := rand.New(rand.NewPCG(seed, streamNodes))
	racks := (c.Nodes + c.NodesPerRack - 1) / c.NodesPerRack
	width := len(fmt.Sprint(racks))
	nodeWidth := len(fmt.Sprint(c.NodesPerRack))
	nodes := make([]Node, 0, c.Nodes)
	spotWanted := int(math.Floor(float64(c.Nodes) * c.SpotFraction))
	spotSoFar := 0
	for r := 0; r < racks; r++ {
		inRack := min(c.NodesPerRack, c.Nodes-r*c.NodesPerRack)
		rack := fmt.Sprintf("rack-%0*d", width, r)
		zone := fmt.Sprintf("zone-%c", 'a'+r%c.Zones)
		// Spot nodes owed to this rack so far, by the running share.
		owed := int(math.Floor(float64(r*c.NodesPerRack+inRack)*c.SpotFraction)) - spotSoFar
		owed = min(owed, inRack, spotWanted-spotSoFar)
		spotIdx := map[int]bool{}
		for _, i := range rng.Perm(inRack)[:owed] {
			spotIdx[i] = true
		}
		spotSoFar += owed
		for n := 0; n < inRack; n++ {
			nodes = append(nodes, Node{
				Name: fmt.Sprintf("%s-n%0*d", rack, nodeWidth, n),
				Rack: rack, Zone: zone, GPUs: c.GPUsPerNode, Spot: spotIdx[n], Slot: -1,
			})
		}
	}
	slot := 0
	for i := range nodes {
		if nodes[i].Spot {
			nodes[i].Slot = slot
			slot++
		}
	}
	return nodes
}

func (s *Scenario) jobs(seed uint64) ([]Job, error) {
	var jobs []Job
	waveRng := rand.New(rand.NewPCG(seed, streamWaves))
	for _, w := range s.Workload.Waves {
		var wave []Job
		for _, g := range w.Gangs {
			shape, err := ParseShape(g)
			if err != nil {
				return nil, err
			}
			for i := 0; i < shape.Count; i++ {
				wave = append(wave, Job{Submit: s.Quantize(w.At.Duration), Workers: shape.Workers, GPUs: shape.GPUs,
					Duration: s.Quantize(w.Duration.Duration), Policy: w.Policy, Priority: w.Priority})
			}
		}
		if w.Shuffle {
			waveRng.Shuffle(len(wave), func(i, j int) { wave[i], wave[j] = wave[j], wave[i] })
		}
		jobs = append(jobs, wave...)
	}
	if p := s.Workload.Poisson; p != nil {
		rng := rand.New(rand.NewPCG(seed, streamPoisson))
		workers, gpus, policies, priorities := slices.Sorted(maps.Keys(p.Workers)), slices.Sorted(maps.Keys(p.GPUsPerWorker)), slices.Sorted(maps.Keys(p.Policies)), slices.Sorted(maps.Keys(p.Priorities))
		at := float64(p.Start.Duration)
		for i := 0; i < p.Jobs; i++ {
			at += rng.ExpFloat64() * float64(p.MeanInterarrival.Duration)
			d := float64(p.Duration.Median.Duration) * math.Exp(p.Duration.Sigma*rng.NormFloat64())
			if p.Duration.Min.Duration > 0 {
				d = max(d, float64(p.Duration.Min.Duration))
			}
			if p.Duration.Max.Duration > 0 {
				d = min(d, float64(p.Duration.Max.Duration))
			}
			job := Job{
				Submit:   s.Quantize(time.Duration(at)),
				Workers:  weighted(rng, workers, p.Workers),
				GPUs:     int64(weighted(rng, gpus, p.GPUsPerWorker)),
				Duration: s.Quantize(time.Duration(d)),
				Policy:   "",
			}
			if len(policies) > 0 {
				job.Policy = weighted(rng, policies, p.Policies)
			}
			if len(priorities) > 0 { // drawn only when asked: other scenarios keep their jobs
				job.Priority = int32(weighted(rng, priorities, p.Priorities))
			}
			jobs = append(jobs, job)
		}
	}
	// Waves and Poisson jobs merge by submission time; the sort is stable so
	// jobs of one instant keep their listed order.
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Submit < jobs[j].Submit })
	s.cpuMembers(seed, jobs)
	width := len(fmt.Sprint(len(jobs)))
	for i := range jobs {
		jobs[i].Seq = i
		jobs[i].Name = fmt.Sprintf("j%0*d-%dx%d", width, i, jobs[i].Workers, jobs[i].GPUs)
		if jobs[i].CPUMembers > 0 {
			jobs[i].Name += fmt.Sprintf("-ps%d", jobs[i].CPUMembers)
		}
	}
	return jobs, nil
}

func weighted[K int | string](rng *rand.Rand, keys []K, weights map[K]float64) K {
	total := 0.0
	for _, k := range keys {
		total += weights[k]
	}
	x := rng.Float64() * total
	for _, k := range keys {
		x -= weights[k]
		if x < 0 {
			return k
		}
	}
	return keys[len(keys)-1]
}

// reclaims draws Poisson reclaim events; each takes NodesPerEvent spot slots
// of one seeded zone. Slots are resolved to nodes when the event happens.
func (s *Scenario) reclaims(seed uint64, nodes []Node) []Reclaim {
	ch := s.Churn
	if ch == nil {
		return nil
	}
	byZone := map[string][]int{}
	var zones []string
	for _, n := range nodes {
		if !n.Spot {
			continue
		}
		if _, ok := byZone[n.Zone]; !ok {
			zones = append(zones, n.Zone)
		}
		byZone[n.Zone] = append(byZone[n.Zone], n.Slot)
	}
	if len(zones) == 0 {
		return nil
	}
	sort.Strings(zones)
	rng := rand.New(rand.NewPCG(seed, streamChurn))
	var out []Reclaim
	at := float64(ch.Start.Duration)
	for {
		at += rng.ExpFloat64() * float64(ch.MeanInterval.Duration)
		if at >= float64(ch.End.Duration) {
			break
		}
		slots := byZone[zones[rng.IntN(len(zones))]]
		k := min(ch.NodesPerEvent, len(slots))
		picked := make([]int, 0, k)
		for _, i := range rng.Perm(len(slots))[:k] {
			picked = append(picked, slots[i])
		}
		sort.Ints(picked)
		out = append(out, Reclaim{At: s.Quantize(time.Duration(at)), Slots: picked})
	}
	return out
}
