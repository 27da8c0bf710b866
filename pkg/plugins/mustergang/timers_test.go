package mustergang

// Timers of the plugin other than the wakes (wake_test.go): the plan
// deadline and the members grace.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/gang"
)

// A plan's deadline timer ends with the plan: released or dropped, nothing
// of it stays pending on the plugin's clock (in the simulator each pending
// timer is a moment the virtual clock may move to).
func TestPlanDeadlineTimerEndsWithThePlan(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, f *testFramework, b *v1.Pod)
	}{
		{"released", func(t *testing.T, f *testFramework, b *v1.Pod) {
			state, status := f.preFilter(t, b)
			require.True(t, status.IsSuccess(), "PreFilter: %v", status)
			key, _ := gang.KeyOf(b)
			slot := f.plugin.gangs.Plan(key).Slots[b.UID]
			require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, b, slot).IsSuccess())
			_, st := f.fw.RunPermitPlugins(context.Background(), state, b, slot)
			require.True(t, st.IsSuccess(), "the last member's Permit releases the gang: %v", st)
		}},
		{"dropped", func(t *testing.T, f *testFramework, b *v1.Pod) {
			key, _ := gang.KeyOf(b)
			f.plugin.drop(context.Background(), key, 0, gang.DropRejected, "test")
			// The gang's first backoff is the one timer left; it is much
			// shorter than the plan's deadline.
			f.clock.Step(time.Duration(f.plugin.args.GangBackoffSeconds) * time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
			f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b})
			f.planAndWait(t, a)
			require.True(t, f.clock.HasWaiters(), "the plan's deadline is pending while a member waits")
			tc.end(t, f, b)
			assert.False(t, f.clock.HasWaiters(), "a timer is still pending on the plugin's clock")
			f.plugin.timers.mu.Lock()
			defer f.plugin.timers.mu.Unlock()
			assert.Empty(t, f.plugin.timers.named)
		})
	}
}

// A gang short of members is explained (GangWaitingForMembers) only when it
// is still short membersGrace after a member was held: pods created one
// after another within the grace cost no Event and no status write.
func TestShortGangExplainedAfterTheGrace(t *testing.T) {
	a, b := worker("g", 0, 1, ""), worker("g", 1, 1, "")
	key, _ := gang.KeyOf(a)

	t.Run("still short", func(t *testing.T) {
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
		st := f.plugin.PreEnqueue(context.Background(), a)
		require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code(), "PreEnqueue: %v", st)
		assert.Contains(t, st.Message(), "has 2 of 3 members")
		outcome, _ := f.plugin.gangs.LastNotice(key)
		assert.Empty(t, outcome, "explained before the grace ended")

		f.plugin.PreEnqueue(context.Background(), b) // a second held member arms no second check
		f.clock.Step(membersGrace - time.Millisecond)
		outcome, _ = f.plugin.gangs.LastNotice(key)
		assert.Empty(t, outcome, "explained before the grace ended")
		f.clock.Step(time.Millisecond) // the fake clock runs the check within Step
		outcome, msg := f.plugin.gangs.LastNotice(key)
		assert.Equal(t, gang.OutcomeWaitingForMembers, outcome, "not explained after the grace")
		assert.Contains(t, msg, "has 2 of 3 members")
		assert.False(t, f.clock.HasWaiters(), "a second check is pending")
	})

	t.Run("complete within the grace", func(t *testing.T) {
		c := worker("g", 2, 1, "")
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
		require.Equal(t, fwk.UnschedulableAndUnresolvable, f.plugin.PreEnqueue(context.Background(), a).Code())
		require.NoError(t, f.plugin.source.pods.Add(c)) // the third member arrives
		f.clock.Step(membersGrace)
		assert.False(t, f.clock.HasWaiters(), "the check is still pending")
		outcome, _ := f.plugin.gangs.LastNotice(key)
		assert.Empty(t, outcome, "a gang that was complete when the grace ended was explained")
	})
}

