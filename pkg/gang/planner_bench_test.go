package gang

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchCluster is 5000 8-GPU nodes in 32-node racks over 4 zones, 20% spot,
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

func BenchmarkCompute5000Nodes(b *testing.B) {
	cluster := benchCluster(5000)
	for _, g := range []struct {
		members int
		gpus    int64
		policy  Policy
	}{
		{4, 1, PolicyAvoid}, {8, 8, PolicyAvoid}, {64, 8, PolicyAvoid}, {16, 4, PolicyPrefer}, {32, 2, PolicyForbid},
	} {
		b.Run(fmt.Sprintf("%dx%dgpu-%s", g.members, g.gpus, g.policy), func(b *testing.B) {
			req := request(gangOf(g.members, g.gpus), func(r *Request) { r.Policy = g.policy })
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Compute(req, cluster); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
