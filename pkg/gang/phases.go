package gang

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The vocabulary of a gang's life (Manager): its phases, why a plan is
// dropped, why members are woken, and the effects a transition asks of the
// scheduler.

// Phase is where a gang is in its life.
type Phase int

const (
	// PhaseNew: seen, nothing decided yet.
	PhaseNew Phase = iota
	// PhaseWaitingForMembers: fewer pods than the quorum can be placed.
	PhaseWaitingForMembers
	// PhaseInvalid: the gang's spec or annotations cannot be served.
	PhaseInvalid
	// PhaseUnplaceable: the last plan found no room (for a pod scheduled
	// alone: gang plans held what it needs, HeldOut); capacity freed by
	// another gang retries it.
	PhaseUnplaceable
	// PhasePreempting: planned, waiting for the pods it preempted to go.
	PhasePreempting
	// PhasePlanned: the plan holds its slots; members are being reserved.
	PhasePlanned
	// PhasePermitted: every planned member was reserved and allowed; they
	// are binding.
	PhasePermitted
	// PhaseBound: every member the last plan allowed was seen bound.
	PhaseBound
	// PhaseBackingOff: its plan was dropped; it waits before planning again.
	PhaseBackingOff
	// PhaseDropped: its plan was dropped by a change that was not its
	// doing (a planned node changed), or a member its plan allowed failed
	// to bind or was deleted; it is planned again at once.
	PhaseDropped
)

var phaseNames = [...]string{
	PhaseNew: "New", PhaseWaitingForMembers: "WaitingForMembers", PhaseInvalid: "Invalid", PhaseUnplaceable: "Unplaceable",
	PhasePreempting: "Preempting", PhasePlanned: "Planned", PhasePermitted: "Permitted", PhaseBound: "Bound",
	PhaseBackingOff: "BackingOff", PhaseDropped: "Dropped",
}

func (p Phase) String() string { return phaseNames[p] }

// DropCause says why a plan was dropped: the outcome announced, whether
// the gang backs off, and the label of the rejections metric.
type DropCause int

const (
	// DropTimeout: the deadline passed before every member was reserved.
	DropTimeout DropCause = iota
	// DropRejected: a member was rejected at Reserve or Permit, or failed
	// to bind.
	DropRejected
	// DropMemberGone: a planned member was deleted or finished.
	DropMemberGone
	// DropPlanBroken: a member could not go to its planned node.
	DropPlanBroken
	// DropNodeChanged: a planned node was deleted, cordoned, started being
	// reclaimed or stopped matching its member.
	DropNodeChanged
	// DropDisplaced: a gang of higher priority was planned on a node the
	// plan held capacity on (Install displaced it).
	DropDisplaced
	// DropQuorumRaised: the gang's quorum rose above what the plan places
	// while its members were being reserved (a PodGroup's minCount raised).
	DropQuorumRaised
)

var dropCauseNames = [...]string{
	DropTimeout:      "timeout",
	DropRejected:     "rejected",
	DropMemberGone:   "member_deleted",
	DropPlanBroken:   "plan_broken",
	DropNodeChanged:  "node_changed",
	DropDisplaced:    "displaced",
	DropQuorumRaised: "quorum_raised",
}

func (c DropCause) String() string { return dropCauseNames[c] }

// backsOff reports whether the gang waits before it is planned again: not
// when the cluster changed under a plan that was fine.
func (c DropCause) backsOff() bool {
	return c != DropNodeChanged && c != DropDisplaced && c != DropQuorumRaised
}

// Outcome is what the drop is announced as.
func (c DropCause) Outcome() Outcome {
	if c == DropTimeout {
		return OutcomeTimedOut
	}
	return OutcomeRejected
}

// WakeReason says why pods of a gang go to the active queue.
type WakeReason int

const (
	// WakePlanMade: a plan was installed in one member's cycle; its other
	// planned members are sent to their slots now.
	WakePlanMade WakeReason = iota
	// WakeMemberWaiting: the plan's first member reached Permit and waits
	// there; the planned members not reserved yet are hurried so the wait
	// is short.
	WakeMemberWaiting
	// WakeVictimsGone: the last pod preempted for the gang's plan is gone;
	// its planned members go ahead.
	WakeVictimsGone
	// WakeCapacityFreed: another gang's plan was dropped and the capacity
	// it held is free; gangs that found no room try again.
	WakeCapacityFreed
	// WakeBackoffEnded: the backoff after the gang's own plan was dropped
	// is over.
	WakeBackoffEnded
	// WakeAvoidEnded: a (member, node) pair a Filter rejected may be
	// planned again.
	WakeAvoidEnded
	// WakeQuorumReached: a new pending member completed the gang's quorum;
	// PreEnqueue held the others back until now.
	WakeQuorumReached
	// WakeMemberSucceeded: a PodGroup member finished successfully and
	// counts toward the quorum, so the rest need fewer members.
	WakeMemberSucceeded
	// WakeOwnerChanged: the gang's Job, StatefulSet or PodGroup was added
	// or changed in a way that can change its quorum.
	WakeOwnerChanged
	// WakeMemberUngated: a pending member's last scheduling gate was
	// removed; siblings refused while it was gated try again.
	WakeMemberUngated
	// WakeNodesProvisioned: cluster-autoscaler provisioned the nodes the
	// gang's ProvisioningRequest asked for.
	WakeNodesProvisioned
	numWakeReasons
)