// A check armed while the gang had one quorum fires with the quorum its
// owner says when it fires: members held after the quorum was raised, while
// that check was pending (it arms no second one), are explained.
func TestShortGangExplainedWithTheQuorumOfNow(t *testing.T) {
	a, b := worker("g", 0, 1, ""), worker("g", 1, 1, "")
	key, _ := gang.KeyOf(a)
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a})
	require.Equal(t, fwk.UnschedulableAndUnresolvable, f.plugin.PreEnqueue(context.Background(), a).Code(), "1 of 2")

	jobs := f.plugin.handle.SharedInformerFactory().Batch().V1().Jobs().Informer().GetIndexer()
	obj, ok, err := jobs.GetByKey("ns/g")
	require.NoError(t, err)
	require.True(t, ok)
	raised := obj.(*batchv1.Job).DeepCopy()
	raised.Spec.Parallelism, raised.Spec.Completions = ptr.To[int32](3), ptr.To[int32](3)
	require.NoError(t, jobs.Update(raised))
	require.NoError(t, f.plugin.source.pods.Add(b))
	f.plugin.onPodAdd(b)
	st := f.plugin.PreEnqueue(context.Background(), b)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, st.Code())
	require.Contains(t, st.Message(), "has 2 of 3 members")

	f.clock.Step(membersGrace)
	outcome, msg := f.plugin.gangs.LastNotice(key)
	assert.Equal(t, gang.OutcomeWaitingForMembers, outcome, "not explained after the grace")
	assert.Contains(t, msg, "has 2 of 3 members")
}

// firedCounter counts, by name, the callbacks count(name) returns that ran.
func firedCounter() (fired map[string]int, count func(name string) func()) {
	fired = map[string]int{}
	var mu sync.Mutex
	return fired, func(name string) func() {
		return func() { mu.Lock(); fired[name]++; mu.Unlock() }
	}
}

// The timers type alone: a named timer is set once until it fires or is
// cancelled; nothing is set or left pending once the scheduler stopped.
func TestTimersOnceCancelStop(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	timers := newTimers(clock)
	fired, count := firedCounter()
	require.True(t, timers.once(planDeadline(1), time.Second, count("deadline")))
	assert.False(t, timers.once(planDeadline(1), time.Second, count("deadline")), "a second timer of the same name while one is pending")
	require.True(t, timers.once(planDeadline(2), time.Second, count("cancelled")))
	timers.cancel(planDeadline(2))
	timers.forGang(gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "g"}, 2*time.Second, count("gang"))

	clock.Step(time.Second)
	assert.Equal(t, map[string]int{"deadline": 1}, fired)
	assert.True(t, timers.once(planDeadline(1), time.Second, count("deadline")), "a name is free again once its timer fired")

	timers.stop()
	assert.False(t, clock.HasWaiters(), "stop leaves nothing pending")
	assert.False(t, timers.once(planDeadline(3), time.Second, count("late")), "nothing is set after stop")
	clock.Step(time.Minute)
	assert.Equal(t, map[string]int{"deadline": 1}, fired)
}

// forget stops the timers of one gang (the wakes set by forGang, its members
// check) and no other: a gang with no pods left leaves no moment pending on
// the plugin's clock.
func TestTimersForgetAGang(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	timers := newTimers(clock)
	fired, count := firedCounter()
	gone := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "gone"}
	kept := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "kept"}
	timers.forGang(gone, time.Second, count("gone backoff"))
	timers.forGang(gone, 2*time.Second, count("gone avoid"))
	timers.once(membersCheck(gone), time.Second, count("gone members"))
	timers.forGang(kept, time.Second, count("kept backoff"))
	timers.once(planDeadline(7), time.Second, count("deadline"))

	timers.forget(gone)
	clock.Step(time.Minute)
	assert.Equal(t, map[string]int{"kept backoff": 1, "deadline": 1}, fired)
	assert.False(t, clock.HasWaiters())
}
