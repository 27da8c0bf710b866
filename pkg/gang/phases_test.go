package gang

import (
	"maps"
	"math/rand"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// The state diagram in docs/architecture.md is the lifecycle table drawn:
// a move added, removed or renamed in one and not the other fails here.
func TestArchitectureDiagramIsTheLifecycle(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)```mermaid\n(stateDiagram-v2\n.*?)```").FindSubmatch(doc)
	require.NotNil(t, block, "docs/architecture.md has no mermaid stateDiagram-v2 block")
	assert.Equal(t, Diagram(), string(block[1]),
		"docs/architecture.md's state diagram differs from the lifecycle table (pkg/gang/phases.go); paste this block:\n%s", Diagram())
}

// Every phase the lifecycle names is reachable from the start, and the
// drop cause, not the backoff's length, decides between BackingOff and
// Dropped.
func TestLifecycle(t *testing.T) {
	reached := map[Phase]bool{phaseStart: true}
	for changed := true; changed; {
		changed = false
		for _, row := range lifecycle {
			for _, from := range row.From {
				if reached[from] && !reached[row.To] {
					reached[row.To], changed = true, true
				}
			}
		}
	}
	for _, p := range []Phase{PhaseSuspended, PhasePending, PhaseWaitingForMembers, PhaseInvalid, PhaseUnschedulable,
		PhasePreempting, PhasePlanned, PhasePermitted, PhaseBound, PhaseBackingOff, PhaseDropped, PhaseFinished} {
		assert.True(t, reached[p], "%s is not reachable", p)
	}

	for cause, want := range map[DropCause]Phase{DropTimeout: PhaseBackingOff, DropRejected: PhaseBackingOff,
		DropMemberGone: PhaseBackingOff, DropPlanBroken: PhaseBackingOff, DropNodeChanged: PhaseDropped,
		DropDisplaced: PhaseDropped, DropQuorumRaised: PhaseDropped} {
		m := installed(t, jobA, twoMembers())
		e := m.Drop(jobA, 0, cause, "test", t0, 0) // no backoff configured: the cause still decides
		assert.Equal(t, want, m.Phase(jobA), "dropped for %s", cause)
		require.NotNil(t, e.Notice)
		assert.Equal(t, want, e.Notice.Outcome.Phase(e.Notice.Message), "the phase kubectl muster reads from the notice of %s", cause)
	}
}

