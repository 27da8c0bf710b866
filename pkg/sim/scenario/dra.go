package scenario

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// DRA serves the GPUs of a share of the nodes by dynamic resource
// allocation instead of the device plugin, as a cluster running NVIDIA's
// DRA driver does:
//
//	cluster:
//	  dra: {fraction: 1}     # every node; 0.5: half of them (a mixed cluster)
//
// A DRA node advertises no nvidia.com/gpu in its capacity or allocatable;
// it publishes one ResourceSlice (driver gpu.nvidia.com, pool named after
// the node) with one device per GPU it has. The cluster has the DeviceClass
// gpu.nvidia.com, which selects the driver's devices and whose
// spec.extendedResourceName is nvidia.com/gpu: the workers' plain
// `nvidia.com/gpu` requests are unchanged and are served from the devices
// on a DRA node (kube-scheduler's DynamicResources plugin allocates them,
// in a ResourceClaim it creates per pod at PreBind) and from allocatable on
// the other nodes. Which nodes are DRA nodes is spread evenly over the
// racks and seeded, as spot nodes are.
type DRA struct {
	// Fraction of the nodes, in (0, 1] (default 1: every node). Rounded
	// down; a fraction that rounds to no node is refused.
	Fraction float64 `json:"fraction,omitempty"`
}

func (d *DRA) defaults() {
	if d.Fraction == 0 {
		d.Fraction = 1
	}
}

func (d *DRA) validate(c Cluster) error {
	if d.Fraction <= 0 || d.Fraction > 1 {
		return fmt.Errorf("cluster.dra.fraction must be in (0, 1], got %g", d.Fraction)
	}
	if int(math.Floor(float64(c.Nodes)*d.Fraction)) < 1 {
		return fmt.Errorf("cluster.dra.fraction %g of %d nodes is no node", d.Fraction, c.Nodes)
	}
	return nil
}

// draNodes marks the nodes whose GPUs DRA serves: every node, or a share
// spread evenly over racks, which ones in a rack seeded.
func (s *Scenario) draNodes(seed uint64, nodes []Node) {
	d := s.Cluster.DRA
	if d == nil {
		return
	}
	if d.Fraction >= 1 {
		for i := range nodes {
			nodes[i].DRA = true
		}
		return
	}
	rng := rand.New(rand.NewPCG(seed, streamDRA))
	for _, i := range spreadOverRacks(rng, nodes, d.Fraction) {
		nodes[i].DRA = true
	}
}

// DRANodes counts the nodes whose GPUs DRA serves.
func (p *Plan) DRANodes() int {
	n := 0
	for _, node := range p.Nodes {
		if node.DRA {
			n++
		}
	}
	return n
}
