package mustergang

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics/testutil"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/muster-sched/muster/pkg/gang"
)

func TestUnreserveOfWaitingMemberReleasesPlan(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, status := f.preFilter(t, a)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	slot := f.plugin.gangs.Plan(key).Slots[a.UID]
	if held := f.plugin.gangs.Held(gang.AnyPriority); len(held) != 2 {
		t.Errorf("the plan holds %v, want both nodes", held)
	}
	f.fw.RunReservePluginsReserve(context.Background(), state, a, slot)
	// Another plugin's Reserve fails after ours: the framework unreserves.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, slot)
	if f.plugin.gangs.Plan(key) != nil || len(f.plugin.gangs.Held(gang.AnyPriority)) != 0 {
		t.Error("Unreserve left the plan holding capacity")
	}
	if until := f.plugin.gangs.Admit(key, t0, f.clock.Now()).BackoffUntil; !until.After(f.clock.Now()) {
		t.Error("the gang does not back off")
	}
	// muster did not reject a: its own cycle failed on the node, so the
	// next plan does not put it there again.
	if !f.plugin.gangs.Avoided(key, f.clock.Now())[a.UID][slot] {
		t.Errorf("the failed pair (%s, %s) is not avoided", a.Name, slot)
	}
}

func TestPlanDeadlineReleasesWaitingMembers(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	_, plan := f.planAndWait(t, a)
	before, err := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropTimeout.String()))
	if err != nil {
		t.Fatal(err)
	}
	// b never reaches Permit before the gang's deadline.
	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()})
	st := f.fw.WaitOnPermit(context.Background(), a)
	if st.IsSuccess() || !contains(st.Message(), "timed out") {
		t.Errorf("waiting member ended with %v, want a rejection saying the gang timed out", st)
	}
	if f.plugin.gangs.Plan(key) != nil || len(f.plugin.gangs.Held(gang.AnyPriority)) != 0 {
		t.Error("the expired plan still holds capacity")
	}
	if after, _ := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropTimeout.String())); after != before+1 {
		t.Errorf("muster_gang_rejections_total{cause=timeout} went from %v to %v, want +1", before, after)
	}
}

// A member whose PreFilter state is missing (a bug) is never let through as
// if it were scheduled alone.
func TestMissingStateIsAnErrorNotALonePod(t *testing.T) {
	p := &Plugin{gangs: gang.NewManager()}
	state := framework.NewCycleState()
	pod := worker("j", 0, 8, "")
	if st, _ := p.Permit(context.Background(), state, pod, "n1"); st.Code() != fwk.Error {
		t.Errorf("Permit without state = %v, want Error", st)
	}
	if st := p.Reserve(context.Background(), state, pod, "n1"); st.Code() != fwk.Error {
		t.Errorf("Reserve without state = %v, want Error", st)
	}
}

// secondMemberReserved is a gang of two 8-GPU workers on two nodes that
// also run priority-0 CPU pods, as on a real cluster: the first member
// waits at Permit, the second (b) is reserved at its slot.
func secondMemberReserved(t *testing.T) (f *testFramework, b *v1.Pod, key gang.Key, plan *gang.ActivePlan, state fwk.CycleState, slot string) {
	t.Helper()
	a := worker("j", 0, 8, "")
	b = worker("j", 1, 8, "")
	pods := append([]*v1.Pod{a, b}, append(cpuPods("n1", 5), cpuPods("n2", 5)...)...)
	f = newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, pods)
	key, _ = gang.KeyOf(a)
	_, plan = f.planAndWait(t, a)
	state, status := f.preFilter(t, b)
	require.True(t, status.IsSuccess(), "PreFilter of b: %v", status)
	slot = plan.Slots[b.UID]
	require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, b, slot).IsSuccess())
	return f, b, key, plan, state, slot
}

// The last member reaches Permit just after the plan's deadline, before
// the deadline's timer fired: the plan times out there, as the timer would
// have done it. The late member is not taken for a node's refusal: its
// pair is not avoided and no rejection is counted.
func TestLateArrivalTimesThePlanOut(t *testing.T) {
	f, b, key, plan, state, slot := secondMemberReserved(t)

	// The timer is late: it has not fired when b arrives.
	f.plugin.timers.cancel(planDeadline(plan.ID))
	f.clock.SetTime(plan.Deadline)
	timeoutsBefore, err := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropTimeout.String()))
	require.NoError(t, err)
	rejectedBefore, err := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropRejected.String()))
	require.NoError(t, err)

	_, st := f.fw.RunPermitPlugins(context.Background(), state, b, slot)
	require.Equal(t, fwk.Unschedulable, st.Code(), "Permit of the late member: %v", st)
	f.fw.RunReservePluginsUnreserve(context.Background(), state, b, slot)

	waited := f.fw.WaitOnPermit(context.Background(), worker("j", 0, 8, "")) // the waiting member, a
	assert.Contains(t, waited.Message(), "timed out", "the waiting member is rejected because the gang timed out")
	assert.Nil(t, f.plugin.gangs.Plan(key))
	assert.Empty(t, f.plugin.gangs.Held(gang.AnyPriority))
	assert.Empty(t, f.plugin.gangs.Avoided(key, f.clock.Now()), "no node refused a member")
	timeoutsAfter, _ := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropTimeout.String()))
	assert.Equal(t, timeoutsBefore+1, timeoutsAfter, `muster_gang_rejections_total{cause="timeout"}`)
	rejectedAfter, _ := testutil.GetCounterMetricValue(rejections.WithLabelValues(gang.DropRejected.String()))
	assert.Equal(t, rejectedBefore, rejectedAfter, "rejections counted with cause rejected")
}

