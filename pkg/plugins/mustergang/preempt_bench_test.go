package mustergang

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// BenchmarkVictimSearch is one gang preemption's search (no eviction): a
// 2x8-GPU gang of priority 100 on a cluster of 5000 8-GPU nodes (32 per
// rack) that low-priority 2x8 gangs fill, with cpuPods priority-0 CPU pods
// on every node beside them, as node agents and services run on a real
// cluster. dryruns/op is how many plans the search tried.
func BenchmarkVictimSearch(b *testing.B) {
	const nodesN = 5000
	for _, cpuPerNode := range []int{0, 30} {
		b.Run(fmt.Sprintf("nodes=%d/cpuPods=%d", nodesN, cpuPerNode), func(b *testing.B) {
			nodes := make([]*v1.Node, nodesN)
			var pods []*v1.Pod
			for i := range nodes {
				name := fmt.Sprintf("n%05d", i)
				nodes[i] = testobj.MakeNode(name).GPUs(8).Rack(fmt.Sprintf("r%d", i/32)).Obj()
				low := worker(fmt.Sprintf("low-%04d", i/2), i%2, 8, name)
				low.Spec.Priority = ptr.To[int32](1)
				pods = append(pods, low)
				pods = append(pods, cpuPods(name, cpuPerNode)...)
			}
			high := []*v1.Pod{worker("j", 0, 8, ""), worker("j", 1, 8, "")}
			for _, p := range high {
				p.Spec.Priority = ptr.To[int32](100)
			}
			f := newTestFramework(b, 2, nodes, append(pods, high...))
			ctx := context.Background()
			info, _, err := f.plugin.source.resolve(high[0])
			if err != nil {
				b.Fatal(err)
			}
			gr, r := f.plugin.prepareGang(ctx, high[0], info, f.planning(b, info.Key))
			if r != nil {
				b.Fatal(r.Message)
			}
			checks := 0
			b.ReportAllocs()
			for b.Loop() {
				found, err := f.plugin.searchVictims(ctx, gr, 100, info.Constraints.Policy)
				if err != nil || found.Choice.Units == nil {
					b.Fatalf("no victims found: %v", err)
				}
				checks += found.Checks
			}
			b.ReportMetric(float64(checks)/float64(b.N), "dryruns/op")
		})
	}
}

// BenchmarkLonePodVictimSearch is one preemption's search for a pod alone:
// priority 10, asking 3970m CPU (upstream scheduler_perf's
// default_preemption/PreemptionBasic), on 1000 nodes of 4 CPUs that four
// priority-0 pods of 900m fill. victims/op is how many pods it evicts.
func BenchmarkLonePodVictimSearch(b *testing.B) {
	var nodes []*v1.Node
	var pods []*v1.Pod
	for i := range 1000 {
		name := fmt.Sprintf("n%04d", i)
		nodes = append(nodes, testobj.MakeNode(name).CPU(resource.MustParse("4")).Memory(resource.MustParse("32Gi")).Obj())
		for j := range 4 {
			pod := fmt.Sprintf("low-%s-%d", name, j)
			pods = append(pods, testobj.MakePod("ns", pod).UID(pod).Created(t0).Node(name).
				Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("900m")).Request(v1.ResourceMemory, resource.MustParse("500Mi")).Obj()).Obj())
		}
	}
	high := testobj.MakePod("ns", "high").UID("high").Created(t0).SchedulerName("muster").Priority(10).
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("3970m")).Request(v1.ResourceMemory, resource.MustParse("500Mi")).Obj()).Obj()
	f := newTestFramework(b, 1, nodes, append(pods, high))
	ctx := context.Background()
	info := &gang.Resolved{Key: gang.LoneKey(high), Ask: gang.Ask{Quorum: 1}, Ref: gang.Reference(high)}
	gr, r := f.plugin.prepareGang(ctx, high, info, f.planning(b, info.Key))
	if r != nil {
		b.Fatal(r.Message)
	}
	checks, victims := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		found, err := f.plugin.searchVictims(ctx, gr, 10, info.Constraints.Policy)
		if err != nil || found.Choice.Units == nil {
			b.Fatalf("no victims found: %v", err)
		}
		checks += found.Checks
		victims += len(found.Pods)
	}
	b.ReportMetric(float64(checks)/float64(b.N), "dryruns/op")
	b.ReportMetric(float64(victims)/float64(b.N), "victims/op")
}

// planning is the gang's Planning from its manager, as PreFilter and
// PostFilter get it (its held room is read from the manager).
func (f *testFramework) planning(tb testing.TB, key gang.Key) *gang.Planning {
	tb.Helper()
	a := f.plugin.gangs.Admit(key, t0, f.clock.Now())
	if a.Planning == nil {
		tb.Fatalf("gang %s cannot plan now", key)
	}
	return a.Planning
}
