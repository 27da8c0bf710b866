package scenario

import (
	"strings"
	"testing"
)

func TestDRADefaultsAndRejects(t *testing.T) {
	s := mustParse(t, strings.Replace(tiny, "spotFraction: 0.3}", "spotFraction: 0.3, dra: {}}", 1))
	if s.Cluster.DRA == nil || s.Cluster.DRA.Fraction != 1 {
		t.Fatalf("cluster.dra = %+v, want fraction 1 by default", s.Cluster.DRA)
	}
	p, err := s.Expand(1)
	if err != nil {
		t.Fatal(err)
	}
	if p.DRANodes() != len(p.Nodes) {
		t.Errorf("%d of %d nodes are DRA nodes, want all", p.DRANodes(), len(p.Nodes))
	}
	for name, block := range map[string]string{
		"negative":      "dra: {fraction: -0.5}",
		"more than one": "dra: {fraction: 1.5}",
		"no node":       "dra: {fraction: 0.05}", // of 10 nodes
		"unknown field": "dra: {share: 0.5}",
	} {
		t.Run(name, func(t *testing.T) {
			text := strings.Replace(tiny, "spotFraction: 0.3}", "spotFraction: 0.3, "+block+"}", 1)
			_, err := Parse([]byte(text))
			if err == nil {
				t.Fatalf("Parse accepted %s", block)
			}
			if name != "unknown field" && !strings.Contains(err.Error(), "cluster.dra.fraction") {
				t.Errorf("error %q does not name cluster.dra.fraction", err)
			}
		})
	}
}

// A share of DRA nodes is spread over the racks, seeded, and moves neither
// the spot nodes nor the jobs (a stream of its own).
func TestDRANodesSpreadOverRacks(t *testing.T) {
	plain, err := mustParse(t, tiny).Expand(3)
	if err != nil {
		t.Fatal(err)
	}
	s := mustParse(t, strings.Replace(tiny, "spotFraction: 0.3}", "spotFraction: 0.3, dra: {fraction: 0.5}}", 1))
	p, err := s.Expand(3)
	if err != nil {
		t.Fatal(err)
	}
	if p.DRANodes() != 5 {
		t.Fatalf("%d DRA nodes, want 5 of 10", p.DRANodes())
	}
	perRack := map[string]int{}
	for i, n := range p.Nodes {
		if n.DRA {
			perRack[n.Rack]++
		}
		if plain.Nodes[i].Spot != n.Spot || plain.Nodes[i].GPUs != n.GPUs {
			t.Errorf("node %s changed with cluster.dra: %+v, was %+v", n.Name, n, plain.Nodes[i])
		}
	}
	// Racks of 4, 4 and 2 nodes: half of each.
	if perRack["rack-0"] != 2 || perRack["rack-1"] != 2 || perRack["rack-2"] != 1 {
		t.Errorf("DRA nodes per rack %v, want 2, 2, 1", perRack)
	}
	if len(p.Jobs) != len(plain.Jobs) || p.Jobs[5] != plain.Jobs[5] {
		t.Error("cluster.dra changed the jobs")
	}
	again, _ := s.Expand(3)
	other, _ := s.Expand(4)
	same, differs := true, false
	for i := range p.Nodes {
		same = same && again.Nodes[i].DRA == p.Nodes[i].DRA
		differs = differs || other.Nodes[i].DRA != p.Nodes[i].DRA
	}
	if !same || !differs {
		t.Errorf("DRA nodes: same seed same nodes %t, another seed other nodes %t; want both", same, differs)
	}
}
