package mustergang

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// Every place muster wakes a gang goes through wake with its reason: these
// tests drive each of them and check which pods were woken, when, and that
// the wake was counted under that reason and no other.

// wakeCounts reads muster_gang_wakes_total for every reason.
func wakeCounts(t *testing.T) map[gang.WakeReason]float64 {
	t.Helper()
	out := map[gang.WakeReason]float64{}
	for _, r := range gang.WakeReasons() {
		v, err := testutil.GetCounterMetricValue(wakes.WithLabelValues(r.String()))
		require.NoError(t, err)
		out[r] = v
	}
	return out
}

// wakesSince is how many wakes of each reason were counted since before
// (reasons without one are left out).
func wakesSince(t *testing.T, before map[gang.WakeReason]float64) map[gang.WakeReason]float64 {
	t.Helper()
	out := map[gang.WakeReason]float64{}
	for r, v := range wakeCounts(t) {
		if d := v - before[r]; d != 0 {
			out[r] = d
		}
	}
	return out
}

// takeActivated returns the pods the framework was asked to activate since
// the last call, and forgets them.
func (f *testFramework) takeActivated() []string {
	f.queue.mu.Lock()
	defer f.queue.mu.Unlock()
	got := f.queue.activated
	f.queue.activated = nil
	return got
}

func TestWakeReasonsHaveDistinctNames(t *testing.T) {
	seen := map[string]gang.WakeReason{}
	for _, r := range gang.WakeReasons() {
		name := r.String()
		require.NotEmpty(t, name, "reason %d has no name", int(r))
		require.NotEqual(t, "unknown", name, "reason %d", int(r))
		if other, dup := seen[name]; dup {
			t.Errorf("reasons %d and %d are both named %q", int(other), int(r), name)
		}
		seen[name] = r
	}
	assert.Equal(t, "unknown", gang.WakeReason(len(gang.WakeReasons())).String())
}

// newQuietFramework is newTestFramework over nodes and bound pods, with Job
// g of workers members and the pending pods put straight into the
// informers' stores: no informer handler is told of them, so nothing wakes
// them behind the test's back and every wake a test sees is one it caused.
// Job g is a copy of newTestFramework's Job j under another name (j's
// informer handler may run at any time).
func newQuietFramework(t *testing.T, workers int32, nodes []*v1.Node, bound, pending []*v1.Pod) *testFramework {
	t.Helper()
	f := newTestFramework(t, workers, nodes, bound)
	job, err := f.plugin.handle.ClientSet().BatchV1().Jobs("ns").Get(context.Background(), "j", metav1.GetOptions{})
	require.NoError(t, err)
	job = job.DeepCopy()
	job.Name = "g"
	jobs := f.plugin.handle.SharedInformerFactory().Batch().V1().Jobs().Informer().GetIndexer()
	require.NoError(t, jobs.Add(job))
	for _, p := range pending {
		require.NoError(t, f.plugin.source.pods.Add(p))
	}
	return f
}

// A plan wakes the members it placed; the first member at Permit wakes
// those not reserved yet.
func TestWakeWhenPlannedAndWhenAMemberWaits(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b})
	before := wakeCounts(t)

	state, status := f.preFilter(t, a)
	require.True(t, status.IsSuccess(), "PreFilter: %v", status)
	assert.Equal(t, []string{"ns/g-1"}, f.takeActivated(), "a plan wakes the other planned member")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakePlanMade: 1}, wakesSince(t, before))

	key, _ := gang.KeyOf(a)
	slot := f.plugin.gangs.Plan(key).Slots[a.UID]
	require.True(t, f.fw.RunReservePluginsReserve(context.Background(), state, a, slot).IsSuccess())
	_, st := f.fw.RunPermitPlugins(context.Background(), state, a, slot)
	require.Equal(t, fwk.Wait, st.Code(), "Permit: %v", st)
	assert.Equal(t, []string{"ns/g-1"}, f.takeActivated(), "a member waiting at Permit hurries the unreserved one")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakePlanMade: 1, gang.WakeMemberWaiting: 1}, wakesSince(t, before))
}

