package kubectlmuster

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// benchCluster is 5000 nodes of 8 GPUs (5 zones, 50 racks of 100) and 10200
// muster pods: 1250 bound Jobs of 8 workers × 4 GPUs filling every node, 25
// pending Jobs of 8 workers × 8 GPUs (each required in one rack), every
// pending one with a GangUnschedulable Event. Explaining a pending Job takes
// the longest path: no plan, the closest rack, and the what-if plans of
// preemption (each bound Job frees 4 nodes, too few).
func benchCluster(b *testing.B) *fakeCluster {
	b.Helper()
	var objs []runtime.Object
	for _, n := range testobj.Cluster(50, 100, 5, 8) {
		objs = append(objs, n)
	}
	nodeName := func(i int) string { return fmt.Sprintf("r%d-n%d", i/100+1, i%100+1) }
	for j := range 1250 {
		jb := job(fmt.Sprintf("bound-%d", j), 8, 4).Obj()
		nodes := make([]string, 8)
		for w := range nodes {
			nodes[w] = nodeName((j*8 + w) / 2)
		}
		objs = append(objs, jb)
		objs = append(objs, podObjects(members(jb, 8, nodes...))...)
	}
	for j := range 25 {
		jb := job(fmt.Sprintf("pending-%d", j), 8, 8).PodAnnotation(gang.AnnotationTopologyRequired, "rack").Obj()
		objs = append(objs, jb)
		objs = append(objs, podObjects(unschedulable(members(jb, 8), "gang needs 8 members of 8 nvidia.com/gpu in one rack", testNow))...)
		e := gangEvent(jb.Name, "GangUnschedulable", "gang needs 8 members", testNow)
		objs = append(objs, &e)
	}
	return newFakeCluster(b, true, nil, objs...)
}

// Each command on the large cluster: one List per resource from the fake
// API server (which copies every object it returns) and the command's work.
func BenchmarkCommands(b *testing.B) {
	f := benchCluster(b)
	for _, args := range [][]string{
		{"gangs", "-A"},
		{"gangs", "-A", "-o", "json"},
		{"explain", "job/pending-17"},
		{"explain", "job/bound-3"},
		{"top"},
	} {
		b.Run(fmt.Sprint(args), func(b *testing.B) {
			// One run first, counting the API requests: at most one List
			// per resource.
			f.kube.ClearActions()
			f.dynamic.ClearActions()
			if _, stderr, err := f.run(testNS, args...); err != nil {
				b.Fatalf("%v: %v (%s)", args, err, stderr)
			}
			lists := map[string]int{}
			for _, a := range append(f.kube.Actions(), f.dynamic.Actions()...) {
				if a.GetVerb() == "list" {
					lists[a.GetResource().Resource]++
				}
			}
			total := 0
			for resource, n := range lists {
				if n > 1 {
					b.Errorf("%v lists %s %d times, want once", args, resource, n)
				}
				total += n
			}
			b.Logf("%v lists %v", args, sortedCounts(lists))
			for b.Loop() {
				if _, stderr, err := f.run(testNS, args...); err != nil {
					b.Fatalf("%v: %v (%s)", args, err, stderr)
				}
			}
			f.kube.ClearActions()
			f.dynamic.ClearActions()
			b.ReportMetric(float64(total), "lists/op")
		})
	}
}

func sortedCounts(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
