package gang

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchCluster is nodes 8-GPU nodes in 32-node racks over 4 zones, 20% spot,
// with GPUs already used at random (fixed seed), like a busy cluster.
func benchCluster(nodes int) []NodeView {
	rng := rand.New(rand.NewPCG(1, 2))
	var tn []testNode
	for i := range nodes {
		rack := fmt.Sprintf("r%d", i/32)
		tn = append(tn, testNode{name: fmt.Sprintf("%s-n%d", rack, i%32), rack: rack, used: int64(rng.IntN(9)), spot: rng.IntN(5) == 0})
	}
	v := views(tn...)
	for i := range v {
		v[i].Node.Labels["topology.kubernetes.io/zone"] = fmt.Sprintf("z%d", (i/32)%4)
	}
	return v
}

// BenchmarkCompute plans one gang over a busy cluster: the planner's whole
// cost per gang (members after the first only look up their slot).
func BenchmarkCompute(b *testing.B) {
	for _, n := range []int{1000, 5000, 15000} {
		cluster := benchCluster(n)
		for _, g := range []struct {
			members int
			gpus    int64
			policy  Policy
		}{
			{4, 1, PolicyAvoid}, {8, 8, PolicyAvoid}, {64, 8, PolicyAvoid}, {16, 4, PolicyPrefer}, {32, 2, PolicyForbid},
		} {
			benchGang(b, fmt.Sprintf("nodes=%d/%dx%dgpu-%s", n, g.members, g.gpus, g.policy), cluster, g.members, g.gpus, g.policy)
		}
	}
}

func benchGang(b *testing.B, name string, cluster []NodeView, members int, gpus int64, policy Policy) {
	b.Run(name, func(b *testing.B) {
		// The index lives as long as the scheduler profile, as in the plugin.
		req := request(gangOf(members, gpus), func(r *Request) { r.Policy = policy; r.Topology = NewTopologyIndex(r.Levels) })
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Compute(req, cluster); err != nil {
				b.Fatal(err)
			}
		}
	})
}
