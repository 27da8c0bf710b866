package gang

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

var (
	t0    = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	jobA  = Key{Kind: KindJob, Namespace: "ns", Name: "a"}
	loneP = Key{Kind: KindPod, Namespace: "ns", Name: "p"}
)

// twoMembers is a plan of a0 on n1 and a1 on n2 beside a2, bound, with
// victims if any.
func twoMembers(victims ...types.UID) *ActivePlan {
	return &ActivePlan{
		Plan:     Plan{Slots: map[types.UID]string{"a0": "n1", "a1": "n2"}, Nodes: 2, Level: "rack", Domain: "r1"},
		Requests: map[types.UID]Resources{"a0": {MilliCPU: 1000}, "a1": {MilliCPU: 1000}},
		Reserved: sets.New[types.UID](),
		Victims:  sets.New(victims...),
		Evicted:  sets.New(victims...),
		Profile:  "muster",
		Created:  t0,
		Deadline: t0.Add(time.Minute),
		CountsOn: sets.New[types.UID]("a2"),
	}
}

// withoutDue is timers with their Due times left out.
func withoutDue(timers []Timer) []Timer {
	out := make([]Timer, len(timers))
	for i, t := range timers {
		t.Due = time.Time{}
		out[i] = t
	}
	return out
}

// installed is a manager where key has plan installed (its effects
// dropped).
func installed(t *testing.T, key Key, plan *ActivePlan) *Manager {
	t.Helper()
	m := NewManager()
	_, ok := m.Install(key, plan, "a0", "planned", t0, nil, 0)
	require.True(t, ok)
	return m
}

func TestInstall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		victims []types.UID
		phase   Phase
		outcome Outcome
		wake    bool
	}{
		{"without victims: siblings go to their slots", nil, PhasePlanned, OutcomePlanned, true},
		{"with victims: everyone waits for them", []types.UID{"v1"}, PhasePreempting, OutcomePreempting, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager()
			plan := twoMembers(tc.victims...)
			e, ok := m.Install(jobA, plan, "a0", "message", t0, nil, 0)
			require.True(t, ok)
			assert.Equal(t, tc.phase, m.Phase(jobA))
			require.NotNil(t, e.Notice)
			assert.Equal(t, Notice{Key: jobA, Outcome: tc.outcome, Message: "message"}, *e.Notice)
			assert.Equal(t, []Timer{{Key: jobA, Kind: TimerPlanDeadline, After: time.Minute, PlanID: plan.ID, Due: plan.Deadline}}, e.Timers)
			assert.Equal(t, plan.ID, e.Installed, "the installed plan is not reported (muster_gang_plans_total)")
			if tc.wake {
				require.Len(t, e.Wake, 1)
				assert.Equal(t, WakePlanMade, e.Wake[0].Reason)
				assert.Equal(t, types.UID("a0"), e.Wake[0].Except)
			} else {
				assert.Empty(t, e.Wake)
			}
			_, again := m.Install(jobA, twoMembers(), "a0", "message", t0, nil, 0)
			assert.False(t, again, "a second plan replaced the first")
		})
	}
}

// The pods a gang's preemption evicted are remembered after its plan is
// dropped, until its next preemption.
func TestPreemptedOutlivesThePlan(t *testing.T) {
	m := NewManager()
	assert.Nil(t, m.Preempted(jobA), "never preempted")
	plan := twoMembers("v1", "v2")
	_, ok := m.Install(jobA, plan, "a0", "preempting", t0, nil, 0)
	require.True(t, ok)
	m.VictimGone("v1", "muster")
	m.Expire(jobA, plan.ID, t0.Add(time.Minute), time.Second)
	assert.Equal(t, sets.New[types.UID]("v1", "v2"), m.Preempted(jobA), "every pod evicted, gone or not")

	_, ok = m.Install(jobA, twoMembers(), "a0", "planned", t0.Add(time.Hour), nil, 0)
	require.True(t, ok)
	assert.Equal(t, sets.New[types.UID]("v1", "v2"), m.Preempted(jobA), "a plan without victims keeps them")
	m.Drop(jobA, 0, DropRejected, "test", t0.Add(time.Hour), time.Second)
	_, ok = m.Install(jobA, twoMembers("v3"), "a0", "preempting again", t0.Add(2*time.Hour), nil, 0)
	require.True(t, ok)
	assert.Equal(t, sets.New[types.UID]("v3"), m.Preempted(jobA), "the last preemption's")
}

