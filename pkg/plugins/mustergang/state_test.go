package mustergang

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

// PostFilter of a planned member whose PreFilter state has the wrong type
// says so instead of taking it for a member rejected before muster's
// PreFilter ran; the plan is dropped either way.
func TestPostFilterReportsUnreadableState(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b})
	_, plan := f.planAndWait(t, a)
	state := framework.NewCycleState()
	state.Write(stateKey, dryRunMarker{})
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set(plan.Slots[b.UID], fwk.NewStatus(fwk.Unschedulable, "node(s) had volume node affinity conflict"))

	_, st := f.plugin.PostFilter(context.Background(), state, b, statuses)
	assert.Contains(t, st.Message(), "PreFilter state is unreadable")
	key, _ := gang.KeyOf(a)
	assert.Nil(t, f.plugin.gangs.Plan(key), "the broken plan was kept")
}

func TestCycleStateClone(t *testing.T) {
	s := &cycleState{slot: "node-1", planID: 7, key: gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "a"}, policy: gang.PolicyPrefer}
	cs := framework.NewCycleState()
	cs.Write(stateKey, s)
	got, err := readState(cs.Clone())
	if err != nil || got.slot != "node-1" || got.planID != 7 || got.policy != gang.PolicyPrefer || got.key != s.key {
		t.Fatalf("cloned state = %+v, %v; want %+v", got, err, s)
	}
	if _, err := readState(framework.NewCycleState()); err == nil {
		t.Errorf("empty cycle state yields state")
	}
}
