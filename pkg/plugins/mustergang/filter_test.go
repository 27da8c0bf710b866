package mustergang

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
)

func TestLonePodStaysOffHeldCapacity(t *testing.T) {
	// A gang's plan holds its members' slots while they come to Permit; a
	// pod scheduled alone asking for one GPU is kept off every node whose
	// free GPUs the plan holds, and only those.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	lone := testobj.MakePod("ns", "lone").UID("lone").SchedulerName("muster").
		Container(testobj.MakeContainer("c").GPUs(1).Obj()).Obj()
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, []*v1.Pod{a, b, lone})
	f.planAndWait(t, a)
	held := f.plugin.gangs.Held()
	if len(held) == 0 {
		t.Fatal("the gang's plan holds no capacity")
	}
	state, status := f.preFilter(t, lone)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of the lone pod: %v", status)
	}
	for _, ni := range f.nodes {
		st := f.plugin.Filter(context.Background(), state, lone, ni)
		if name := ni.Node().Name; held[name].Scalars["nvidia.com/gpu"] > 0 {
			assert.Equal(t, fwk.Unschedulable, st.Code(), "node %s, held for the gang", name)
			assert.Contains(t, st.Message(), "capacity held")
		} else {
			assert.True(t, st.IsSuccess(), "node %s: %v", name, st)
		}
	}
}
