package gang

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/internal/testobj"
)

// fakeCycle answers Place and Unplaced as the scheduler would, from its
// fields, and counts what it was asked.
type fakeCycle struct {
	now      time.Time
	inGang   bool
	resolveE error
	ended    bool
	// gather refuses when set; otherwise a0 and a1 are pending.
	refusal *Refusal
	// plan is what Compute finds (nil: no room, screened).
	plan      *Plan
	lingering string
	held      bool
	// terminating counts pods terminating for the member on its nominated
	// node; inSnapshot, refusedAt and waits answer Unplaced.
	terminating int
	inSnapshot  bool
	refusedAt   string
	avoid       bool
	waits       string
	preemption  bool
	victims     *Victims

	gathered, computed, releasedWaiting, requested int
}

var jobRef = &v1.ObjectReference{Kind: "Job", Namespace: "ns", Name: "a"}

func (c *fakeCycle) Now() time.Time             { return c.now }
func (c *fakeCycle) Profile() string            { return "muster" }
func (c *fakeCycle) BackoffBase() time.Duration { return time.Second }
func (c *fakeCycle) Ended(Key) bool             { return c.ended }
func (c *fakeCycle) PriorityOf(*v1.Pod) int32   { return 0 }
func (c *fakeCycle) RequestOf(*v1.Pod) Resources {
	c.requested++
	return Resources{MilliCPU: 500}
}
func (c *fakeCycle) Resolve(pod *v1.Pod) (*Resolved, bool, error) {
	return &Resolved{Key: jobA, Ref: jobRef, Ask: Ask{Quorum: 2, Timeout: time.Minute}}, c.inGang, c.resolveE
}
func (c *fakeCycle) Gather(pod *v1.Pod, info *Resolved, _ *Planning) (*Gathered, *Refusal) {
	c.gathered++
	if c.refusal != nil {
		return nil, c.refusal
	}
	return &Gathered{Info: info, Pending: 2, Request: Request{Needed: 2, GPU: "nvidia.com/gpu", Members: []Member{{UID: "a0"}, {UID: "a1"}}}}, nil
}
func (c *fakeCycle) Snapshot() (int64, error) { return 7, nil }
func (c *fakeCycle) ReleaseWaiting(Key, string) int {
	c.releasedWaiting++
	return 0
}
func (c *fakeCycle) Compute(*Gathered, *Planning) Attempt {
	c.computed++
	if c.plan == nil {
		return Attempt{Message: "no room", Screened: true, FailedPlan: func() *FailedPlan { return &FailedPlan{Message: "no room"} }}
	}
	return Attempt{Plan: c.plan}
}
func (c *fakeCycle) Presence(*Gathered, []*v1.Pod) Presence  { return nil }
func (c *fakeCycle) VictimsLingering(*ActivePlan) string     { return c.lingering }
func (c *fakeCycle) HeldOut(*v1.Pod) (bool, bool)            { return c.held, true }
func (c *fakeCycle) TerminatingFor(*v1.Pod, string) int      { return c.terminating }
func (c *fakeCycle) ReleaseEarlierAllocation(*v1.Pod) string { return "" }
func (c *fakeCycle) WaitsForVictims(Key, *ActivePlan, string) (string, bool) {
	return c.waits, c.waits != ""
}
func (c *fakeCycle) InSnapshot(string) bool                    { return c.inSnapshot }
func (c *fakeCycle) RefusedAt(*v1.Pod, string) (string, bool)  { return c.refusedAt, c.avoid }
func (c *fakeCycle) Preemption() (bool, time.Duration)         { return c.preemption, time.Second }
func (c *fakeCycle) StillTerminating(Key) (int, error)         { return 0, nil }
func (c *fakeCycle) SearchVictims(*Gathered) (*Victims, error) { return c.victims, nil }

// member is gang a's member uid.
func member(uid types.UID) *v1.Pod {
	pod := testobj.MakePod("ns", string(uid)).Obj()
	pod.UID = uid
	return pod
}

var twoSlots = &Plan{Slots: map[types.UID]string{"a0": "n1", "a1": "n2"}, Nodes: 2, Level: "rack", Domain: "r1"}

func TestPlaceSteersEveryMemberOfOnePlan(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0, inGang: true, plan: twoSlots}
	first := m.Place(c, member("a0"))
	require.Nil(t, first.Stop)
	assert.True(t, first.Planned)
	assert.Equal(t, "n1", first.Node)
	assert.Equal(t, PhasePlanned, m.Phase(jobA))
	require.Len(t, first.Effects, 1)
	require.NotNil(t, first.Effects[0].Notice)
	assert.Equal(t, OutcomePlanned, first.Effects[0].Notice.Outcome)

	second := m.Place(c, member("a1"))
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
		{"no room", fakeCycle{inGang: true}, PhaseUnplaceable, "no room", 1, 0},
		{"a pod alone with a bad annotation", fakeCycle{resolveE: errors.New("bad annotation")},
			PhaseNew, "bad annotation", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager()
			c := tc.cycle
			c.now = t0
			pl := m.Place(&c, member("a0"))
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
	first := m.Place(c, member("a0"))
	require.NotNil(t, first.Stop)
	require.NotNil(t, first.FailedPlan, "the failure is news: its record is tallied")

	c.now = t0.Add(time.Second)
	second := m.Place(c, member("a1"))
	require.NotNil(t, second.Stop)
	assert.Equal(t, 1, c.computed, "the sibling's answer stands on the same snapshot")
	assert.Equal(t, 1, c.releasedWaiting)
	assert.Nil(t, second.FailedPlan)

	c.now = t0.Add(reuseFailedPlan + time.Second)
	m.Place(c, member("a1"))
	assert.Equal(t, 2, c.computed, "a failed plan is reused for a while only")
}

func TestPlaceHoldsBackForVictims(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	c := &fakeCycle{now: t0, inGang: true, lingering: "them to leave n1"}
	pl := m.Place(c, member("a0"))
	assert.True(t, pl.HeldBack)
	assert.Equal(t, "n1", pl.Node)
	require.NotNil(t, pl.Stop)
	assert.Equal(t, "gang ns/a preempted pods to make room and waits for them to leave n1", pl.Stop.Message)
}

func TestPlaceForgetsAGangThatEnded(t *testing.T) {
	m := installed(t, jobA, twoMembers())
	c := &fakeCycle{now: t0, inGang: true, ended: true}
	pl := m.Place(c, member("a0"))
	assert.Equal(t, []Key{jobA}, pl.Forgotten)
	assert.Nil(t, m.Plan(jobA), "forgetting releases the plan")
}

func TestPlaceAloneReadsTheRequestOnlyBesideHeldCapacity(t *testing.T) {
	m := NewManager()
	c := &fakeCycle{now: t0}
	pl := m.Place(c, member("p"))
	assert.Nil(t, pl.Stop)
	assert.Empty(t, pl.Held)
	assert.Equal(t, 0, c.requested)

	m = installed(t, jobA, twoMembers())
	pl = m.Place(c, member("p"))
	assert.NotEmpty(t, pl.Held)
	assert.Equal(t, Resources{MilliCPU: 500}, pl.Request)
	assert.Equal(t, 1, c.requested)
}