// A random life, driven through the manager's transitions with a seeded
// source: after every step the phase agrees with the gang's plan (Planned
// or Preempting exactly while one is active) and the index of
// unschedulable gangs with the phase. A move the table lacks would leave a
// gang Planned without a plan, or Permitted with one.
func TestLifecycleKeepsThePhaseWithThePlan(t *testing.T) {
	rng := rand.New(rand.NewSource(49))
	m := NewManager()
	now := t0
	steps := []struct {
		name string
		do   func()
	}{
		{"refused, too few", func() {
			m.Refused(jobA, Refusal{Outcome: OutcomeWaitingForMembers, Message: "few"}, now)
		}},
		{"refused, no room", func() {
			m.Refused(jobA, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, now)
		}},
		{"refused, invalid", func() { m.Refused(jobA, Refusal{Outcome: OutcomeInvalid, Message: "bad"}, now) }},
		{"held out", func() { m.HeldOut(jobA, rng.Intn(2) == 0, now) }},
		{"install", func() {
			p := twoMembers()
			p.CountsOn.Clear()
			p.Created, p.Deadline = now, now.Add(time.Minute)
			m.Install(jobA, p, "a0", "planned", now, nil, time.Second)
		}},
		{"install with a victim", func() {
			p := twoMembers("v")
			p.CountsOn.Clear()
			p.Created, p.Deadline = now, now.Add(time.Minute)
			m.Install(jobA, p, "a0", "preempting", now, nil, time.Second)
		}},
		{"victim gone", func() { m.VictimGone("v", "muster") }},
		{"arrive", func() {
			if p := m.Plan(jobA); p != nil {
				for _, uid := range []types.UID{"a0", "a1"} {
					m.Arrive(jobA, p.ID, uid, now, time.Second, nil)
				}
			}
		}},
		{"a member bound", func() { m.MemberBound(jobA, []types.UID{"a0", "a1"}[rng.Intn(2)], now) }},
		{"every allowed member bound", func() {
			for _, uid := range slices.Sorted(maps.Keys(m.InFlight(jobA))) {
				m.MemberBound(jobA, uid, now)
			}
		}},
		{"rejected", func() {
			var id int64
			if p := m.Plan(jobA); p != nil {
				id = p.ID
			}
			m.Rejected(jobA, id, "a1", "a1", "n2", now, now.Add(time.Minute), time.Second)
		}},
		{"member gone", func() { m.MemberGone(jobA, "a0", "a0", now, time.Second) }},
		{"drop", func() { m.Drop(jobA, 0, DropCause(rng.Intn(len(dropCauseNames))), "test", now, time.Second) }},
		{"node changed", func() {
			if p := m.Plan(jobA); p != nil {
				m.NodeChanged(jobA, p.ID, "n1", "was deleted", now, now.Add(time.Minute))
			}
		}},
	}
	seen := map[Phase]bool{}
	for i := range 5000 {
		now = now.Add(time.Duration(rng.Intn(3000)) * time.Millisecond)
		step := steps[rng.Intn(len(steps))]
		step.do()
		phase, plan := m.Phase(jobA), m.Plan(jobA)
		seen[phase] = true
		active := phase == PhasePlanned || phase == PhasePreempting
		require.Equal(t, active, plan != nil, "step %d (%s): phase %s with plan %v", i, step.name, phase, plan != nil)
		if plan != nil {
			require.Equal(t, plan.Victims.Len() > 0, phase == PhasePreempting, "step %d (%s): phase %s, victims %v", i, step.name, phase, plan.Victims)
		}
		require.Equal(t, phase == PhaseUnschedulable, m.unschedulable.Has(jobA), "step %d (%s): the index of unschedulable gangs", i, step.name)
	}
	for _, p := range []Phase{PhasePending, PhaseWaitingForMembers, PhaseInvalid, PhaseUnschedulable, PhasePreempting,
		PhasePlanned, PhasePermitted, PhaseBound, PhaseBackingOff, PhaseDropped} {
		assert.True(t, seen[p], "the walk never reached %s: it tests less than it says", p)
	}
}

// A PodGroup's phase counts the members that succeeded (gone from the
// informer) toward minMember, so a gang whose members finish one by one
// stays Running and ends Succeeded.
func TestPodGroupPhase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		last    v1alpha1.PodGroupPhase
		members MemberCounts
		planned bool
		phase   v1alpha1.PodGroupPhase
		keep    bool
	}{
		{"no member placed", "", MemberCounts{Total: 3}, false, v1alpha1.PodGroupPending, false},
		{"planned", v1alpha1.PodGroupPending, MemberCounts{Total: 3}, true, v1alpha1.PodGroupScheduling, false},
		{"bound", v1alpha1.PodGroupScheduling, MemberCounts{Total: 3, Bound: 3}, false, v1alpha1.PodGroupScheduled, false},
		{"running", v1alpha1.PodGroupScheduled, MemberCounts{Total: 3, Bound: 3, Running: 3}, false, v1alpha1.PodGroupRunning, false},
		{"one finished, two running", v1alpha1.PodGroupRunning, MemberCounts{Total: 2, Bound: 2, Running: 2, Succeeded: 1}, false, v1alpha1.PodGroupRunning, false},
		{"one finished, its replacement bound", v1alpha1.PodGroupRunning, MemberCounts{Total: 3, Bound: 3, Running: 2, Succeeded: 1}, false, v1alpha1.PodGroupRunning, false},
		{"every member succeeded", v1alpha1.PodGroupRunning, MemberCounts{Succeeded: 3}, false, v1alpha1.PodGroupSucceeded, false},
		{"members gone, not all succeeded", v1alpha1.PodGroupRunning, MemberCounts{Succeeded: 1}, false, v1alpha1.PodGroupRunning, true},
		{"members deleted after binding", v1alpha1.PodGroupScheduled, MemberCounts{}, false, v1alpha1.PodGroupScheduled, true},
		{"short of members", v1alpha1.PodGroupPending, MemberCounts{Total: 2, Bound: 2, Running: 2}, false, v1alpha1.PodGroupPending, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			phase, keep := PodGroupPhase(tc.last, 3, tc.members, tc.planned)
			assert.Equal(t, tc.phase, phase)
			assert.Equal(t, tc.keep, keep)
		})
	}
}
