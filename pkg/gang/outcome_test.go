package gang

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"
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

// TestFailingChoosesByOutcome: the gangs retried when capacity frees up are
// those whose latest outcome is that they found no room, and have no plan.
func TestFailingChoosesByOutcome(t *testing.T) {
	r := NewRegistry()
	noRoom, waiting := Key{Kind: KindJob, Namespace: "ns", Name: "a"}, Key{Kind: KindJob, Namespace: "ns", Name: "b"}
	seen := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	assert.True(t, r.Notice(noRoom, OutcomeUnschedulable, "no room", seen))
	assert.False(t, r.Notice(noRoom, OutcomeUnschedulable, "no room", seen), "the same notice twice is announced once")
	r.Notice(waiting, OutcomeWaitingForMembers, "1 of 2", seen)
	assert.Equal(t, []Key{noRoom}, r.Failing(OutcomeUnschedulable))
	outcome, msg := r.LastNotice(noRoom)
	assert.Equal(t, OutcomeUnschedulable, outcome)
	assert.Equal(t, "no room", msg)
}
