package mustergang

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

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
	forEachPlanCase(b, func(b *testing.B, f *testFramework, pods []*v1.Pod) {
		key, _ := gang.KeyOf(pods[0])
		// One plan first, as a running scheduler has made: the caches
		// kept between plans (node views, DRA slices matched to classes)
		// are warm.
		if _, status := f.preFilter(b, pods[0]); !status.IsSuccess() {
			b.Fatalf("PreFilter: %v", status)
		}
		f.plugin.gangs.Forget(key, t0)
		b.ReportAllocs()
		for b.Loop() {
			if _, status := f.preFilter(b, pods[0]); !status.IsSuccess() {
				b.Fatalf("PreFilter: %v", status)
			}
			f.plugin.gangs.Forget(key, t0)
		}
	})
}

// BenchmarkFilterCheck is, for the same cases, muster's filter check of a
// perfect guess alone: per member, its PodInfo (affinity terms, requests),
// the profile's PreFilter plugins (muster's own skipped, as in a dry run),
// its Filter plugins on the node the plan chose, and the member added to a
// copy of that node's NodeInfo. It is muster's own dry run, which the
// members' scheduling cycles repeat, not a lower bound for any scheduler on
// this framework. BenchmarkPlanGang's excess over it is the planner's own
// work and the dry runs of choices it did not keep. (It was named
// BenchmarkFrameworkFloor.)
func BenchmarkFilterCheck(b *testing.B) {
	forEachPlanCase(b, func(b *testing.B, f *testFramework, pods []*v1.Pod) {
		key, _ := gang.KeyOf(pods[0])
		if _, status := f.preFilter(b, pods[0]); !status.IsSuccess() {
			b.Fatalf("PreFilter: %v", status)
		}
		slots := f.plugin.gangs.Plan(key).Slots
		f.plugin.gangs.Forget(key, t0)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			copies := map[string]fwk.NodeInfo{}
			for _, pod := range pods {
				info, err := framework.NewPodInfo(pod)
				if err != nil {
					b.Fatal(err)
				}
				info.CalculateResource()
				state := framework.NewCycleState()
				state.Write(dryRunKey, dryRunMarker{})
				if _, status, _ := f.fw.RunPreFilterPlugins(ctx, state, pod); !status.IsSuccess() && !status.IsSkip() {
					b.Fatalf("PreFilter: %v", status)
				}
				node := slots[pod.UID]
				ni := copies[node]
				if ni == nil {
					orig, err := f.fw.SnapshotSharedLister().NodeInfos().Get(node)
					if err != nil {
						b.Fatal(err)
					}
					ni = orig.Snapshot()
					copies[node] = ni
				}
				if status := f.fw.RunFilterPlugins(ctx, state, pod, ni); !status.IsSuccess() {
					b.Fatalf("Filter on %s: %v", node, status)
				}
				ni.AddPodInfo(placedInfo(info, node))
			}
		}
	})
}

// forEachPlanCase runs bench over empty 8-GPU nodes in 32-node racks for
// each cluster size and gang shape. At 5000 nodes the GPUs are also served
// by dynamic resource allocation ("-dra": no nvidia.com/gpu allocatable,
// one 8-device ResourceSlice per node, a DeviceClass with
// extendedResourceName nvidia.com/gpu), with the real DynamicResources
// plugin in the profile.
func forEachPlanCase(b *testing.B, bench func(b *testing.B, f *testFramework, pods []*v1.Pod)) {
	for _, c := range []struct {
		n   int
		dra bool
	}{{1000, false}, {5000, false}, {5000, true}, {15000, false}} {
		n := c.n
		nodes := make([]*v1.Node, n)
		var extra []runtime.Object
		for i := range nodes {
			name := fmt.Sprintf("n%05d", i)
			node := testobj.MakeNode(name).Rack(fmt.Sprintf("r%d", i/32)).Zone(fmt.Sprintf("z%d", i/32%4))
			if c.dra {
				extra = append(extra, gpuSlice(name, "a100", "a100", "a100", "a100", "a100", "a100", "a100", "a100"))
			} else {
				node.GPUs(8)
			}
			nodes[i] = node.Obj()
		}
		if c.dra {
			extra = append(extra, gpuClass())
		}
		cluster := fmt.Sprintf("nodes=%d", n)
		if c.dra {
			cluster += "-dra"
		}
		for _, g := range []struct {
			workers    int
			gpus       int64
			onePerNode bool
		}{{8, 8, false}, {64, 8, false}, {8, 1, false}, {8, 1, true}, {64, 8, true}} {
			name := fmt.Sprintf("%s/%dx%dgpu", cluster, g.workers, g.gpus)
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
				bench(b, newTestFrameworkWith(b, int32(g.workers), nodes, pods, extra...), pods)
			})
		}
	}
}
