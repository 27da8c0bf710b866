package sim

import (
	"fmt"

	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// firstFit binds pods for the None scheduler as the cluster model creates
// them: the next node, in the plan's order from where the last search
// ended, with the GPUs free (the background's GPU pods count) and, when the
// workload asks for anti-affinity, no noisy pod (for a worker) and no pod
// of another gang.
type firstFit struct {
	plan *scenario.Plan
	bg   *background
	// free and gangs: free GPUs per node and the gangs with pods on it (how
	// many), from the first pick on; cursor: where the next search starts.
	free   map[string]int64
	gangs  map[string]map[*gangState]int
	cursor int
}

func newFirstFit(plan *scenario.Plan, bg *background) *firstFit {
	return &firstFit{plan: plan, bg: bg}
}

// pick chooses the node of member pod of g among the nodes that exist. It
// fails when no node qualifies: None runs only scenarios in which every pod
// fits.
func (f *firstFit) pick(g *gangState, pod string, exist map[string]*nodeSpec) (string, error) {
	nodes := f.plan.Nodes
	if f.free == nil {
		// The background as it is at the first pick.
		f.free = make(map[string]int64, len(nodes))
		f.gangs = make(map[string]map[*gangState]int, len(nodes))
		for _, n := range nodes {
			f.free[n.Name] = n.GPUs - f.bg.gpusOn(n.Name)
			f.gangs[n.Name] = map[*gangState]int{}
		}
	}
	gpus := g.podGPUs(pod)
	anti := f.plan.Scenario.Workload.AntiAffinity
	fits := func(name string) bool {
		if _, exists := exist[name]; !exists || f.free[name] < gpus {
			return false
		}
		if anti == nil {
			return true
		}
		if anti.NoisyPods && !g.cpuOnly[pod] && f.bg.noisyOn(name) {
			return false
		}
		if anti.OtherGangs {
			for other := range f.gangs[name] {
				if other != g {
					return false
				}
			}
		}
		return true
	}
	for i := 0; i < len(nodes); i++ {
		name := nodes[(f.cursor+i)%len(nodes)].Name
		if fits(name) {
			f.free[name] -= gpus
			f.gangs[name][g]++
			f.cursor = (f.cursor + i) % len(nodes)
			return name, nil
		}
	}
	return "", fmt.Errorf("scheduler %s: no node has %d GPUs free and room under the workload's anti-affinity; it runs only scenarios in which every pod fits", None, gpus)
}

// release gives back what member pod of g held on node.
func (f *firstFit) release(g *gangState, pod, node string) {
	f.free[node] += g.podGPUs(pod)
	if f.gangs[node][g]--; f.gangs[node][g] == 0 {
		delete(f.gangs[node], g)
	}
}