// A dropped plan's capacity wakes exactly the gangs that found no room:
// not one planned since, nor one forgotten, nor one that reported itself
// short of members.
func TestDropWakesTheUnplaceableGangs(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	job := func(name string) Key { return Key{Kind: KindJob, Namespace: "ns", Name: name} }
	for _, name := range []string{"b", "c", "d", "e"} {
		m.Refused(job(name), Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
	}
	_, ok := m.Install(job("c"), twoMembers(), "a0", "planned", t0, nil, 0)
	require.True(t, ok)
	m.Forget(job("d"), t0)
	m.Refused(job("e"), Refusal{Outcome: OutcomeWaitingForMembers, Message: "short"}, t0)

	e := m.Drop(jobA, 0, DropRejected, "test", t0, time.Second)
	assert.Equal(t, []Wake{{Key: job("b"), Reason: WakeCapacityFreed, AllProfiles: true}}, e.Wake)
}

// A pod alone held out by the plans' holdings is woken by a drop, as long
// as it is held out: refused for another reason, or bound (Forget), it is
// not. Nothing is announced either way.
func TestHeldOutLonePodsAreWokenByADrop(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	held := Key{Kind: KindPod, Namespace: "ns", Name: "held"}
	refusedSince := Key{Kind: KindPod, Namespace: "ns", Name: "refused-since"}
	bound := Key{Kind: KindPod, Namespace: "ns", Name: "bound"}
	for _, k := range []Key{held, refusedSince, bound} {
		m.HeldOut(k, true, t0)
		assert.Equal(t, PhaseUnschedulable, m.Phase(k))
	}
	m.HeldOut(refusedSince, false, t0)
	assert.Equal(t, PhasePending, m.Phase(refusedSince))
	m.Forget(bound, t0)

	e := m.Drop(jobA, 0, DropRejected, "test", t0, time.Second)
	assert.Equal(t, []Wake{{Key: held, Reason: WakeCapacityFreed, AllProfiles: true}}, e.Wake)
}

// Only the plan's first member to wait at Permit wakes the others: a wake
// of the whole gang per member costs a gang of 1000 a million activations.
func TestOnlyTheFirstArrivalWakes(t *testing.T) {
	plan := twoMembers()
	plan.Slots["a2"] = "n3"
	m := installed(t, jobA, plan)

	_, _, e := m.Arrive(jobA, plan.ID, "a1", t0, time.Second, nil)
	require.Len(t, e.Wake, 1, "the first member to wait")
	assert.Equal(t, WakeMemberWaiting, e.Wake[0].Reason)
	arrival, _, e := m.Arrive(jobA, plan.ID, "a2", t0, time.Second, nil)
	assert.Equal(t, ArrivalWait, arrival)
	assert.Empty(t, e.Wake, "the second member to wait")
	arrival, _, _ = m.Arrive(jobA, plan.ID, "a0", t0, time.Second, nil)
	assert.Equal(t, ArrivalComplete, arrival)
}

func TestArriveCompletesThePlanOnce(t *testing.T) {
	plan := twoMembers()
	m := installed(t, jobA, plan)

	arrival, copied, e := m.Arrive(jobA, plan.ID, "a1", t0, time.Second, nil)
	assert.Equal(t, ArrivalWait, arrival)
	assert.Equal(t, 1, copied.Reserved.Len())
	assert.Equal(t, []Wake{{Key: jobA, Reason: WakeMemberWaiting, Plan: copied, Except: "a1"}}, e.Wake)
	assert.Equal(t, PhasePlanned, m.Phase(jobA))

	arrival, _, e = m.Arrive(jobA, plan.ID, "a0", t0, time.Second, nil)
	assert.Equal(t, ArrivalComplete, arrival)
	assert.Equal(t, PhasePermitted, m.Phase(jobA))
	assert.Equal(t, []types.UID{"a1"}, e.Allow, "the others are allowed; a0 by its own Permit")
	assert.Equal(t, plan.ID, e.StopDeadline)
	require.NotNil(t, e.Notice)
	assert.Equal(t, OutcomeScheduled, e.Notice.Outcome)
	assert.Nil(t, m.Plan(jobA), "a completed plan holds nothing")

	assert.Empty(t, m.Expire(jobA, plan.ID, t0.Add(time.Minute), time.Second), "a completed plan cannot also expire")
	arrival, _, _ = m.Arrive(jobA, plan.ID, "a0", t0, time.Second, nil)
	assert.Equal(t, ArrivalDropped, arrival)

	m.MemberBound(jobA, "a0", t0)
	assert.Equal(t, PhasePermitted, m.Phase(jobA))
	m.MemberBound(jobA, "a1", t0)
	assert.Equal(t, PhaseBound, m.Phase(jobA))
}

// A plan this member's arrival would complete is dropped when a reserved
// member is no longer live: a sibling deleted while it waited at Permit,
// or the arriving member itself, deleted during its own cycle (its
// binding would fail). The others must not bind without it.
func TestArriveDoesNotCompleteWithoutADeletedMember(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deleted types.UID
		reason  string
	}{
		{"a sibling waiting at Permit", "a1", "member a1 is no longer waiting at Permit (deleted, or turned away)"},
		{"the arriving member", "a0", "member a0 was deleted during its own scheduling cycle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := twoMembers()
			m := installed(t, jobA, plan)
			live := func(uid types.UID) bool { return uid != tc.deleted }
			arrival, _, _ := m.Arrive(jobA, plan.ID, "a1", t0, time.Second, &ReleaseCheck{Live: live})
			require.Equal(t, ArrivalWait, arrival)
			arrival, _, e := m.Arrive(jobA, plan.ID, "a0", t0, time.Second, &ReleaseCheck{Live: live})
			assert.Equal(t, ArrivalDropped, arrival)
			require.NotNil(t, e.Dropped)
			assert.Equal(t, DropMemberGone, e.Dropped.Cause)
			assert.Equal(t, tc.reason, e.Dropped.Reason)
			assert.Empty(t, e.Allow)
			require.NotNil(t, e.Reject)
			assert.Nil(t, m.Plan(jobA))
		})
	}
}

