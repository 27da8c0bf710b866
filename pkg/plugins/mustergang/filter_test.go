package mustergang

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
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
	held := f.plugin.gangs.Held(gang.AnyPriority)
	if len(held) == 0 {
		t.Fatal("the gang's plan holds no capacity")
	}
	state, status := f.preFilter(t, lone)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter of the lone pod: %v", status)
	}
	for _, ni := range f.nodes {
		st := f.plugin.Filter(context.Background(), state, lone, ni)
		if name := ni.Node().Name; len(held[name]) > 0 {
			assert.Equal(t, fwk.Unschedulable, st.Code(), "node %s, held for the gang", name)
			assert.Contains(t, st.Message(), "capacity held")
		} else {
			assert.True(t, st.IsSuccess(), "node %s: %v", name, st)
		}
	}
}

func TestNominatedMemberIsNotHeldTwice(t *testing.T) {
	// The framework's first filter pass adds nominated pods of equal or
	// higher priority to the node: a nominated member not yet reserved is
	// then in the NodeInfo, and its holding must not be subtracted again.
	a, b := worker("j", 0, 6, ""), worker("j", 1, 6, "")
	lone := func(name string, gpus int64) *v1.Pod {
		return testobj.MakePod("ns", name).UID(name).SchedulerName("muster").
			Container(testobj.MakeContainer("c").GPUs(gpus).Obj()).Obj()
	}
	fits, tooBig := lone("fits", 2), lone("too-big", 3)
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b, fits, tooBig})
	_, plan := f.planAndWait(t, a)
	slot := plan.Slots[b.UID]
	f.queue.AddNominatedPod(klog.Background(), podInfos(t, b)[0], &fwk.NominatingInfo{NominatedNodeName: slot, NominatingMode: fwk.ModeOverride})
	var ni fwk.NodeInfo
	for _, n := range f.nodes {
		if n.Node().Name == slot {
			ni = n
		}
	}
	for _, c := range []struct {
		pod  *v1.Pod
		want fwk.Code
	}{{fits, fwk.Success}, {tooBig, fwk.Unschedulable}} {
		state, status := f.preFilter(t, c.pod)
		if !status.IsSuccess() {
			t.Fatalf("PreFilter of %s: %v", c.pod.Name, status)
		}
		st := f.fw.RunFilterPluginsWithNominatedPods(context.Background(), state, c.pod, ni)
		assert.Equal(t, c.want, st.Code(), "%s on %s, 6 of its 8 GPUs held for nominated %s: %v", c.pod.Name, slot, b.Name, st)
	}
}