// A dropped plan wakes the gangs that found no room at once, and its own
// gang only when its backoff ends.
func TestWakeWhenAPlanIsDropped(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	waiting := worker("o", 0, 8, "") // another Job's gang, last told there is no room
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b, waiting})
	other, _ := gang.KeyOf(waiting)
	f.plugin.gangs.Refused(other, gang.Refusal{Outcome: gang.OutcomeUnschedulable, Message: "no room"}, t0)
	state, plan := f.planAndWait(t, a)
	f.takeActivated()
	before := wakeCounts(t)

	// Another plugin's Reserve fails after muster's: the plan is dropped.
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, plan.Slots[a.UID])
	assert.Equal(t, []string{"ns/o-0"}, f.takeActivated(), "the gang waiting for capacity is woken at once")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeCapacityFreed: 1}, wakesSince(t, before))

	backoff := time.Duration(f.plugin.args.GangBackoffSeconds) * time.Second
	require.Positive(t, backoff)
	f.clock.Step(backoff - time.Millisecond)
	assert.Empty(t, f.takeActivated(), "the gang is woken before its backoff ends")
	f.clock.Step(time.Millisecond)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated(), "the gang's members when its backoff ends")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeCapacityFreed: 1, gang.WakeBackoffEnded: 1}, wakesSince(t, before))
}

// A pod scheduled alone that Filter kept off the capacity a plan holds is
// woken when that plan is dropped: no cluster event says the capacity is
// free again. Until then it is not woken, nor is a pod alone that fits
// nowhere whatever the plans hold, nor one deleted during its cycle (the
// manager forgets it). The nodes run priority-0 CPU pods, as a real
// cluster's do.
func TestWakeALonePodHeldOutWhenAPlanIsDropped(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	alone := func(name string, gpus int64) *v1.Pod {
		return testobj.MakePod("ns", name).UID(name).SchedulerName("muster").
			Container(testobj.MakeContainer("c").GPUs(gpus).Obj()).Obj()
	}
	lone, tooBig, gone := alone("lone", 1), alone("too-big", 16), alone("gone", 1)
	background := append(cpuPods("n1", 5), cpuPods("n2", 5)...)
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, background, []*v1.Pod{a, b, lone, tooBig, gone})
	_, status := f.preFilter(t, a)
	require.True(t, status.IsSuccess(), "PreFilter of a: %v", status)
	key, _ := gang.KeyOf(a)
	plan := f.plugin.gangs.Plan(key)
	require.NotNil(t, plan)
	f.takeActivated()

	for _, pod := range []*v1.Pod{lone, tooBig, gone} {
		state, status := f.preFilter(t, pod)
		require.True(t, status.IsSuccess(), "PreFilter of %s: %v", pod.Name, status)
		statuses := framework.NewDefaultNodeToStatus()
		for _, ni := range f.nodes {
			st := f.fw.RunFilterPlugins(context.Background(), state, pod, ni)
			require.False(t, st.IsSuccess(), "%s fits on node %s", pod.Name, ni.Node().Name)
			statuses.Set(ni.Node().Name, st)
		}
		if pod == gone {
			require.NoError(t, f.plugin.source.pods.Delete(pod)) // deleted during its cycle
		}
		f.fw.RunPostFilterPlugins(context.Background(), state, pod, statuses)
	}
	assert.Empty(t, f.takeActivated(), "nothing was freed yet")
	assert.Equal(t, gang.PhasePending, f.plugin.gangs.Phase(gang.LoneKey(gone)), "a pod deleted during its cycle is forgotten")
	before := wakeCounts(t)

	f.plugin.fire(gang.Timer{Kind: gang.TimerPlanDeadline, Key: key, PlanID: plan.ID, Due: f.plugin.now()})
	assert.Equal(t, []string{"ns/lone"}, f.takeActivated(), "the lone pod held out is woken when the capacity held is free")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeCapacityFreed: 1}, wakesSince(t, before))
}