// A plan is not released below a quorum raised while its members were
// reserved (a PodGroup's minCount changed): it is dropped, to be made
// again at once for the new quorum; a quorum the plan still meets releases
// it.
func TestArriveDoesNotReleaseBelowARaisedQuorum(t *testing.T) {
	for _, tc := range []struct {
		quorum   int
		released bool
	}{{3, true}, {4, false}} { // two slots, one member counted on as bound
		plan := twoMembers()
		m := installed(t, jobA, plan)
		check := &ReleaseCheck{Quorum: tc.quorum}
		arrival, _, _ := m.Arrive(jobA, plan.ID, "a1", t0, time.Second, check)
		require.Equal(t, ArrivalWait, arrival)
		arrival, _, e := m.Arrive(jobA, plan.ID, "a0", t0, time.Second, check)
		if tc.released {
			assert.Equal(t, ArrivalComplete, arrival, "quorum %d", tc.quorum)
			continue
		}
		assert.Equal(t, ArrivalDropped, arrival, "quorum %d", tc.quorum)
		require.NotNil(t, e.Dropped)
		assert.Equal(t, DropQuorumRaised, e.Dropped.Cause)
		assert.Equal(t, "the gang's quorum rose to 4 while its plan for 3 members was being reserved", e.Dropped.Reason)
		assert.Zero(t, e.Dropped.Backoff, "planned again at once")
		assert.Empty(t, e.Allow)
		assert.Nil(t, m.Plan(jobA))
	}
}

// A member reaching Permit after the deadline, before the deadline's timer
// fired, times the plan out itself: the member that arrives is not the
// one refused, so its Unreserve neither avoids its node nor counts a
// rejection.
func TestArriveAfterTheDeadlineTimesThePlanOut(t *testing.T) {
	plan := twoMembers()
	m := installed(t, jobA, plan)
	m.Reserved(jobA, plan.ID, "a1")
	late := t0.Add(time.Minute)
	arrival, _, e := m.Arrive(jobA, plan.ID, "a0", late, time.Second, nil)
	assert.Equal(t, ArrivalDropped, arrival)
	require.NotNil(t, e.Dropped)
	assert.Equal(t, DropTimeout, e.Dropped.Cause)
	assert.Equal(t, "timed out after 1m0s with 1 of 2 members reserved", e.Dropped.Reason)
	assert.Equal(t, time.Second, e.Dropped.Backoff)
	assert.Equal(t, plan.ID, e.StopDeadline)
	require.NotNil(t, e.Reject)
	assert.Equal(t, plan.Slots, e.Reject.Members)
	require.NotNil(t, e.Notice)
	assert.Equal(t, OutcomeTimedOut, e.Notice.Outcome)
	assert.Equal(t, PhaseBackingOff, m.Phase(jobA))
	assert.Nil(t, m.Plan(jobA))

	after := m.Rejected(jobA, plan.ID, "a0", "a0", "n1", late, late.Add(time.Minute), time.Second)
	assert.Empty(t, after, "the member's own Unreserve finds the plan gone")
	assert.Empty(t, m.Avoided(jobA, late), "no node refused the member")
	assert.Empty(t, m.Expire(jobA, plan.ID, late, time.Second), "the timer that fires later finds nothing")
}

