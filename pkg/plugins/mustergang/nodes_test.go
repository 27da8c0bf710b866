package mustergang

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeunschedulable"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

// twoNodeViewsFramework is a framework over two 8-GPU nodes and their
// NodeInfos, which a test changes as the snapshot would.
func twoNodeViewsFramework(t *testing.T) (*testFramework, *framework.NodeInfo, *framework.NodeInfo) {
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil)
	n1, n2 := framework.NewNodeInfo(), framework.NewNodeInfo()
	n1.SetNode(gpuNode("n1", 8))
	n2.SetNode(gpuNode("n2", 8))
	return f, n1, n2
}

// TestNodeViewsFollowNodeInfoChanges: a node's view is reused while its
// NodeInfo is unchanged and recomputed when a pod lands on it; the snapshot
// generation is the highest NodeInfo's; capacity held for other gangs is
// subtracted from the right node without touching the kept views, and
// each subtraction starts from the views, not from the last one.
func TestNodeViewsFollowNodeInfoChanges(t *testing.T) {
	f, n1, n2 := twoNodeViewsFramework(t)
	nodes := []fwk.NodeInfo{n1, n2}
	gpus := func(views []gang.NodeView) []int64 {
		var out []int64
		for _, v := range views {
			out = append(out, v.Free.Scalars[configv1.DefaultGPUResourceName])
		}
		return out
	}

	views, generation := f.plugin.nodes.views(nodes, nil)
	assert.Equal(t, []int64{8, 8}, gpus(views))
	assert.Equal(t, max(n1.GetGeneration(), n2.GetGeneration()), generation)

	held := map[string]gang.Resources{"n2": {Scalars: map[v1.ResourceName]int64{configv1.DefaultGPUResourceName: 3}}}
	assert.Equal(t, []int64{8, 5}, gpus(f.plugin.nodes.subtractHeld(views, held)), "held capacity subtracted from its node")
	views, _ = f.plugin.nodes.views(nodes, nil)
	assert.Equal(t, []int64{8, 8}, gpus(views), "the kept views were not changed by the subtraction")
	other := map[string]gang.Resources{"n1": {Scalars: map[v1.ResourceName]int64{configv1.DefaultGPUResourceName: 2}}}
	assert.Equal(t, []int64{6, 8}, gpus(f.plugin.nodes.subtractHeld(views, other)), "the last subtraction is undone before the next")

	n2.AddPod(worker("other", 0, 2, "n2"))
	views, generation = f.plugin.nodes.views(nodes, nil)
	assert.Equal(t, []int64{8, 6}, gpus(views), "a pod added to the node is seen")
	assert.Equal(t, n2.GetGeneration(), generation, "the changed node raises the generation")

	// The list reordered (a node left and came back): positions follow.
	views, _ = f.plugin.nodes.views([]fwk.NodeInfo{n2, n1}, nil)
	assert.Equal(t, []int64{3, 8}, gpus(f.plugin.nodes.subtractHeld(views, held)), "held found at the node's new position")
}

// Forgetting the nodes that left (the kept views grew past twice the
// cluster, as spot nodes with new names come and go) keeps every node of
// the snapshot findable: capacity held on a node whose NodeInfo did not
// change is still subtracted.
func TestNodeViewsForgetOnlyNodesThatLeft(t *testing.T) {
	f, n1, n2 := twoNodeViewsFramework(t)
	nodes := []fwk.NodeInfo{n1, n2}
	views, _ := f.plugin.nodes.views(nodes, nil)
	for i := range 2*len(nodes) + 1025 {
		f.plugin.nodes.kept[fmt.Sprintf("gone-%d", i)] = cachedView{pos: -1}
	}
	views, _ = f.plugin.nodes.views(nodes, nil)
	assert.Len(t, f.plugin.nodes.kept, 2, "the nodes that left are forgotten")
	held := map[string]gang.Resources{"n2": {Scalars: map[v1.ResourceName]int64{configv1.DefaultGPUResourceName: 3}}}
	out := f.plugin.nodes.subtractHeld(views, held)
	assert.Equal(t, int64(5), out[1].Free.Scalars[configv1.DefaultGPUResourceName], "capacity held on an unchanged node")
}

// TestCordonIsDecidedOnce: a cordoned node is the framework's
// NodeUnschedulable filter's to refuse (muster's Filter, with the default
// reclaim taints, does not re-check it), the planner leaves it out, and so
// preemption finds nothing to evict for: the one lower-priority pod runs
// only there.
func TestCordonIsDecidedOnce(t *testing.T) {
	cordoned := gpuNode("n1", 8)
	cordoned.Spec.Unschedulable = true // and the taint the node controller adds with it
	cordoned.Spec.Taints = append(cordoned.Spec.Taints, v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule})
	low := worker("low", 0, 8, "n1")
	low.Spec.Priority = ptr.To[int32](1)
	low.OwnerReferences[0].Name = "low"
	high := worker("j", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	lone := worker("lone", 0, 0, "")
	lone.OwnerReferences = nil
	f := newTestFramework(t, 1, []*v1.Node{cordoned}, []*v1.Pod{low, high, lone})

	state, status := f.preFilter(t, lone)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of a pod scheduled alone: %v", status)
	}
	ni, err := f.fw.SnapshotSharedLister().NodeInfos().Get("n1")
	if err != nil {
		t.Fatal(err)
	}
	if status := f.fw.RunFilterPlugins(context.Background(), state, lone, ni); status.IsSuccess() || status.Plugin() != nodeunschedulable.Name {
		t.Errorf("Filter on the cordoned node: %v (plugin %q), want NodeUnschedulable's refusal", status, status.Plugin())
	}
	if status := f.plugin.Filter(context.Background(), state, lone, ni); !status.IsSuccess() {
		t.Errorf("muster's Filter re-checks the cordon: %v", status)
	}

	state, status = f.preFilter(t, high)
	if status.IsSuccess() || !contains(status.Message(), "cordoned") {
		t.Fatalf("PreFilter with the only node cordoned: %v, want the planner to leave it out", status)
	}
	f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	key, _ := gang.KeyOf(high)
	if plan := f.plugin.gangs.Plan(key); plan != nil {
		t.Errorf("plan %+v: preempted on a cordoned node", plan)
	}
}