// A member a Filter turned away from its planned node backs the gang off
// and keeps the pair out of plans for a while; the gang is woken when each
// ends.
func TestWakeWhenBackoffAndAvoidanceEnd(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8), gpuNode("n3", 8)}, nil, []*v1.Pod{a, b})
	_, plan := f.planAndWait(t, a)
	bState, status := f.preFilter(t, b)
	require.True(t, status.IsSuccess(), "PreFilter of b: %v", status)
	f.takeActivated()
	before := wakeCounts(t)

	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set(plan.Slots[b.UID], fwk.NewStatus(fwk.Unschedulable, "node(s) had volume node affinity conflict"))
	f.fw.RunPostFilterPlugins(context.Background(), bState, b, statuses)
	assert.Empty(t, f.takeActivated(), "nobody waits for capacity: the drop wakes no one at once")

	backoff := time.Duration(f.plugin.args.GangBackoffSeconds) * time.Second
	f.clock.Step(backoff)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeBackoffEnded: 1}, wakesSince(t, before))

	f.clock.Step(gang.AvoidFor - backoff - time.Millisecond)
	assert.Empty(t, f.takeActivated(), "the gang is woken before the avoidance ends")
	f.clock.Step(time.Millisecond)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeBackoffEnded: 1, gang.WakeAvoidEnded: 1}, wakesSince(t, before))
}

// A plan that preempted wakes its member when the last victim is gone, not
// when it is made.
func TestWakeWhenTheLastVictimIsGone(t *testing.T) {
	low0, low1 := worker("low", 0, 8, "n1"), worker("low", 1, 8, "n2")
	for _, p := range []*v1.Pod{low0, low1} {
		p.Spec.Priority = ptr.To[int32](1)
	}
	high := worker("g", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	f := newQuietFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{low0, low1}, []*v1.Pod{high})
	// The victims stay in the API: only the test tells the plugin they went.
	f.keepPodsInAPI()
	before := wakeCounts(t)

	state, _ := f.preFilter(t, high)
	f.fw.RunPostFilterPlugins(context.Background(), state, high, framework.NewDefaultNodeToStatus())
	key, _ := gang.KeyOf(high)
	require.NotNil(t, f.plugin.gangs.Plan(key), "no preemption plan")
	f.plugin.onPodDelete(low0)
	assert.Empty(t, f.takeActivated(), "woken while a victim is still there")
	f.plugin.onPodDelete(low1)
	assert.Equal(t, []string{"ns/g-0"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeVictimsGone: 1}, wakesSince(t, before))
}

// The plugin's informers wake a gang when a new member completes its
// quorum and when its Job is added or changes its quorum.
func TestWakeFromTheInformers(t *testing.T) {
	a, b := worker("g", 0, 1, ""), worker("g", 1, 1, "")
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
	before := wakeCounts(t)

	f.plugin.onPodAdd(b)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeQuorumReached: 1}, wakesSince(t, before))

	job, err := f.plugin.source.jobs.Jobs("ns").Get("g")
	require.NoError(t, err)
	f.plugin.ownerHandler(gang.KindJob).OnAdd(job, false)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeQuorumReached: 1, gang.WakeOwnerChanged: 1}, wakesSince(t, before))
}

// A Kubernetes PodGroup of the basic policy takes its quorum from the Job
// that made it: a change of the Job's parallelism wakes the group's pending
// members, which are indexed under the group, not the Job.
func TestWakeABasicGroupWhenItsJobChanges(t *testing.T) {
	var pending []*v1.Pod
	for i := range 2 {
		p := worker("g", i, 1, "")
		p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("g-group")}
		pending = append(pending, p)
	}
	f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, pending)
	before := wakeCounts(t)
	job, err := f.plugin.source.jobs.Jobs("ns").Get("g")
	require.NoError(t, err)
	lowered := job.DeepCopy()
	lowered.Spec.Parallelism = ptr.To[int32](2)
	lowered.Generation++
	f.plugin.ownerHandler(gang.KindJob).OnUpdate(job, lowered)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeOwnerChanged: 1}, wakesSince(t, before))
}

// A member added to a gang still short of its quorum wakes nobody.
func TestNoWakeBelowQuorum(t *testing.T) {
	a, b := worker("g", 0, 1, ""), worker("g", 1, 1, "")
	f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, b})
	before := wakeCounts(t)
	f.plugin.onPodAdd(b)
	assert.Empty(t, f.takeActivated())
	assert.Empty(t, wakesSince(t, before))
}