// An active plan's phase stands while a member's cycle reports the gang
// short, invalid or without room (another profile's cycle, an OrderedReady
// StatefulSet's pod each cycle): the plan still holds its slots.
func TestActivePlanKeepsItsPhase(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report func(m *Manager) Effects
	}{
		{"waiting", func(m *Manager) Effects {
			return m.Refused(jobA, Refusal{Outcome: OutcomeWaitingForMembers, Message: "short"}, t0)
		}},
		{"invalid", func(m *Manager) Effects {
			return m.Refused(jobA, Refusal{Outcome: OutcomeNotPossible, Message: "one at a time"}, t0)
		}},
		{"unplaceable", func(m *Manager) Effects {
			return m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := installed(t, jobA, twoMembers())
			e := tc.report(m)
			assert.NotNil(t, e.Notice, "the report is still announced")
			assert.Equal(t, PhasePlanned, m.Phase(jobA))
			assert.NotNil(t, m.Plan(jobA))
		})
	}
}

// A member its completed plan allowed that fails to bind, or is deleted
// while binding, keeps the gang from Bound: it is placed again.
func TestAllowedMemberLostIsNotBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(m *Manager, planID int64)
	}{
		{"failed to bind", func(m *Manager, planID int64) {
			m.Rejected(jobA, planID, "a1", "a1", "n2", t0, t0.Add(time.Minute), time.Second)
		}},
		{"deleted", func(m *Manager, _ int64) { m.MemberGone(jobA, "a1", "a1", t0, time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := twoMembers()
			m := installed(t, jobA, plan)
			m.Arrive(jobA, plan.ID, "a1", t0, time.Second, nil)
			arrival, _, _ := m.Arrive(jobA, plan.ID, "a0", t0, time.Second, nil)
			require.Equal(t, ArrivalComplete, arrival)

			tc.lose(m, plan.ID)
			assert.Equal(t, PhaseDropped, m.Phase(jobA))
			m.MemberBound(jobA, "a0", t0)
			assert.Equal(t, PhaseDropped, m.Phase(jobA), "one of two allowed members bound")
			assert.Empty(t, m.InFlight(jobA))
			until := m.Admit(jobA, t0, t0).BackoffUntil
			assert.False(t, until.After(t0), "no backoff: the gang is planned again at once")
		})
	}
}

func TestDrops(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drop    func(m *Manager, planID int64) Effects
		phase   Phase
		outcome Outcome
		cause   DropCause
		backoff time.Duration
		reason  string
		avoided map[types.UID]map[string]bool
	}{
		{
			name:  "timeout",
			drop:  func(m *Manager, id int64) Effects { return m.Expire(jobA, id, t0.Add(time.Minute), 5*time.Second) },
			phase: PhaseBackingOff, outcome: OutcomeTimedOut, cause: DropTimeout, backoff: 5 * time.Second,
			reason: "timed out after 1m0s with 0 of 2 members reserved",
		},
		{
			name: "rejected at Permit or binding: the pair is avoided",
			drop: func(m *Manager, id int64) Effects {
				return m.Rejected(jobA, id, "a1", "a-1", "n2", t0, t0.Add(time.Minute), 5*time.Second)
			},
			phase: PhaseBackingOff, outcome: OutcomeRejected, cause: DropRejected, backoff: 5 * time.Second,
			reason:  "member a-1 was rejected or failed to bind on node n2",
			avoided: map[types.UID]map[string]bool{"a1": {"n2": true}},
		},
		{
			name: "plan broken at a slot a Filter refused",
			drop: func(m *Manager, id int64) Effects {
				return m.PlanBroken(jobA, id, "a0", "n1", "refused", true, t0, t0.Add(time.Minute), 5*time.Second)
			},
			phase: PhaseBackingOff, outcome: OutcomeRejected, cause: DropPlanBroken, backoff: 5 * time.Second,
			reason: "refused", avoided: map[types.UID]map[string]bool{"a0": {"n1": true}},
		},
		{
			name:  "a planned member left",
			drop:  func(m *Manager, _ int64) Effects { return m.MemberGone(jobA, "a0", "a-0", t0, 5*time.Second) },
			phase: PhaseBackingOff, outcome: OutcomeRejected, cause: DropMemberGone, backoff: 5 * time.Second,
			reason: "member a-0 was deleted or finished",
		},
		{
			name:  "a bound member the plan counts on for the quorum left",
			drop:  func(m *Manager, _ int64) Effects { return m.MemberGone(jobA, "a2", "a-2", t0, 5*time.Second) },
			phase: PhaseBackingOff, outcome: OutcomeRejected, cause: DropMemberGone, backoff: 5 * time.Second,
			reason: "member a-2 was deleted or finished",
		},
		{
			name: "a planned node changed: no backoff, every member avoids it",
			drop: func(m *Manager, id int64) Effects {
				return m.NodeChanged(jobA, id, "n1", "was cordoned", t0, t0.Add(time.Minute))
			},
			phase: PhaseDropped, outcome: OutcomeRejected, cause: DropNodeChanged, backoff: 0,
			reason:  "planned node n1 was cordoned",
			avoided: map[types.UID]map[string]bool{"a0": {"n1": true}, "a1": {"n1": true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := twoMembers()
			m := installed(t, jobA, plan)
			e := tc.drop(m, plan.ID)
			assert.Equal(t, tc.phase, m.Phase(jobA))
			assert.Nil(t, m.Plan(jobA))
			assert.Empty(t, m.Held(AnyPriority), "a dropped plan holds nothing")
			require.NotNil(t, e.Dropped)
			assert.Equal(t, tc.cause, e.Dropped.Cause)
			assert.Equal(t, tc.reason, e.Dropped.Reason)
			assert.Equal(t, tc.backoff, e.Dropped.Backoff)
			assert.Equal(t, plan.ID, e.StopDeadline)
			require.NotNil(t, e.Reject)
			assert.Equal(t, plan.Slots, e.Reject.Members, "every planned member waiting at Permit is rejected")
			require.NotNil(t, e.Notice)
			assert.Equal(t, tc.outcome, e.Notice.Outcome)
			assert.Contains(t, withoutDue(e.Timers), Timer{Key: jobA, Kind: TimerBackoffEnded, After: tc.backoff})
			if tc.avoided != nil {
				assert.Equal(t, tc.avoided, m.Avoided(jobA, t0))
				assert.Contains(t, withoutDue(e.Timers), Timer{Key: jobA, Kind: TimerAvoidEnded, After: time.Minute})
			}
			assert.Equal(t, uint64(1), releases(m, Key{Kind: KindJob, Namespace: "ns", Name: "planning"}))
		})
	}
}

