package mustergang

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// BenchmarkPlanGang is the whole cost of planning one gang in its first
// member's PreFilter, as the scheduler pays it: node views, the planner,
// and the profile's own filters confirming every choice. Workers are plain
// (as in examples/ and the simulator) or carry a one-per-node pod
// anti-affinity ("-onepernode"), for which InterPodAffinity's PreFilter
// reads every node once per member. The cluster is empty 8-GPU nodes in
// 32-node racks; the plan is forgotten after each iteration so every
// iteration plans afresh.
func BenchmarkPlanGang(b *testing.B) {
	for _, n := range []int{1000, 5000, 15000} {
		nodes := make([]*v1.Node, n)
		for i := range nodes {
			nodes[i] = testobj.MakeNode(fmt.Sprintf("n%05d", i)).GPUs(8).
				Rack(fmt.Sprintf("r%d", i/32)).Zone(fmt.Sprintf("z%d", i/32%4)).Obj()
		}
		for _, g := range []struct {
			workers    int
			gpus       int64
			onePerNode bool
		}{{8, 8, false}, {64, 8, false}, {8, 1, false}, {8, 1, true}, {64, 8, true}} {
			name := fmt.Sprintf("nodes=%d/%dx%dgpu", n, g.workers, g.gpus)
			if g.onePerNode {
				name += "-onepernode"
			}
			b.Run(name, func(b *testing.B) {
				pods := make([]*v1.Pod, g.workers)
				for i := range pods {
					pods[i] = worker("j", i, g.gpus, "")
					if !g.onePerNode {
						pods[i].Spec.Affinity = nil
					}
				}
				f := newTestFramework(b, int32(g.workers), nodes, pods)
				key, _ := gang.KeyOf(pods[0])
				b.ReportAllocs()
				for b.Loop() {
					if _, status := f.preFilter(b, pods[0]); !status.IsSuccess() {
						b.Fatalf("PreFilter: %v", status)
					}
					f.plugin.registry.Forget(key)
				}
			})
		}
	}
}