// A PodGroup member that finished successfully counts toward the quorum:
// the rest of the gang is woken, once.
func TestWakeWhenAPodGroupMemberSucceeded(t *testing.T) {
	done, rest := worker("pg", 0, 1, "n1"), worker("pg", 1, 1, "")
	for _, p := range []*v1.Pod{done, rest} {
		p.OwnerReferences = nil
		p.Labels[v1alpha1.PodGroupLabel] = "pg"
	}
	done.Status.Phase = v1.PodSucceeded
	f := newQuietFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{done}, []*v1.Pod{rest})
	key, _ := gang.KeyOf(done)
	f.plugin.gangs.FirstSeen(key, t0) // the pod handlers saw its members
	before := wakeCounts(t)

	f.plugin.recordFinished(key, done)
	assert.Equal(t, []string{"ns/pg-1"}, f.takeActivated())
	f.plugin.recordFinished(key, done)
	assert.Empty(t, f.takeActivated(), "the same member counted twice")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeMemberSucceeded: 1}, wakesSince(t, before))
}

// activator is the one part of the framework handle wake uses.
type activator struct {
	fwk.Handle
	activated map[string]*v1.Pod
}

func (a *activator) Activate(_ klog.Logger, pods map[string]*v1.Pod) { a.activated = pods }

// A wake is logged with the gang and the reason; waking nobody does
// nothing.
func TestWakeLogsGangAndReason(t *testing.T) {
	registerMetrics()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4), ktesting.BufferLogs(true)))
	h := &activator{}
	p := &Plugin{handle: h}
	key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
	before := wakeCounts(t)

	p.wake(logger, key, gang.WakeOwnerChanged, nil)
	assert.Nil(t, h.activated)
	assert.Empty(t, wakesSince(t, before))

	p.wake(logger, key, gang.WakeOwnerChanged, []*v1.Pod{worker("j", 0, 1, ""), worker("j", 1, 1, "")})
	assert.Len(t, h.activated, 2)
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeOwnerChanged: 1}, wakesSince(t, before))
	out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	assert.Contains(t, out, "Waking gang members")
	assert.Contains(t, out, `gang="ns/j"`)
	assert.Contains(t, out, `reason="owner_changed"`)
}

// Profiles share the registry and the pod informer: a plan dropped in one
// wakes the gangs waiting for capacity in another, and a gang's state is
// forgotten only when no profile has its pods left.
func TestProfilesShareWakesAndGangState(t *testing.T) {
	a, b := worker("g", 0, 8, ""), worker("g", 1, 8, "")
	waiting := worker("o", 0, 8, "")
	waiting.Spec.SchedulerName = "other" // a gang of the second profile
	mine := worker("o", 1, 8, "")        // the same Job's pod in this profile
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, []*v1.Pod{a, b, waiting, mine})
	// The second profile's plugin adds its index to the shared informer.
	require.NoError(t, f.plugin.handle.SharedInformerFactory().Core().V1().Pods().Informer().
		AddIndexers(cache.Indexers{gangIndexPrefix + "other": gangIndexFunc("other")}))
	other, _ := gang.KeyOf(waiting)
	f.plugin.gangs.Refused(other, gang.Refusal{Outcome: gang.OutcomeUnschedulable, Message: "no room"}, t0)

	state, plan := f.planAndWait(t, a)
	f.takeActivated()
	f.fw.RunReservePluginsUnreserve(context.Background(), state, a, plan.Slots[a.UID])
	assert.Contains(t, f.takeActivated(), "ns/o-0", "the other profile's gang waiting for capacity is woken")

	// This profile's last pod of gang o goes; the other profile's stays.
	require.NoError(t, f.plugin.source.pods.Delete(mine))
	f.plugin.onPodDelete(mine)
	outcome, _ := f.plugin.gangs.LastNotice(other)
	assert.Equal(t, gang.OutcomeUnschedulable, outcome, "the gang's state was forgotten while the other profile has its pod")
}