// A drop names the reserved members to reject even if they are not
// waiting at Permit yet, but not the rejected member that caused it: it left
// the plan and will not wait.
func TestDropNamesReservedMembersButNotTheRejectedOne(t *testing.T) {
	for _, tc := range []struct {
		name     string
		drop     func(m *Manager, planID int64) Effects
		reserved []types.UID
	}{
		{
			name:     "timeout",
			drop:     func(m *Manager, id int64) Effects { return m.Expire(jobA, id, t0.Add(time.Minute), time.Second) },
			reserved: []types.UID{"a0", "a1"},
		},
		{
			name: "a1 rejected",
			drop: func(m *Manager, id int64) Effects {
				return m.Rejected(jobA, id, "a1", "a-1", "n2", t0, t0.Add(time.Minute), time.Second)
			},
			reserved: []types.UID{"a0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := twoMembers()
			m := installed(t, jobA, plan)
			m.Reserved(jobA, plan.ID, "a0")
			m.Reserved(jobA, plan.ID, "a1")
			e := tc.drop(m, plan.ID)
			require.NotNil(t, e.Reject)
			assert.Equal(t, tc.reserved, e.Reject.Reserved)
		})
	}
}

// A transition aimed at a plan that is no longer the gang's changes
// nothing of the plan in force.
func TestTransitionsOfAnOldPlanAreNoOps(t *testing.T) {
	plan := twoMembers()
	m := installed(t, jobA, plan)
	old := plan.ID + 100
	assert.Empty(t, m.Drop(jobA, old, DropRejected, "old", t0, time.Second))
	assert.Empty(t, m.Expire(jobA, old, t0, time.Second))
	assert.Empty(t, m.NodeChanged(jobA, old, "n1", "was deleted", t0, t0.Add(time.Minute)))
	e := m.Rejected(jobA, old, "a1", "a-1", "n2", t0, t0.Add(time.Minute), time.Second)
	assert.Nil(t, e.Dropped)
	assert.Empty(t, m.Avoided(jobA, t0), "a member of an old plan avoids nothing")
	m.Reserved(jobA, old, "a0")
	assert.Equal(t, 0, m.Plan(jobA).Reserved.Len())
	assert.Empty(t, m.MemberGone(jobA, "stranger", "s", t0, time.Second), "a member the plan does not place")
	assert.Equal(t, PhasePlanned, m.Phase(jobA))
}

func TestMemberGoneNamesAPodAlone(t *testing.T) {
	m := NewManager()
	plan := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"p": "n1"}}, Reserved: sets.New[types.UID](), Created: t0, Deadline: t0.Add(time.Minute)}
	_, ok := m.Install(loneP, plan, "p", "planned", t0, nil, 0)
	require.True(t, ok)
	e := m.MemberGone(loneP, "p", "p", t0, time.Second)
	require.NotNil(t, e.Dropped)
	assert.Equal(t, "pod p was deleted or finished", e.Dropped.Reason)
	require.NotNil(t, e.Notice)
	assert.Equal(t, "pod ns/p: pod p was deleted or finished; released all 1 planned members (retry in 1s)", e.Notice.Message,
		"a pod scheduled alone is named as a pod, not as a gang")
}

