package scenario

import (
	"reflect"
	"strings"
	"testing"
)

// withBackground is tiny (10 nodes in racks of 4, 23 jobs) with every part
// of the background on and the pods' defaults.
const withBackground = tiny + `
background:
  pods: {}
  smallNodes: {fraction: 0.3}
  cpuMembers: {fraction: 0.5, cpu: "2"}
`

func TestBackgroundDefaults(t *testing.T) {
	b := mustParse(t, withBackground).Background
	p := b.Pods
	if *p.Agents != 2 || *p.Services != 1 || p.ServiceReplicas != 4 || *p.PDBFraction != 0.5 || *p.PDBMaxUnavailable != 1 ||
		p.CPU != "250m" || p.Memory != "512Mi" {
		t.Errorf("pods defaults = agents %d, services %d, replicas %d, pdbFraction %g, maxUnavailable %d, %s, %s",
			*p.Agents, *p.Services, p.ServiceReplicas, *p.PDBFraction, *p.PDBMaxUnavailable, p.CPU, p.Memory)
	}
	if b.SmallNodes.GPUs != 4 || b.SmallNodes.Fraction != 0.3 {
		t.Errorf("smallNodes = %+v, want 0.3 of the nodes with 4 GPUs (half of 8)", *b.SmallNodes)
	}
	if *b.CPUMembers.Fraction != 0.5 || b.CPUMembers.CPU != "2" || b.CPUMembers.Memory != "16Gi" {
		t.Errorf("cpuMembers = %g, %s, %s", *b.CPUMembers.Fraction, b.CPUMembers.CPU, b.CPUMembers.Memory)
	}
	// An explicit 0 is kept, not replaced by the default.
	z := mustParse(t, tiny+"background:\n  pods: {agents: 0, pdbFraction: 0, pdbMaxUnavailable: 0}\n").Background.Pods
	if *z.Agents != 0 || *z.Services != 1 || *z.PDBFraction != 0 || *z.PDBMaxUnavailable != 0 {
		t.Errorf("explicit zeros: agents %d, services %d, pdbFraction %g, maxUnavailable %d", *z.Agents, *z.Services, *z.PDBFraction, *z.PDBMaxUnavailable)
	}
}

// Bad background input is refused with an error that names the field.
func TestBackgroundRejects(t *testing.T) {
	for name, tc := range map[string]struct{ block, field string }{
		"empty block":          {"background: {}", "at least one of pods, smallNodes, cpuMembers"},
		"unknown field":        {"background: {pods: {agent: 1}}", "agent"},
		"negative agents":      {"background: {pods: {agents: -1}}", "background.pods.agents"},
		"no pods per node":     {"background: {pods: {agents: 0, services: 0}}", "agents + services"},
		"bad pdbFraction":      {"background: {pods: {pdbFraction: 1.5}}", "background.pods.pdbFraction"},
		"negative budget":      {"background: {pods: {pdbMaxUnavailable: -1}}", "background.pods.pdbMaxUnavailable"},
		"replicas":             {"background: {pods: {serviceReplicas: -2}}", "background.pods.serviceReplicas"},
		"cpu not a quantity":   {"background: {pods: {cpu: lots}}", "background.pods.cpu"},
		"memory zero":          {"background: {pods: {memory: '0'}}", "background.pods.memory must be positive"},
		"every node small":     {"background: {smallNodes: {fraction: 1}}", "background.smallNodes.fraction"},
		"small not smaller":    {"background: {smallNodes: {gpus: 8}}", "background.smallNodes.gpus"},
		"cpu member fraction":  {"background: {cpuMembers: {fraction: -0.1}}", "background.cpuMembers.fraction"},
		"cpu member cpu":       {"background: {cpuMembers: {cpu: -1}}", "background.cpuMembers.cpu must be positive"},
		"cpu member memory":    {"background: {cpuMembers: {memory: 16GB!}}", "background.cpuMembers.memory"},
		"single-GPU nodes":     {"background: {smallNodes: {}}", "background.smallNodes.gpus"},
		"background not a map": {"background: realistic", "background"},
	} {
		t.Run(name, func(t *testing.T) {
			text := tiny + tc.block + "\n"
			if name == "single-GPU nodes" {
				text = strings.Replace(text, "gpusPerNode: 8", "gpusPerNode: 1", 1)
				text = strings.Replace(text, `"2*4x8", `, "", 1)
				text = strings.Replace(text, "{1: 1, 8: 1}", "{1: 1}", 1)
				text = strings.Replace(text, `"3x2"`, `"3x1"`, 1)
			}
			_, err := Parse([]byte(text))
			if err == nil {
				t.Fatalf("Parse accepted %s", tc.block)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %q", err, tc.field)
			}
		})
	}
}

