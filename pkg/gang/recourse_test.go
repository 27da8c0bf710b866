package gang

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
)

func TestUnplacedMemberOfAPlan(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cycle fakeCycle
		// nominate and message are the recourse; kept: the plan stands;
		// backoff: its drop backs the gang off.
		nominate, message string
		kept, backoff     bool
	}{
		{"it waits for the victims", fakeCycle{waits: "waits for 1 preempted pod"},
			"n1", "waits for 1 preempted pod", true, false},
		{"its node left the snapshot", fakeCycle{},
			"", "gang ns/a: planned node n1 was deleted", false, false},
		{"a filter refused it at its slot", fakeCycle{inSnapshot: true, refusedAt: "Insufficient cpu", avoid: true},
			"", "gang ns/a: member a0 cannot go to its planned node n1: Insufficient cpu", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := installed(t, jobA, twoMembers())
			c := tc.cycle
			c.now = t0
			r := m.Decisions().Unplaced(&c, member("a0"))
			assert.Equal(t, tc.nominate, r.Nominate)
			assert.Equal(t, tc.message, r.Message)
			assert.Equal(t, tc.kept, m.Plan(jobA) != nil)
			admission := m.Admit(jobA, t0, t0)
			assert.Equal(t, tc.backoff, admission.BackoffUntil.After(t0), "backs off until %v", admission.BackoffUntil)
			if tc.kept {
				assert.NotNil(t, r.WaitsForCache)
			}
		})
	}
}

func TestUnplacedWithoutAPlanKeepsANominationWhileItsVictimsTerminate(t *testing.T) {
	pod := member("a0")
	pod.Status.NominatedNodeName = "n1"
	for _, tc := range []struct {
		terminating int
		nominate    string
	}{{1, "n1"}, {0, ""}} {
		m := NewManager()
		c := &fakeCycle{now: t0, inGang: true, terminating: tc.terminating}
		r := m.Decisions().Unplaced(c, pod)
		assert.Equal(t, "gang preemption is off", r.Message)
		assert.Equal(t, tc.nominate, r.Nominate, "%d terminating", tc.terminating)
	}
}

func TestPreemptInstallsThePlanAndEvicts(t *testing.T) {
	m := NewManager()
	m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
	victim := &v1.Pod{}
	victim.UID = "v1"
	c := &fakeCycle{now: t0, inGang: true, preemption: true, victims: &Victims{Plan: twoSlots, Pods: []*v1.Pod{victim},
		Units: []VictimUnit{{Name: "ns/low", GPUs: 8, Pods: 1}}}}
	r := m.Decisions().Unplaced(c, member("a0"))
	require.NoError(t, r.Err)
	assert.Equal(t, "n1", r.Nominate)
	assert.Equal(t, int64(8), r.Preempted)
	assert.NotZero(t, r.Evict)
	assert.Equal(t, "gang ns/a preempts 1 pods of ns/low (8 nvidia.com/gpu) to run in rack r1; waiting for them to terminate", r.Message)
	assert.Equal(t, PhasePreempting, m.Phase(jobA))
	assert.Same(t, jobRef, r.Owner, "the preemption is announced on the gang's owner")

	c.waits = "gang ns/a waits for 1 preempted pods to terminate"
	again := m.Decisions().Unplaced(c, member("a1"))
	assert.Zero(t, again.Evict, "a gang with a plan does not preempt again")
	assert.Equal(t, "n2", again.Nominate, "its member waits at its slot")
}

func TestPreemptOnlyForAGangWaitingForCapacity(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0, inGang: true, preemption: true, victims: &Victims{Plan: twoSlots}}
	r := m.Decisions().Preempt(c, member("a0"))
	assert.Equal(t, "gang is not waiting for capacity", r.Message)
	assert.Zero(t, r.Evict)
	assert.Equal(t, 0, c.gathered)
}

// While a restarted scheduler still finishes the evictions its earlier run
// began, a gang waiting for capacity does not search for victims of its
// own: it is told so, and no plan, eviction or error comes of it.
func TestPreemptWaitsForEarlierEvictions(t *testing.T) {
	m := NewManager()
	m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, t0)
	c := &fakeCycle{now: t0, inGang: true, preemption: true, searchErr: ErrEarlierEvictionsUnfinished,
		victims: &Victims{Plan: twoSlots, Units: []VictimUnit{{Name: "ns/low", GPUs: 8, Pods: 1}}}}
	r := m.Decisions().Unplaced(c, member("a0"))
	require.NoError(t, r.Err)
	assert.Zero(t, r.Evict)
	assert.Empty(t, r.Nominate)
	assert.Equal(t, "gang ns/a: the preemptions begun before this scheduler started are still being finished", r.Message)
	assert.Nil(t, m.Plan(jobA), "no plan installed")
}