// The life of two gangs on a busy cluster: gang o finds no room in a real
// PreFilter (gang j's plan holds the GPUs; priority-0 CPU pods run on every
// node), so its phase is Unplaceable. A worker of j fails before it
// reaches its slot: j's plan is dropped, its member waiting at Permit is
// rejected, o is woken at once, and o's next PreFilter plans it.
func TestUnplaceableGangPlannedWhenAWorkerOfTheHolderFails(t *testing.T) {
	background := append(cpuPods("n1", 5), cpuPods("n2", 5)...)
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	o0, o1 := worker("o", 0, 8, ""), worker("o", 1, 8, "")
	f := newTestFrameworkWith(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(background, a, b, o0, o1), gangJob("o", 2))
	holder, _ := gang.KeyOf(a)
	waiting, _ := gang.KeyOf(o0)

	f.planAndWait(t, a)
	_, status := f.preFilter(t, o0)
	require.False(t, status.IsSuccess(), "gang o planned on GPUs gang j's plan holds")
	require.Equal(t, gang.PhaseUnschedulable, f.plugin.gangs.Phase(waiting))
	f.takeActivated()

	f.plugin.onPodDelete(b) // the worker failed and left
	assert.Nil(t, f.plugin.gangs.Plan(holder), "the plan of the failed worker's gang")
	if st := f.fw.WaitOnPermit(context.Background(), a); st.IsSuccess() {
		t.Error("the member waiting at Permit was let through without its failed sibling")
	}
	assert.Subset(t, f.takeActivated(), []string{"ns/o-0", "ns/o-1"}, "the gang that found no room is woken when the capacity frees")

	_, status = f.preFilter(t, o0)
	require.True(t, status.IsSuccess(), "PreFilter after the capacity freed: %v", status)
	plan := f.plugin.gangs.Plan(waiting)
	require.NotNil(t, plan)
	assert.Len(t, plan.Slots, 2)
	assert.Empty(t, f.plugin.gangs.HeldForOthers(waiting, gang.AnyPriority), "the dropped plan holds nothing")
}

// A pending member whose last scheduling gate is removed wakes its gang's
// pending members (the framework tells only that pod); removing one gate of
// two, or an update of a bound member, wakes nobody.
func TestWakeWhenAMembersLastGateIsRemoved(t *testing.T) {
	a := worker("g", 0, 1, "")
	gated := testobj.MakePod("ns", "g-1").UID("g-1").OwnedByJob("g", jobUID).SchedulerName("muster").
		SchedulingGate("first").SchedulingGate("second").Obj()
	f := newQuietFramework(t, 2, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{a, gated})
	before := wakeCounts(t)

	oneLeft := gated.DeepCopy()
	oneLeft.Spec.SchedulingGates = oneLeft.Spec.SchedulingGates[1:]
	f.plugin.onPodUpdate(gated, oneLeft)
	assert.Empty(t, f.takeActivated(), "a gate remains")

	ungated := oneLeft.DeepCopy()
	ungated.Spec.SchedulingGates = nil
	require.NoError(t, f.plugin.source.pods.Update(ungated))
	f.plugin.onPodUpdate(oneLeft, ungated)
	assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1"}, f.takeActivated())
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeMemberUngated: 1}, wakesSince(t, before))

	f.plugin.onPodUpdate(ungated, ungated)
	bound := a.DeepCopy()
	bound.Spec.NodeName = "n1"
	f.plugin.onPodUpdate(a, bound)
	assert.Empty(t, f.takeActivated(), "no gate went")
	assert.Equal(t, map[gang.WakeReason]float64{gang.WakeMemberUngated: 1}, wakesSince(t, before))
}