func TestVictimsGone(t *testing.T) {
	plan := twoMembers("v1", "v2")
	m := installed(t, jobA, plan)
	assert.True(t, m.IsVictim("v1"))
	assert.Empty(t, m.VictimGone("v1", "other-profile"), "only the profile whose plan waits acts")
	assert.Empty(t, m.VictimGone("v1", "muster"))
	assert.Equal(t, PhasePreempting, m.Phase(jobA))
	e := m.VictimGone("v2", "muster")
	require.Len(t, e.Wake, 1)
	assert.Equal(t, WakeVictimsGone, e.Wake[0].Reason)
	assert.Equal(t, 0, e.Wake[0].Plan.Victims.Len())
	assert.Equal(t, PhasePlanned, m.Phase(jobA))
	assert.Empty(t, m.VictimGone("v2", "muster"), "a victim is gone once")
}

// Explaining a gang that cannot go ahead: each sets the phase; the notice
// is published once per change.
func TestExplanations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		explain func(m *Manager) Effects
		phase   Phase
		outcome Outcome
	}{
		{"waiting for members", func(m *Manager) Effects {
			return m.Refused(jobA, Refusal{Outcome: OutcomeWaitingForMembers, Message: "1 of 2"}, t0)
		}, PhaseWaitingForMembers, OutcomeWaitingForMembers},
		{"invalid", func(m *Manager) Effects { return m.Refused(jobA, Refusal{Outcome: OutcomeInvalid, Message: "bad"}, t0) }, PhaseInvalid, OutcomeInvalid},
		{"unplaceable", func(m *Manager) Effects {
			return m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
		}, PhaseUnschedulable, OutcomeUnschedulable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager()
			e := tc.explain(m)
			require.NotNil(t, e.Notice)
			assert.Equal(t, tc.outcome, e.Notice.Outcome)
			assert.Equal(t, tc.phase, m.Phase(jobA))
			assert.Nil(t, tc.explain(m).Notice, "the same explanation twice is published once")
		})
	}
}

func TestAdmit(t *testing.T) {
	plan := twoMembers()
	m := installed(t, jobA, plan)
	a := m.Admit(jobA, t0.Add(time.Hour), t0)
	require.NotNil(t, a.Plan)
	assert.Equal(t, plan.ID, a.Plan.ID)
	assert.Nil(t, a.Planning, "a planned gang is not planned again")
	assert.Equal(t, t0, m.FirstSeen(jobA, t0.Add(time.Hour)), "admitting again does not move the gang in the queue")
	m.Drop(jobA, plan.ID, DropRejected, "broken", t0, 5*time.Second)
	a = m.Admit(jobA, t0, t0)
	assert.Nil(t, a.Plan)
	assert.Equal(t, t0.Add(5*time.Second), a.BackoffUntil)
	assert.Equal(t, "broken", a.Why)
	assert.Nil(t, a.Planning, "a gang that backs off is not planned")

	// After the backoff: what planning needs, read in the same step.
	other := Key{Kind: KindJob, Namespace: "ns", Name: "other"}
	_, ok := m.Install(other, twoMembers(), "a0", "planned", t0, nil, 0)
	require.True(t, ok)
	avoidFor(m, jobA, "n3", t0, t0.Add(time.Hour), "a0")
	m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room", Reuse: &ReusableRefusal{Epoch: Epoch{Snapshot: 1, Releases: 1}, Pending: 2, Needed: 2, Valid: time.Hour}}, t0)
	later := t0.Add(5 * time.Second)
	a = m.Admit(jobA, t0, later)
	require.NotNil(t, a.Planning)
	assert.Equal(t, uint64(1), a.Planning.Releases)
	assert.Equal(t, m.HeldForOthers(jobA, AnyPriority), a.Planning.HeldByOthers())
	assert.Equal(t, map[types.UID]map[string]bool{"a0": {"n3": true}}, a.Planning.Avoided)
	msg, reused := a.Planning.Reuse(Epoch{Snapshot: 1, Releases: 1}, 2, 2, later)
	assert.True(t, reused)
	assert.Equal(t, "no room", msg)
}

