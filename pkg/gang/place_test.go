package gang

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
)

func TestPlaceSteersEveryMemberOfOnePlan(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0, inGang: true, plan: twoSlots}
	first := m.Decisions().Place(c, member("a0"))
	require.Nil(t, first.Stop)
	assert.True(t, first.Planned)
	assert.Equal(t, "n1", first.Node)
	assert.Equal(t, PhasePlanned, m.Phase(jobA))
	require.Len(t, first.Effects, 1)
	require.NotNil(t, first.Effects[0].Notice)
	assert.Equal(t, OutcomePlanned, first.Effects[0].Notice.Outcome)

	second := m.Decisions().Place(c, member("a1"))
	require.Nil(t, second.Stop)
	assert.False(t, second.Planned, "the sibling follows the plan made")
	assert.Equal(t, "n2", second.Node)
	assert.Equal(t, 1, c.gathered, "the plan is made once")
}

func TestPlaceRefusals(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cycle     fakeCycle
		phase     Phase
		message   string
		gathered  int
		podEvents int
	}{
		{"too few members", fakeCycle{inGang: true, refusal: &Refusal{Outcome: OutcomeWaitingForMembers, Message: "1 of 2"}},
			PhaseWaitingForMembers, "1 of 2", 1, 0},
		{"an invalid annotation", fakeCycle{inGang: true, resolveE: errors.New("bad annotation")},
			PhaseInvalid, "bad annotation", 0, 0},
		{"no room", fakeCycle{inGang: true}, PhaseUnschedulable, "no room", 1, 0},
		{"a pod alone with a bad annotation", fakeCycle{resolveE: errors.New("bad annotation")},
			PhasePending, "bad annotation", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager()
			c := tc.cycle
			c.now = t0
			pl := m.Decisions().Place(&c, member("a0"))
			require.NotNil(t, pl.Stop)
			assert.Equal(t, tc.message, pl.Stop.Message)
			assert.False(t, pl.Stop.Retry)
			assert.Equal(t, tc.phase, m.Phase(jobA))
			assert.Equal(t, tc.gathered, c.gathered)
			assert.Len(t, pl.PodEvents, tc.podEvents)
		})
	}
}

func TestPlaceReusesASiblingsFailedPlan(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0, inGang: true}
	first := m.Decisions().Place(c, member("a0"))
	require.NotNil(t, first.Stop)
	require.NotNil(t, first.FailedPlan, "the failure is news: its record is tallied")

	c.now = t0.Add(time.Second)
	second := m.Decisions().Place(c, member("a1"))
	require.NotNil(t, second.Stop)
	assert.Equal(t, 1, c.computed, "the sibling's answer stands on the same snapshot")
	assert.Equal(t, 1, c.releasedWaiting)
	assert.Nil(t, second.FailedPlan)

	c.now = t0.Add(reuseRefusal + time.Second)
	m.Decisions().Place(c, member("a1"))
	assert.Equal(t, 2, c.computed, "a failed plan is reused for a while only")
}

// The member whose cycle planned the gang and found no room leads it: a
// sibling that reuses the answer does not take the lead, the next member
// that plans again does, and a gang with a plan has no lead.
func TestPlaceNamesTheLeadOfAGangWaitingForRoom(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0, inGang: true}
	_, _, ok := m.Lead(jobA)
	assert.False(t, ok, "a gang never planned has no lead")
	m.Decisions().Place(c, member("a0"))
	uid, name, ok := m.Lead(jobA)
	require.True(t, ok)
	assert.Equal(t, types.UID("a0"), uid)
	assert.Equal(t, "a0", name)

	m.Decisions().Place(c, member("a1"))
	uid, _, _ = m.Lead(jobA)
	assert.Equal(t, types.UID("a0"), uid, "reusing the sibling's answer does not lead")

	c.now = t0.Add(reuseRefusal + time.Second)
	m.Decisions().Place(c, member("a1"))
	uid, _, _ = m.Lead(jobA)
	assert.Equal(t, types.UID("a1"), uid, "the member that planned again leads")

	c.plan = &Plan{Slots: map[types.UID]string{"a0": "n1", "a1": "n2"}}
	c.now = t0.Add(2*reuseRefusal + 2*time.Second)
	m.Decisions().Place(c, member("a0"))
	require.NotNil(t, m.Plan(jobA))
	_, _, ok = m.Lead(jobA)
	assert.False(t, ok, "a planned gang has no lead")
}

func TestPlaceHoldsBackForVictims(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	c := &fakeCycle{now: t0, inGang: true, lingering: "them to leave n1"}
	pl := m.Decisions().Place(c, member("a0"))
	assert.True(t, pl.HeldBack)
	assert.Equal(t, "n1", pl.Node)
	require.NotNil(t, pl.Stop)
	assert.Equal(t, "gang ns/a preempted pods to make room and waits for them to leave n1", pl.Stop.Message)
}

func TestPlaceForgetsAGangThatEnded(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	c := &fakeCycle{now: t0, inGang: true, ended: true}
	pl := m.Decisions().Place(c, member("a0"))
	assert.Equal(t, []Key{jobA}, pl.Forgotten)
	assert.Nil(t, m.Plan(jobA), "forgetting releases the plan")
}

func TestPlaceAloneReadsTheRequestOnlyBesideHeldCapacity(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0}
	pl := m.Decisions().Place(c, member("p"))
	assert.Nil(t, pl.Stop)
	assert.Empty(t, pl.Held)
	assert.Equal(t, 0, c.requested)

	m = installed(t, jobA, twoMembers())
	pl = m.Decisions().Place(c, member("p"))
	assert.NotEmpty(t, pl.Held)
	assert.Equal(t, Resources{MilliCPU: 500}, pl.Request)
	assert.Equal(t, 1, c.requested)
}