// A plan displaced by a higher-priority gang of another profile ends its
// (zero) backoff by waking its own members, which this profile's gang
// index does not hold.
func TestDisplacedGangOfAnotherProfileIsWoken(t *testing.T) {
	low := []*v1.Pod{worker("o", 0, 8, ""), worker("o", 1, 8, "")}
	for _, p := range low {
		p.Spec.SchedulerName = "other"
		p.Spec.Priority = ptr.To[int32](1)
	}
	high := worker("g", 0, 8, "")
	high.Spec.Priority = ptr.To[int32](100)
	f := newQuietFramework(t, 1, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, nil, append(low, high))
	require.NoError(t, f.plugin.handle.SharedInformerFactory().Core().V1().Pods().Informer().
		AddIndexers(cache.Indexers{gangIndexPrefix + "other": gangIndexFunc("other")}))
	lowKey, _ := gang.KeyOf(low[0])
	_, ok := f.plugin.gangs.Install(lowKey, &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{low[0].UID: "n1", low[1].UID: "n2"}},
		Priority: 1, Reserved: sets.New[types.UID]()}, low[0].UID, "planned", t0, nil, 0)
	require.True(t, ok)
	before := wakeCounts(t)

	_, status := f.preFilter(t, high)
	require.True(t, status.IsSuccess(), "PreFilter of the high worker: %v", status)
	require.Nil(t, f.plugin.gangs.Plan(lowKey), "the low plan gave way")
	f.takeActivated()
	f.clock.Step(0)
	assert.ElementsMatch(t, []string{"ns/o-0", "ns/o-1"}, f.takeActivated(), "the displaced gang's members try again")
	assert.Equal(t, 1.0, wakesSince(t, before)[gang.WakeBackoffEnded])
}

// A gang created or ungated pod by pod wakes its held members once, when
// enough of them are there to reach the quorum, not at every sibling: for
// a gang of 1000 that is the difference between a thousand PreEnqueue calls
// and half a million.
func TestSiblingsWakeTheGangOnlyAtTheQuorum(t *testing.T) {
	t.Run("added", func(t *testing.T) {
		g0, g1, g2 := worker("g", 0, 1, ""), worker("g", 1, 1, ""), worker("g", 2, 1, "")
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, []*v1.Pod{g0, g1})
		hint, err := f.plugin.sameGangPod(klog.Background(), g0, nil, g1)
		require.NoError(t, err)
		assert.Equal(t, fwk.QueueSkip, hint, "2 of 3 members: the held member would only be held again")

		require.NoError(t, f.plugin.source.pods.Add(g2))
		f.plugin.onPodAdd(g2)
		assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1", "ns/g-2"}, f.takeActivated(), "the quorum reached")
		hint, err = f.plugin.sameGangPod(klog.Background(), g0, nil, g2)
		require.NoError(t, err)
		assert.Equal(t, fwk.Queue, hint, "the third member completes the quorum")

		other := worker("o", 0, 1, "")
		hint, err = f.plugin.sameGangPod(klog.Background(), g0, nil, other)
		require.NoError(t, err)
		assert.Equal(t, fwk.QueueSkip, hint, "another gang's member")

		bound := g1.DeepCopy()
		bound.Spec.NodeName = "n1"
		bound.ResourceVersion = "2"
		hint, err = f.plugin.sameGangPod(klog.Background(), g0, nil, bound)
		require.NoError(t, err)
		assert.Equal(t, fwk.Queue, hint, "a sibling bound")
	})
	t.Run("ungated", func(t *testing.T) {
		var gated []*v1.Pod
		for i := range 3 {
			p := worker("g", i, 1, "")
			p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "example.com/wait"}}
			gated = append(gated, p)
		}
		f := newQuietFramework(t, 3, []*v1.Node{gpuNode("n1", 8)}, nil, gated)
		before := wakeCounts(t)
		for i, p := range gated {
			ungated := p.DeepCopy()
			ungated.Spec.SchedulingGates = nil
			require.NoError(t, f.plugin.source.pods.Update(ungated))
			f.plugin.onPodUpdate(p, ungated)
			if i < 2 {
				assert.Empty(t, f.takeActivated(), "%d of 3 members ungated", i+1)
			}
		}
		assert.ElementsMatch(t, []string{"ns/g-0", "ns/g-1", "ns/g-2"}, f.takeActivated(), "the last ungating reaches the quorum")
		assert.Equal(t, map[gang.WakeReason]float64{gang.WakeMemberUngated: 1}, wakesSince(t, before))
	})
}