func TestExpandBackground(t *testing.T) {
	s := mustParse(t, withBackground)
	p, err := s.Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	// floor(10 * 0.3) = 3 small nodes, spread over the racks of 4, 4 and 2
	// by the running share (1, 1, 1).
	small := map[string]int{}
	for _, n := range p.Nodes {
		switch n.GPUs {
		case 4:
			small[n.Rack]++
		case 8:
		default:
			t.Errorf("node %s has %d GPUs, want 8 or 4", n.Name, n.GPUs)
		}
	}
	if want := map[string]int{"rack-0": 1, "rack-1": 1, "rack-2": 1}; !reflect.DeepEqual(small, want) || p.SmallNodes() != 3 {
		t.Errorf("small nodes per rack = %v (%d), want %v", small, p.SmallNodes(), want)
	}
	if p.TotalGPUs() != 7*8+3*4 {
		t.Errorf("capacity %d GPUs, want %d", p.TotalGPUs(), 7*8+3*4)
	}

	// 3 pods per node (2 agents, 1 service pod); 10 service pods in
	// Deployments of 4, 4 and 2 on distinct nodes; floor(3 * 0.5) = 1 budget.
	if len(p.Background) != 30 {
		t.Fatalf("%d background pods, want 30", len(p.Background))
	}
	perNode := map[string]int{}
	names := map[string]bool{}
	deployNodes := map[string]map[string]bool{}
	covered := map[string]int{}
	for _, bp := range p.Background {
		perNode[bp.Node]++
		if names[bp.Name] {
			t.Errorf("pod name %s twice", bp.Name)
		}
		names[bp.Name] = true
		if bp.Name != BackgroundPodName(bp.App, bp.Node) {
			t.Errorf("pod %s is not named after its app %s and node %s", bp.Name, bp.App, bp.Node)
		}
		switch bp.Kind {
		case KindAgent:
			if bp.PDB != "" {
				t.Errorf("agent %s is covered by budget %s", bp.Name, bp.PDB)
			}
		case KindService:
			if deployNodes[bp.App] == nil {
				deployNodes[bp.App] = map[string]bool{}
			}
			if deployNodes[bp.App][bp.Node] {
				t.Errorf("deployment %s has two pods on %s", bp.App, bp.Node)
			}
			deployNodes[bp.App][bp.Node] = true
			if bp.PDB != "" {
				covered[bp.PDB]++
			}
		default:
			t.Errorf("pod %s of kind %q", bp.Name, bp.Kind)
		}
	}
	for _, n := range p.Nodes {
		if perNode[n.Name] != 3 {
			t.Errorf("node %s has %d background pods, want 3", n.Name, perNode[n.Name])
		}
	}
	var sizes []int
	for _, nodes := range deployNodes {
		sizes = append(sizes, len(nodes))
	}
	if len(deployNodes) != 3 || len(p.PDBs) != 1 {
		t.Fatalf("%d deployments (sizes %v), %d budgets; want 3 and 1", len(deployNodes), sizes, len(p.PDBs))
	}
	pdb := p.PDBs[0]
	if pdb.App != pdb.Name || pdb.Pods != len(deployNodes[pdb.App]) || covered[pdb.Name] != pdb.Pods || pdb.MaxUnavailable != 1 {
		t.Errorf("budget %+v covers %d pods; its deployment has %d", pdb, covered[pdb.Name], len(deployNodes[pdb.App]))
	}

	// round(23 * 0.5) = 12 jobs have one CPU-only member, named for it.
	withPS, pods := 0, 0
	for _, j := range p.Jobs {
		pods += j.Workers + j.CPUMembers
		switch j.CPUMembers {
		case 0:
			if strings.Contains(j.Name, "-ps") {
				t.Errorf("job %s without a CPU member is named like one", j.Name)
			}
		case 1:
			withPS++
			if !strings.HasSuffix(j.Name, "-ps1") {
				t.Errorf("job %s with a CPU member is not named -ps1", j.Name)
			}
		default:
			t.Errorf("job %s has %d CPU members", j.Name, j.CPUMembers)
		}
	}
	if withPS != 12 || p.CPUMemberJobs() != 12 || p.TotalPods() != pods {
		t.Errorf("%d jobs with a CPU member (CPUMemberJobs %d), want 12; TotalPods %d, want %d", withPS, p.CPUMemberJobs(), p.TotalPods(), pods)
	}
}

// The background is seeded: the same seed gives the same layout, another
// seed another; it never moves what a clean scenario's seed decides (spot
// nodes, jobs' shapes and times, reclaims).
func TestBackgroundIsSeeded(t *testing.T) {
	s := mustParse(t, withBackground)
	a, _ := s.Expand(3)
	b, _ := s.Expand(3)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two expansions with seed 3 differ")
	}
	c, _ := s.Expand(4)
	if reflect.DeepEqual(a.Background, c.Background) && reflect.DeepEqual(a.Nodes, c.Nodes) && reflect.DeepEqual(a.Jobs, c.Jobs) {
		t.Error("seeds 3 and 4 gave the same background")
	}
	clean, _ := mustParse(t, tiny).Expand(3)
	if len(clean.Background) != 0 || len(clean.PDBs) != 0 || clean.SmallNodes() != 0 || clean.CPUMemberJobs() != 0 {
		t.Errorf("a scenario without background got %d background pods, %d budgets, %d small nodes, %d jobs with CPU members",
			len(clean.Background), len(clean.PDBs), clean.SmallNodes(), clean.CPUMemberJobs())
	}
	if !reflect.DeepEqual(clean.Reclaims, a.Reclaims) {
		t.Error("the background moved the reclaims")
	}
	for i := range clean.Nodes {
		if clean.Nodes[i].Name != a.Nodes[i].Name || clean.Nodes[i].Spot != a.Nodes[i].Spot {
			t.Errorf("the background moved node %d: %+v vs %+v", i, clean.Nodes[i], a.Nodes[i])
		}
	}
	for i := range clean.Jobs {
		x, y := clean.Jobs[i], a.Jobs[i]
		if x.Workers != y.Workers || x.GPUs != y.GPUs || x.Submit != y.Submit || x.Duration != y.Duration || x.Policy != y.Policy {
			t.Errorf("the background changed job %d: %+v vs %+v", i, x, y)
		}
	}
}