// A worker whose binding fails after its gang was released (the API server
// refused it) is placed again at once, alone, beside its sibling that is
// binding: no backoff, and the gang is not reported Bound meanwhile.
func TestFailedBindingAfterReleaseIsPlacedAgainAtOnce(t *testing.T) {
	f, b, key, _, state, slot := secondMemberReserved(t)
	_, st := f.fw.RunPermitPlugins(context.Background(), state, b, slot)
	require.True(t, st.IsSuccess(), "the last member's Permit releases the gang: %v", st)
	require.Equal(t, gang.PhasePermitted, f.plugin.gangs.Phase(key))

	// b's binding fails; a is still binding.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, b, slot)
	assert.Equal(t, gang.PhaseDropped, f.plugin.gangs.Phase(key), "the gang lost a member on its way to Bound")
	assert.Empty(t, f.plugin.gangs.Avoided(key, f.clock.Now()), "the node did not refuse b in a cycle")

	_, status := f.preFilter(t, b)
	require.True(t, status.IsSuccess(), "b is planned again at once: %v", status)
	again := f.plugin.gangs.Plan(key)
	require.NotNil(t, again)
	// (This framework's snapshot does not assume a on its node, as the
	// scheduler's cache would; where b goes is the filters' business.)
	assert.Equal(t, []types.UID{b.UID}, slices.Collect(maps.Keys(again.Slots)), "b alone, beside its binding sibling")
}

// A gang of three: a and b wait at Permit. b leaves Permit: it is deleted
// (the framework rejects it at once, before muster's deletion handler
// runs), or another profile's preemption turns it away in memory (its
// Unreserve has not run yet). The last member's Permit then finds b no
// longer waiting: the plan is dropped, and a does not bind without it.
func TestLastArrivalDoesNotReleaseTheGangWithoutAMemberThatLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(f *testFramework, b *v1.Pod)
	}{
		{"deleted", func(f *testFramework, b *v1.Pod) {
			require.NoError(t, f.plugin.source.pods.Delete(b))
			require.True(t, f.fw.RejectWaitingPod(b.UID), "b was waiting")
		}},
		{"preempted by another profile", func(f *testFramework, b *v1.Pod) {
			require.True(t, f.fw.GetWaitingPod(b.UID).Preempt("DefaultPreemption", "preempted"), "b was waiting")
			// b's binding goroutine takes the rejection; its Unreserve
			// comes later.
			require.False(t, f.fw.WaitOnPermit(context.Background(), b).IsSuccess())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := worker("j", 0, 8, ""), worker("j", 1, 8, ""), worker("j", 2, 8, "")
			background := append(cpuPods("n1", 5), cpuPods("n2", 5)...) // priority-0 CPU pods, as on a real cluster
			f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, append([]*v1.Pod{a, b, c}, background...))
			key, _ := gang.KeyOf(a)
			_, plan := f.planAndWait(t, a)
			toPermit := func(pod *v1.Pod) (fwk.CycleState, string, *fwk.Status) {
				state, status := f.preFilter(t, pod)
				require.True(t, status.IsSuccess(), "PreFilter of %s: %v", pod.Name, status)
				slot := plan.Slots[pod.UID]
				require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, pod, slot).IsSuccess())
				waits, st := f.fw.RunPermitPlugins(context.Background(), state, pod, slot)
				if st.Code() == fwk.Wait {
					f.fw.AddWaitingPod(pod, waits)
				}
				return state, slot, st
			}
			_, _, st := toPermit(b)
			require.Equal(t, fwk.Wait, st.Code(), "Permit of b: %v", st)

			tc.leave(f, b)

			_, _, st = toPermit(c)
			assert.Equal(t, fwk.Unschedulable, st.Code(), "Permit of c: %v", st)
			assert.Nil(t, f.plugin.gangs.Plan(key))
			waited := f.fw.WaitOnPermit(context.Background(), a)
			assert.False(t, waited.IsSuccess(), "a: %v", waited)
			assert.Contains(t, waited.Message(), "member "+string(b.UID)+" is no longer waiting at Permit")
		})
	}
}

// A member whose Permit returned Wait just as its plan dropped is not yet
// among the framework's waiting pods: the scheduling cycle adds it only
// after every Permit plugin returned. It is turned away once it is there,
// not left waiting until the framework's timer with its node's GPUs
// assumed.
func TestMemberArrivingAsItsPlanDropsIsRejected(t *testing.T) {
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	state, status := f.preFilter(t, a)
	require.True(t, status.IsSuccess(), "PreFilter: %v", status)
	plan := f.plugin.gangs.Plan(key)
	slot := plan.Slots[a.UID]
	require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, a, slot).IsSuccess())
	waits, st := f.fw.RunPermitPlugins(context.Background(), state, a, slot)
	require.Equal(t, fwk.Wait, st.Code(), "Permit: %v", st)

	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()}) // the drop lands before the framework adds a
	f.fw.AddWaitingPod(a, waits)

	done := make(chan *fwk.Status, 1)
	go func() { done <- f.fw.WaitOnPermit(context.Background(), a) }()
	select {
	case st := <-done:
		assert.True(t, st.IsRejected(), "a ended with %v, want rejected", st)
		assert.Contains(t, st.Message(), "timed out after", "want muster's reason, not the framework's timer")
	case <-time.After(wait.ForeverTestTimeout):
		t.Fatal("a still waits at Permit for a plan that was dropped")
	}
}