func TestDisplace(t *testing.T) {
	// Plans of lower priority holding room for an unreserved member on a
	// node the new plan uses give way, without backoff; the others stay.
	m := NewManager()
	install := func(name string, prio int32, slots map[types.UID]string, reserved ...types.UID) (Key, Effects) {
		t.Helper()
		key := Key{Kind: KindJob, Namespace: "ns", Name: name}
		plan := twoMembers()
		plan.Slots, plan.Priority, plan.Reserved = slots, prio, sets.New(reserved...)
		e, ok := m.Install(key, plan, "", "planned", t0, nil, 0)
		require.True(t, ok)
		return key, e
	}
	equalHere, _ := install("equal-here", 5, map[types.UID]string{"e0": "n1"})
	lowHere, e := install("low-here", 1, map[types.UID]string{"l0": "n1", "l1": "n9"})
	assert.Empty(t, e.Displaced, "a plan of lower priority displaces nothing")
	lowElsewhere, _ := install("low-elsewhere", 1, map[types.UID]string{"o0": "n9"})
	lowReservedHere, _ := install("low-reserved-here", 1, map[types.UID]string{"r0": "n2", "r1": "n9"}, "r0")
	high, e := install("high", 5, map[types.UID]string{"h0": "n1", "h1": "n2"})

	effects := e.Displaced
	require.Len(t, effects, 1)
	assert.Equal(t, lowHere, effects[0].Dropped.Key)
	assert.Equal(t, DropDisplaced, effects[0].Dropped.Cause)
	assert.Zero(t, effects[0].Dropped.Backoff)
	assert.Equal(t, PhaseDropped, m.Phase(lowHere))
	for _, kept := range []Key{equalHere, lowElsewhere, lowReservedHere, high} {
		assert.NotNil(t, m.Plan(kept), "%s", kept)
	}
	assert.NotContains(t, m.Held(5), "n9", "a plan of lower priority holds nothing from priority 5")
	assert.Contains(t, m.Held(1), "n9")
}

// A plan's deadline drops the plan it was set for, and only that one; the
// end of a backoff or an avoidance wakes the gang in every profile.
func TestTimerFired(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	plan := m.Plan(jobA)
	stale := m.TimerFired(Timer{Key: jobA, Kind: TimerPlanDeadline, PlanID: plan.ID + 1, Due: t0.Add(time.Minute)}, time.Second)
	assert.Equal(t, Effects{}, stale, "a deadline of another plan")
	assert.NotNil(t, m.Plan(jobA))

	e := m.TimerFired(Timer{Key: jobA, Kind: TimerPlanDeadline, PlanID: plan.ID, Due: t0.Add(time.Minute)}, time.Second)
	require.NotNil(t, e.Dropped)
	assert.Equal(t, DropTimeout, e.Dropped.Cause)
	assert.Nil(t, m.Plan(jobA))
	assert.Equal(t, t0.Add(time.Minute+time.Second), m.Admit(jobA, t0, t0).BackoffUntil, "backed off from the time it was due")

	for kind, reason := range map[TimerKind]WakeReason{TimerBackoffEnded: WakeBackoffEnded, TimerAvoidEnded: WakeAvoidEnded} {
		e := m.TimerFired(Timer{Key: jobA, Kind: kind, Due: t0}, time.Second)
		assert.Equal(t, []Wake{{Key: jobA, Reason: reason, AllProfiles: true}}, e.Wake, reason.String())
	}
}

// An allowed member that fails to bind breaks the gang's newer plan that
// counted on it bound, as its deletion would.
func TestRejectedMemberBreaksTheNewerPlanThatCountedOnIt(t *testing.T) {
	m := NewManager()
	first := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"a2": "n3"}}, Reserved: sets.New[types.UID](), Victims: sets.New[types.UID](),
		Created: t0, Deadline: t0.Add(time.Minute)}
	_, ok := m.Install(jobA, first, "a2", "planned", t0, nil, 0)
	require.True(t, ok)
	firstID := m.Plan(jobA).ID
	arrival, _, _ := m.Arrive(jobA, firstID, "a2", t0, time.Second, nil)
	require.Equal(t, ArrivalComplete, arrival) // a2 is allowed and binding

	second := twoMembers() // counts on a2
	_, ok = m.Install(jobA, second, "a0", "planned", t0, nil, 0)
	require.True(t, ok)
	e := m.Rejected(jobA, firstID, "a2", "a-2", "n3", t0, t0.Add(time.Minute), time.Second)
	require.NotNil(t, e.Dropped, "the plan counting on a2 stands")
	assert.Equal(t, DropRejected, e.Dropped.Cause)
	assert.Nil(t, m.Plan(jobA))
}

