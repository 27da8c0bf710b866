package scenario

import (
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// busy is 64 nodes of 8 GPUs in 4 racks of 16: the background holds 70%
// of the GPUs, leaves a quarter of the nodes free and puts a noisy pod on
// half of those.
const busy = `
name: busy
cluster: {nodes: 64, gpusPerNode: 8, nodesPerRack: 16}
background:
  gpuPods: {fraction: 0.7, freeNodes: 0.25}
  noisyPods: {fraction: 0.5}
workload:
  antiAffinity: {otherGangs: true, noisyPods: true}
  waves: [{duration: 1m, gangs: ["2*4x8"]}]
`

func TestBusyDefaults(t *testing.T) {
	b := mustParse(t, tiny+"background: {gpuPods: {}, noisyPods: {}}\n").Background
	g, n := b.GPUPods, b.NoisyPods
	if g.Fraction != 0.7 || *g.FreeNodes != 0.25 || !reflect.DeepEqual(g.Sizes, map[int]float64{1: 4, 2: 2, 4: 1, 8: 1}) ||
		g.CPUPerGPU != "4" || g.MemoryPerGPU != "32Gi" {
		t.Errorf("gpuPods defaults = fraction %g, freeNodes %g, sizes %v, %s, %s", g.Fraction, *g.FreeNodes, g.Sizes, g.CPUPerGPU, g.MemoryPerGPU)
	}
	if n.Fraction != 0.125 || n.CPU != "8" || n.Memory != "32Gi" {
		t.Errorf("noisyPods defaults = %+v", *n)
	}
	// An explicit freeNodes 0 is kept.
	if z := mustParse(t, tiny+"background: {gpuPods: {freeNodes: 0, fraction: 0.5}}\n").Background.GPUPods; *z.FreeNodes != 0 {
		t.Errorf("freeNodes 0 became %g", *z.FreeNodes)
	}
}

// Bad input is refused with an error that names the field and says why.
func TestBusyRejects(t *testing.T) {
	for name, tc := range map[string]struct{ block, want string }{
		"fraction 1":              {"background: {gpuPods: {fraction: 1}}", "background.gpuPods.fraction must be in (0, 1)"},
		"fraction negative":       {"background: {gpuPods: {fraction: -0.2}}", "background.gpuPods.fraction"},
		"freeNodes 1":             {"background: {gpuPods: {freeNodes: 1}}", "background.gpuPods.freeNodes must be in [0, 1)"},
		"freeNodes negative":      {"background: {gpuPods: {freeNodes: -0.1}}", "background.gpuPods.freeNodes"},
		"more than the busy room": {"background: {gpuPods: {fraction: 0.9, freeNodes: 0.2}}", "more than the 64 GPUs of the 8 nodes not kept free"},
		"size above a node":       {"background: {gpuPods: {sizes: {16: 1}}}", "background.gpuPods.sizes: 16"},
		"size zero":               {"background: {gpuPods: {sizes: {0: 1}}}", "background.gpuPods.sizes: 0"},
		"no weight":               {"background: {gpuPods: {sizes: {1: 0, 2: 0}}}", "background.gpuPods.sizes needs a positive total weight"},
		"negative weight":         {"background: {gpuPods: {sizes: {1: -1, 2: 3}}}", "background.gpuPods.sizes"},
		"cpu per GPU":             {"background: {gpuPods: {cpuPerGPU: many}}", "background.gpuPods.cpuPerGPU"},
		"memory per GPU":          {"background: {gpuPods: {memoryPerGPU: '0'}}", "background.gpuPods.memoryPerGPU must be positive"},
		"with DRA":                {"background: {gpuPods: {}}\ncluster: {nodes: 10, gpusPerNode: 8, nodesPerRack: 4, dra: {}}", "cannot be combined with cluster.dra"},
		"noisy fraction":          {"background: {noisyPods: {fraction: 1.5}}", "background.noisyPods.fraction must be in (0, 1]"},
		"noisy cpu":               {"background: {noisyPods: {cpu: -2}}", "background.noisyPods.cpu must be positive"},
		"noisy memory":            {"background: {noisyPods: {memory: lots}}", "background.noisyPods.memory"},
		"unknown field":           {"background: {gpuPods: {fractoin: 0.5}}", "fractoin"},
		"empty anti-affinity":     {"background: {noisyPods: {}}\nworkloadAnti: {}", "workload.antiAffinity: set otherGangs or noisyPods"},
		"noisy nobody":            {"background: {gpuPods: {}}\nworkloadAnti: {noisyPods: true}", "workload.antiAffinity.noisyPods needs background.noisyPods"},
		"noisy no background":     {"workloadAnti: {noisyPods: true}", "workload.antiAffinity.noisyPods needs background.noisyPods"},
	} {
		t.Run(name, func(t *testing.T) {
			text := tiny
			block := tc.block
			if before, anti, ok := strings.Cut(block, "workloadAnti: "); ok {
				text = strings.Replace(text, "workload:\n", "workload:\n  antiAffinity: "+anti+"\n", 1)
				block = strings.TrimSpace(before)
			}
			if before, cluster, ok := strings.Cut(block, "\ncluster: "); ok {
				text = strings.Replace(text, "cluster: {nodes: 10, gpusPerNode: 8, nodesPerRack: 4, zones: 2, spotFraction: 0.3}", "cluster: "+cluster, 1)
				text = strings.Replace(text, "churn: ", "# churn: ", 1)
				block = before
			}
			if block != "" {
				text += block + "\n"
			}
			_, err := Parse([]byte(text))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", text)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	// With small nodes the room depends on which nodes are kept free:
	// Expand checks it.
	s := mustParse(t, "name: x\ncluster: {nodes: 4, gpusPerNode: 8, nodesPerRack: 4}\nworkload: {waves: [{duration: 1m, gangs: [1x1]}]}\n"+
		"background: {smallNodes: {fraction: 0.5, gpus: 1}, gpuPods: {fraction: 0.5, freeNodes: 0.25}}\n")
	for seed := uint64(1); seed <= 8; seed++ {
		if _, err := s.Expand(seed); err != nil && !strings.Contains(err.Error(), "more than the") {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
}

func TestExpandBusy(t *testing.T) {
	p, err := mustParse(t, busy).Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	heldOn := map[string]int64{}
	noisyOn := map[string]bool{}
	names := map[string]bool{}
	sizes := map[int64]int{}
	for _, bp := range p.Background {
		if names[bp.Name] {
			t.Errorf("pod name %s twice", bp.Name)
		}
		names[bp.Name] = true
		if bp.Name != BackgroundPodName(bp.App, bp.Node) || bp.Kind != KindService {
			t.Errorf("pod %+v: want a Deployment replica named after its app and node", bp)
		}
		switch {
		case bp.Noisy:
			if bp.App != NoisyApp || bp.GPUs != 0 || noisyOn[bp.Node] {
				t.Errorf("noisy pod %+v: want one per node, app %s, no GPU", bp, NoisyApp)
			}
			noisyOn[bp.Node] = true
		case bp.GPUs > 0:
			heldOn[bp.Node] += bp.GPUs
			sizes[bp.GPUs]++
		default:
			t.Errorf("pod %+v holds no GPU and is not noisy; the scenario has no pods block", bp)
		}
	}
	// floor(512 * 0.7) = 358 GPUs held, on the 48 nodes not kept free
	// (floor(64 * 0.25) = 16 kept free, 4 per rack by the running share).
	if got := p.BackgroundGPUs(); got != 358 {
		t.Errorf("background holds %d GPUs, want 358", got)
	}
	full, partial := 0, 0
	freePerRack := map[string]int{}
	for _, n := range p.Nodes {
		switch held := heldOn[n.Name]; {
		case held > n.GPUs:
			t.Errorf("node %s: %d GPUs held of %d", n.Name, held, n.GPUs)
		case held == n.GPUs:
			full++
		case held > 0:
			partial++
		default:
			freePerRack[n.Rack]++
		}
		if noisyOn[n.Name] && heldOn[n.Name] > 0 {
			t.Errorf("noisy pod on %s, whose GPUs are not all free", n.Name)
		}
	}
	if want := map[string]int{"rack-0": 4, "rack-1": 4, "rack-2": 4, "rack-3": 4}; !reflect.DeepEqual(freePerRack, want) {
		t.Errorf("nodes with every GPU free per rack = %v, want %v", freePerRack, want)
	}
	// 26 GPUs stay free on the busy nodes: some full, some not.
	if full == 0 || partial == 0 || full+partial != 48 {
		t.Errorf("%d full and %d partly held nodes, want both and 48 in all", full, partial)
	}
	for size := range sizes {
		if size != 1 && size != 2 && size != 4 && size != 8 {
			t.Errorf("a GPU pod of %d GPUs: only the default sizes fit an 8-GPU node", size)
		}
	}
	// floor(16 * 0.5) = 8 noisy pods, rack by rack: two racks' free nodes.
	noisyRacks := map[string]int{}
	for _, n := range p.Nodes {
		if noisyOn[n.Name] {
			noisyRacks[n.Rack]++
		}
	}
	if len(noisyOn) != 8 || len(noisyRacks) != 2 {
		t.Errorf("noisy pods on %d nodes in racks %v; want 8 filling two racks' free nodes", len(noisyOn), noisyRacks)
	}
	if free, noisy := p.FreeNodes(); free != 16 || noisy != 8 {
		t.Errorf("FreeNodes = %d, %d; want 16, 8", free, noisy)
	}
}

// The busy background is seeded and never moves what the seed decides
// without it.
func TestBusyIsSeeded(t *testing.T) {
	s := mustParse(t, busy)
	a, _ := s.Expand(3)
	b, _ := s.Expand(3)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two expansions with seed 3 differ")
	}
	c, _ := s.Expand(4)
	if reflect.DeepEqual(a.Background, c.Background) {
		t.Error("seeds 3 and 4 gave the same background")
	}
	plain, err := Parse([]byte("name: busy\ncluster: {nodes: 64, gpusPerNode: 8, nodesPerRack: 16}\nworkload: {waves: [{duration: 1m, gangs: [\"2*4x8\"]}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	pp, _ := plain.Expand(3)
	if !reflect.DeepEqual(pp.Nodes, a.Nodes) || !reflect.DeepEqual(pp.Jobs, a.Jobs) {
		t.Error("the busy background moved the nodes or the jobs")
	}
}

// The busy equal-work scenarios are equal work for every seed make bench
// runs: at no instant do running gangs need more nodes than the
// background leaves usable (every GPU free, no noisy pod), even when each
// gang must fit in one rack (TAS's constraint, muster's preference), so
// every scheduler places every pod on its first attempt.
func TestBusyEqualWorkScenariosFit(t *testing.T) {
	files, err := filepath.Glob("../../../bench/scenarios/equal-*-busy.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no busy equal-work scenarios: %v", err)
	}
	for _, f := range files {
		s, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if s.Background == nil || s.Background.GPUPods == nil {
			t.Errorf("%s: a busy scenario without background.gpuPods", s.Name)
			continue
		}
		for seed := uint64(1); seed <= 5; seed++ {
			p, err := s.Expand(seed)
			if err != nil {
				t.Fatal(err)
			}
			if held := float64(p.BackgroundGPUs()) / float64(p.TotalGPUs()); held < 0.65 {
				t.Errorf("%s seed %d: the background holds %.0f%% of the GPUs, not a busy cluster", s.Name, seed, 100*held)
			}
			busy := map[string]bool{}
			for _, bp := range p.Background {
				if bp.GPUs > 0 || bp.Noisy {
					busy[bp.Node] = true
				}
			}
			usable := map[string]int{}
			for _, n := range p.Nodes {
				if !busy[n.Name] {
					usable[n.Rack]++
				}
			}
			type change struct {
				at    time.Duration
				gangs int
			}
			var changes []change
			for _, j := range p.Jobs {
				if j.GPUs != s.Cluster.GPUsPerNode || j.CPUMembers > 0 || j.Workers != p.Jobs[0].Workers {
					t.Fatalf("%s: job %s is not a gang of %d whole-node workers", s.Name, j.Name, p.Jobs[0].Workers)
				}
				changes = append(changes, change{j.Submit, 1}, change{j.Submit + j.Duration, -1})
			}
			sort.Slice(changes, func(a, b int) bool {
				if changes[a].at != changes[b].at {
					return changes[a].at < changes[b].at
				}
				return changes[a].gangs < changes[b].gangs
			})
			running, peak := 0, 0
			for _, c := range changes {
				running += c.gangs
				peak = max(peak, running)
			}
			// Gangs that fit at once, each in one rack.
			fit := 0
			for _, n := range usable {
				fit += n / p.Jobs[0].Workers
			}
			if peak > fit {
				t.Errorf("%s seed %d: %d gangs run at the peak, but racks' usable nodes hold only %d at once", s.Name, seed, peak, fit)
			}
		}
	}
}