// wakeReasonNames are the reasons' log values and metric labels.
var wakeReasonNames = [numWakeReasons]string{
	WakePlanMade:         "plan_made",
	WakeMemberWaiting:    "member_waiting",
	WakeVictimsGone:      "victims_gone",
	WakeCapacityFreed:    "capacity_freed",
	WakeBackoffEnded:     "backoff_ended",
	WakeAvoidEnded:       "avoid_ended",
	WakeQuorumReached:    "quorum_reached",
	WakeMemberSucceeded:  "member_succeeded",
	WakeOwnerChanged:     "owner_changed",
	WakeMemberUngated:    "member_ungated",
	WakeNodesProvisioned: "nodes_provisioned",
}

// WakeReasons lists every reason, in order.
func WakeReasons() []WakeReason {
	out := make([]WakeReason, numWakeReasons)
	for r := range out {
		out[r] = WakeReason(r)
	}
	return out
}

func (r WakeReason) String() string {
	if r < 0 || r >= numWakeReasons {
		return "unknown"
	}
	return wakeReasonNames[r]
}

// Effects are what a transition asks of the scheduler, carried out in the
// order of the fields.
type Effects struct {
	// StopDeadline is a plan whose deadline timer is no longer needed (0:
	// none).
	StopDeadline int64
	// Installed is the plan Install made active (0: none).
	Installed int64
	// Dropped is the plan a drop released.
	Dropped *Drop
	// Reject turns members waiting at Permit away.
	Reject *Rejection
	// Allow lets members waiting at Permit bind: their plan completed.
	Allow []types.UID
	// Notice is the gang's new outcome to announce; nil when it did not
	// change (each change is announced once).
	Notice *Notice
	// Wake sends gangs' pending members to the active queue.
	Wake []Wake
	// Timers to set.
	Timers []Timer
	// Displaced are the effects of dropping other gangs' plans that this
	// transition displaced, each carried out as that gang's own.
	Displaced []Effects
}

// Drop is a plan a drop released.
type Drop struct {
	Key     Key
	Cause   DropCause
	Reason  string
	Backoff time.Duration
}

// Rejection turns away the gang's members waiting at Permit that are in
// Members.
type Rejection struct {
	Key     Key
	Members map[types.UID]string
	// Reserved are the members that had reached Reserve. One whose Permit
	// returned Wait an instant before the drop is not among the waiting
	// pods yet: the framework adds it only after every Permit plugin
	// returned, so it must be looked for again.
	Reserved []types.UID
	Message  string
}

// Notice is a gang's outcome and its explanation.
type Notice struct {
	Key     Key
	Outcome Outcome
	Message string
}

// Wake asks for pending members of a gang: all of them, or with Plan set
// only its members not reserved yet, except Except (the pod whose cycle is
// running). AllProfiles: the members of every profile, not only the one
// that carries the effects out.
type Wake struct {
	Key         Key
	Reason      WakeReason
	Plan        *ActivePlan
	Except      types.UID
	AllProfiles bool
}

// TimerKind says what a timer does when it fires.
type TimerKind int

const (
	// TimerPlanDeadline expires plan PlanID (Manager.Expire).
	TimerPlanDeadline TimerKind = iota
	// TimerBackoffEnded wakes the gang's pending members (WakeBackoffEnded).
	TimerBackoffEnded
	// TimerAvoidEnded wakes the gang's pending members (WakeAvoidEnded).
	TimerAvoidEnded
)

// Timer is a timer to set; when it fires, Manager.TimerFired says what
// follows.
type Timer struct {
	Key    Key
	Kind   TimerKind
	After  time.Duration
	PlanID int64
	// Due is when it fires: the time the transition read, plus After.
	// Its firing is handled at that time, without reading a clock (a
	// fake clock runs its timers' callbacks under its own lock).
	Due time.Time
}