// Forgetting a gang that still has a plan releases it as a drop does: the
// gangs that found no room are woken; nothing is said of the gang itself.
func TestForgetReleasesAnActivePlan(t *testing.T) {
	m := installed(t, jobA, twoMembers("v1"))
	other := Key{Kind: KindJob, Namespace: "ns", Name: "other"}
	m.Refused(other, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
	before := m.Admit(other, t0, t0).Planning.Releases

	e, known := m.Forget(jobA, t0)
	assert.True(t, known)
	assert.Contains(t, e.Wake, Wake{Key: other, Reason: WakeCapacityFreed, AllProfiles: true})
	assert.Nil(t, e.Notice)
	assert.Empty(t, e.Timers)
	assert.False(t, m.IsVictim("v1"), "a victim of a forgotten plan stays protected")
	assert.Greater(t, m.Admit(other, t0, t0).Planning.Releases, before, "a failed plan of the old capacity may be reused")
	assert.Empty(t, m.Held(0))
}

// present is a Presence over fixed sets: members not standing, members not
// bound, victims gone.
type present struct{ gone, unbound, victimsGone sets.Set[types.UID] }

func (p present) Member(uid types.UID) (string, bool, bool) {
	return string(uid), !p.gone.Has(uid), !p.unbound.Has(uid)
}
func (p present) Victim(uid types.UID) bool { return !p.victimsGone.Has(uid) }

// TestInstallActsForPodsThatLeftWhileThePlanWasMade: Install reads, under
// the manager's lock, what stands of the plan's pods. A member placed or
// counted on that left drops the plan before it displaces a lower plan;
// so does a member counted on as bound whose binding failed (neither bound
// nor in flight); a victim that left is not waited for.
func TestInstallActsForPodsThatLeftWhileThePlanWasMade(t *testing.T) {
	none := sets.New[types.UID]
	for _, tc := range []struct {
		name     string
		present  present
		inFlight bool // a2, counted on as bound, is allowed and binding
		victims  []types.UID
		// cause and reason of the drop; "" when the plan stands.
		cause       DropCause
		reason      string
		phase       Phase
		victimsLeft []types.UID
	}{
		{name: "all stand", present: present{none(), none(), none()}, phase: PhasePlanned},
		{name: "a placed member left", present: present{none("a1"), none(), none()},
			cause: DropMemberGone, reason: "member a1 left while the plan was made", phase: PhaseBackingOff},
		{name: "a member counted on left", present: present{none("a2"), none(), none()},
			cause: DropMemberGone, reason: "member a2 left while the plan was made", phase: PhaseBackingOff},
		{name: "a member counted on failed to bind", present: present{none(), none("a2"), none()},
			cause: DropRejected, reason: "member a2, counted on as bound, failed to bind while the plan was made", phase: PhaseBackingOff},
		{name: "a member counted on is still in flight", present: present{none(), none("a2"), none()}, inFlight: true, phase: PhasePlanned},
		{name: "one victim left", present: present{none(), none(), none("v1")}, victims: []types.UID{"v1", "v2"},
			phase: PhasePreempting, victimsLeft: []types.UID{"v2"}},
		{name: "every victim left", present: present{none(), none(), none("v1", "v2")}, victims: []types.UID{"v1", "v2"},
			phase: PhasePlanned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager()
			low := Key{Kind: KindJob, Namespace: "ns", Name: "low"}
			lowPlan := twoMembers()
			lowPlan.Slots, lowPlan.CountsOn = map[types.UID]string{"l0": "n1"}, nil
			_, ok := m.Install(low, lowPlan, "", "planned", t0, nil, 0)
			require.True(t, ok)
			if tc.inFlight {
				m.get(jobA, t0).inFlight["a2"] = "n3"
			}
			plan := twoMembers(tc.victims...)
			plan.Priority = 5
			e, ok := m.Install(jobA, plan, "a0", "planned", t0, tc.present, time.Second)
			require.True(t, ok)
			assert.Equal(t, tc.phase, m.Phase(jobA))
			if tc.reason != "" {
				require.NotNil(t, e.Dropped)
				assert.Equal(t, tc.cause, e.Dropped.Cause)
				assert.Equal(t, tc.reason, e.Dropped.Reason)
				assert.Nil(t, m.Plan(jobA))
				assert.Empty(t, e.Displaced, "a plan dropped at once displaced a lower one")
				assert.NotNil(t, m.Plan(low), "the lower plan was dropped for a plan that never stood")
				return
			}
			require.Nil(t, e.Dropped)
			active := m.Plan(jobA)
			require.NotNil(t, active)
			assert.ElementsMatch(t, tc.victimsLeft, active.Victims.UnsortedList())
			for _, v := range tc.victims {
				assert.Equal(t, slices.Contains(tc.victimsLeft, v), m.IsVictim(v), "victim %s", v)
			}
			require.Len(t, e.Displaced, 1, "the lower plan on n1 gives way")
			if len(tc.victims) > 0 {
				assert.Equal(t, OutcomePreempting, e.Notice.Outcome)
			}
			if tc.phase == PhasePlanned {
				require.Len(t, e.Wake, 1, "the planned members are woken")
				assert.Equal(t, map[bool]WakeReason{true: WakeVictimsGone, false: WakePlanMade}[len(tc.victims) > 0], e.Wake[0].Reason)
			} else {
				assert.Empty(t, e.Wake, "members woken while victims terminate")
			}
		})
	}
}
