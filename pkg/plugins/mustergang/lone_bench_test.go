package mustergang

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/muster-sched/muster/internal/testobj"
)

// BenchmarkLonePodFilterScore is what MusterGang adds to the scheduling of a
// pod that is no gang (upstream's SchedulingBasic is 5000 nodes of such
// pods): after its PreFilter, its Filter on every node of a 5000-node
// cluster, then PreScore and, unless PreScore skips it, Score on every
// node. With a quarter of the nodes spot ("mixed") Score runs; with none
// ("on-demand") PreScore skips it. ns/node is the cost per node.
func BenchmarkLonePodFilterScore(b *testing.B) {
	for _, c := range []struct {
		name      string
		spotEvery int
	}{{"mixed", 4}, {"on-demand", 0}} {
		b.Run(c.name, func(b *testing.B) { benchLonePod(b, c.spotEvery) })
	}
}

func benchLonePod(b *testing.B, spotEvery int) {
	nodes := make([]*v1.Node, 5000)
	for i := range nodes {
		n := testobj.MakeNode(fmt.Sprintf("n%05d", i)).Rack(fmt.Sprintf("r%d", i/32)).GPUs(8)
		if spotEvery > 0 && i%spotEvery == 0 {
			n.Spot()
		}
		nodes[i] = n.Obj()
	}
	f := newTestFramework(b, 0, nodes, nil)
	pod := testobj.MakePod("ns", "lone").UID("lone").SchedulerName("muster").
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj()).Obj()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		state, status := f.preFilter(b, pod)
		if !status.IsSuccess() {
			b.Fatalf("PreFilter: %v", status)
		}
		for _, ni := range f.nodes {
			if status := f.plugin.Filter(ctx, state, pod, ni); !status.IsSuccess() {
				b.Fatalf("Filter on %s: %v", ni.Node().Name, status)
			}
		}
		if status := f.plugin.PreScore(ctx, state, pod, f.nodes); status.IsSkip() {
			continue
		} else if !status.IsSuccess() {
			b.Fatalf("PreScore: %v", status)
		}
		for _, ni := range f.nodes {
			if _, status := f.plugin.Score(ctx, state, pod, ni); !status.IsSuccess() {
				b.Fatalf("Score on %s: %v", ni.Node().Name, status)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(nodes)), "ns/node")
}
