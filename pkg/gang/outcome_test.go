package gang

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// TestOutcomeEventType: users are warned exactly about the outcomes that
// need them (an impossible or invalid gang, a plan that failed).
func TestOutcomeEventType(t *testing.T) {
	warnings := map[Outcome]bool{OutcomeUnschedulable: true, OutcomeInvalid: true, OutcomeNotPossible: true, OutcomeRejected: true, OutcomeTimedOut: true}
	for _, o := range []Outcome{OutcomeWaitingForMembers, OutcomeUnschedulable, OutcomeInvalid, OutcomeNotPossible,
		OutcomePlanned, OutcomeScheduled, OutcomeRejected, OutcomeTimedOut, OutcomePreempting} {
		want := v1.EventTypeNormal
		if warnings[o] {
			want = v1.EventTypeWarning
		}
		assert.Equal(t, want, o.EventType(), o.Reason())
	}
}

// TestCapacityFreedRetriesTheUnplaceable: the gangs retried when a plan's
// capacity frees up are those whose last plan found no room (phase
// Unplaceable), not those waiting for members; each outcome is announced
// once.
func TestCapacityFreedRetriesTheUnplaceable(t *testing.T) {
	r := NewManager()
	noRoom, waiting, planned := Key{Kind: KindJob, Namespace: "ns", Name: "a"}, Key{Kind: KindJob, Namespace: "ns", Name: "b"}, Key{Kind: KindJob, Namespace: "ns", Name: "c"}
	seen := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	assert.NotNil(t, r.Refused(noRoom, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, seen).Notice)
	assert.Nil(t, r.Refused(noRoom, Refusal{Outcome: OutcomeUnschedulable, Message: "no room"}, seen).Notice, "the same notice twice is announced once")
	r.Refused(waiting, Refusal{Outcome: OutcomeWaitingForMembers, Message: "1 of 2"}, seen)
	plan := &ActivePlan{Plan: Plan{Slots: map[types.UID]string{"c0": "n1"}}, Reserved: sets.New[types.UID](), Created: seen, Deadline: seen.Add(time.Minute)}
	_, ok := r.Install(planned, plan, "c0", "planned", seen, nil, 0)
	require.True(t, ok)
	e := r.Drop(planned, plan.ID, DropRejected, "broken", seen, time.Second)
	assert.Equal(t, []Wake{{Key: noRoom, Reason: WakeCapacityFreed, AllProfiles: true}}, e.Wake)
	outcome, msg := r.LastNotice(noRoom)
	assert.Equal(t, OutcomeUnschedulable, outcome)
	assert.Equal(t, "no room", msg)
	assert.Equal(t, PhaseUnschedulable, r.Phase(noRoom))
	assert.Equal(t, PhaseWaitingForMembers, r.Phase(waiting))
}
