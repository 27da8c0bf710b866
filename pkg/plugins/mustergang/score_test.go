package mustergang

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// PreScore skips Score only when Score would rank every feasible node
// alike; with spot and on-demand nodes among them, a pod alone is scored
// by its policy.
func TestPreScoreSkipsOnlyUniformNodes(t *testing.T) {
	onDemand := []*v1.Node{gpuNode("a", 8), gpuNode("b", 8)}
	spot := testobj.MakeNode("s").GPUs(8).Spot().Obj()
	f := newTestFramework(t, 0, append(onDemand, spot), nil)
	ctx := context.Background()
	infos := map[string]fwk.NodeInfo{}
	for _, ni := range f.nodes {
		infos[ni.Node().Name] = ni
	}
	pod := func(policy string) *v1.Pod {
		w := testobj.MakePod("ns", "p-"+policy).UID("p-" + policy).SchedulerName("muster").
			Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj())
		if policy != "" {
			w.Annotation(gang.AnnotationPreemptible, policy)
		}
		return w.Obj()
	}
	for _, c := range []struct {
		policy string
		nodes  []string
		skip   bool
	}{
		{"", []string{"a", "b"}, true},
		{"", []string{"a", "b", "s"}, false},
		{"prefer", []string{"a", "s"}, false},
		{"prefer", []string{"s"}, true},
		{"forbid", []string{"a", "b"}, true},
	} {
		state, status := f.preFilter(t, pod(c.policy))
		if !status.IsSuccess() {
			t.Fatalf("PreFilter: %v", status)
		}
		var nodes []fwk.NodeInfo
		for _, n := range c.nodes {
			nodes = append(nodes, infos[n])
		}
		got := f.plugin.PreScore(ctx, state, pod(c.policy), nodes)
		if got.IsSkip() != c.skip || !(got.IsSuccess() || got.IsSkip()) {
			t.Errorf("policy %q on %v: PreScore %v, want skip=%v", c.policy, c.nodes, got, c.skip)
		}
		if !c.skip {
			spotScore, _ := f.plugin.Score(ctx, state, pod(c.policy), infos["s"])
			onDemandScore, _ := f.plugin.Score(ctx, state, pod(c.policy), infos["a"])
			if spotScore == onDemandScore {
				t.Errorf("policy %q: spot and on-demand nodes both score %d", c.policy, spotScore)
			}
		}
	}
}
