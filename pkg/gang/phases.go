package gang

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// The vocabulary of a gang's life (Manager): its phases, why a plan is
// dropped, why members are woken, and the effects a transition asks of the
// scheduler.

// Phase is where a gang is in its life: the one name the Manager, the
// scheduler's Events (Outcome.Phase), kubectl muster and the docs use. The
// phases and the moves between them are the table lifecycle below.
type Phase string

const (
	// PhaseSuspended: a suspended Job (Kueue holds it until admitted). The
	// scheduler never sees its pods; kubectl muster reads it from the Job.
	PhaseSuspended Phase = "Suspended"
	// PhasePending: seen, nothing decided yet.
	PhasePending Phase = "Pending"
	// PhaseWaitingForMembers: fewer pods than the quorum can be placed.
	PhaseWaitingForMembers Phase = "WaitingForMembers"
	// PhaseInvalid: the gang's spec or annotations cannot be served.
	PhaseInvalid Phase = "Invalid"
	// PhaseUnschedulable: the last plan found no room (for a pod scheduled
	// alone: gang plans held what it needs, HeldOut); capacity freed by
	// another gang retries it.
	PhaseUnschedulable Phase = "Unschedulable"
	// PhasePreempting: planned, waiting for the pods it preempted to go.
	PhasePreempting Phase = "Preempting"
	// PhasePlanned: the plan holds its slots; members are being reserved.
	PhasePlanned Phase = "Planned"
	// PhasePermitted: every planned member was reserved and allowed; they
	// are binding.
	PhasePermitted Phase = "Permitted"
	// PhaseBound: every member the last plan allowed was seen bound.
	PhaseBound Phase = "Bound"
	// PhaseBackingOff: its plan was dropped for a cause of its own
	// (DropCause.backsOff); it waits before planning again.
	PhaseBackingOff Phase = "BackingOff"
	// PhaseDropped: its plan was dropped by a change that was not its
	// doing (a planned node changed, a gang of higher priority displaced
	// it, its quorum rose), or a member its plan allowed failed to bind or
	// was deleted; it is planned again at once.
	PhaseDropped Phase = "Dropped"
	// PhaseFinished: the Job completed or failed. Read by kubectl muster.
	PhaseFinished Phase = "Finished"
)

// Trigger is what moves a gang between phases: the outcome of a
// transition (Refused, Install, Arrive, a drop, ...), worded as the
// diagram in docs/architecture.md labels it.
type Trigger string

const (
	TriggerFirstSeen            Trigger = "first member seen"
	TriggerSuspendedJob         Trigger = "a suspended Job (kubectl muster)"
	TriggerJobResumed           Trigger = "Kueue admits the Job (kubectl muster)"
	TriggerTooFewMembers        Trigger = "Refused, too few members"
	TriggerInvalid              Trigger = "Refused, invalid"
	TriggerNoRoom               Trigger = "Refused, no room, or HeldOut"
	TriggerNoLongerHeldOut      Trigger = "HeldOut ends"
	TriggerInstalled            Trigger = "Install"
	TriggerInstalledWithVictims Trigger = "Install with victims"
	TriggerVictimsGone          Trigger = "VictimGone, the last one"
	TriggerCompleted            Trigger = "Arrive, the last member reserved"
	TriggerDroppedBackingOff    Trigger = "Expire, Rejected, PlanBroken, MemberGone"
	TriggerDroppedAtOnce        Trigger = "NodeChanged, displaced, quorum raised"
	TriggerAllowedMemberLeft    Trigger = "Rejected, MemberGone of an allowed member"
	TriggerAllBound             Trigger = "MemberBound, the last allowed member"
	TriggerJobFinished          Trigger = "the Job completed or failed (kubectl muster)"
)

// phaseStart is the diagram's [*]: before the gang exists.
const phaseStart Phase = ""

// withoutPlan are the phases of a gang that holds no plan: the ones a
// refusal or a new plan moves it from. While a plan is active (Planned,
// Preempting) refusals in other members' cycles leave the phase alone.
var withoutPlan = []Phase{PhasePending, PhaseWaitingForMembers, PhaseInvalid, PhaseUnschedulable,
	PhasePermitted, PhaseBound, PhaseBackingOff, PhaseDropped}

// lifecycleRow is one row of the lifecycle: Trigger takes a gang in any
// phase of From to To.
type lifecycleRow struct {
	From    []Phase
	Trigger Trigger
	To      Phase
}

// lifecycle is a gang's life as data: Manager.move reads it for every
// phase change, and docs/architecture.md's diagram is drawn from it
// (Diagram). A trigger with no row for the gang's phase leaves it there.
// The rows marked kubectl muster are phases only the CLI reads, from the
// gang's Job.
var lifecycle = []lifecycleRow{
	{[]Phase{phaseStart}, TriggerFirstSeen, PhasePending},
	{[]Phase{phaseStart}, TriggerSuspendedJob, PhaseSuspended},
	{[]Phase{PhaseSuspended}, TriggerJobResumed, PhasePending},
	{withoutPlan, TriggerTooFewMembers, PhaseWaitingForMembers},
	{withoutPlan, TriggerInvalid, PhaseInvalid},
	{withoutPlan, TriggerNoRoom, PhaseUnschedulable},
	{[]Phase{PhaseUnschedulable}, TriggerNoLongerHeldOut, PhasePending},
	{withoutPlan, TriggerInstalled, PhasePlanned},
	{withoutPlan, TriggerInstalledWithVictims, PhasePreempting},
	{[]Phase{PhasePreempting}, TriggerVictimsGone, PhasePlanned},
	{[]Phase{PhasePlanned, PhasePreempting}, TriggerCompleted, PhasePermitted},
	{[]Phase{PhasePlanned, PhasePreempting}, TriggerDroppedBackingOff, PhaseBackingOff},
	{[]Phase{PhasePlanned, PhasePreempting}, TriggerDroppedAtOnce, PhaseDropped},
	{[]Phase{PhasePermitted}, TriggerAllowedMemberLeft, PhaseDropped},
	{[]Phase{PhasePermitted}, TriggerAllBound, PhaseBound},
	{[]Phase{PhaseBound}, TriggerJobFinished, PhaseFinished},
}

// nextPhase indexes lifecycle: phase × trigger → phase.
var nextPhase = func() map[Phase]map[Trigger]Phase {
	next := map[Phase]map[Trigger]Phase{}
	for _, row := range lifecycle {
		for _, from := range row.From {
			if next[from] == nil {
				next[from] = map[Trigger]Phase{}
			}
			next[from][row.Trigger] = row.To
		}
	}
	return next
}()

// phaseAfter is the phase trigger t takes a gang in phase from to, and
// false when the lifecycle has no such row (the gang stays where it is).
func phaseAfter(from Phase, t Trigger) (Phase, bool) {
	to, ok := nextPhase[from][t]
	return to, ok
}

// Diagram draws the lifecycle as a mermaid state diagram, one edge per
// row; rows from every phase without a plan start at one box that stands
// for them.
func Diagram() string {
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	b.WriteString("  state \"any phase without a plan\" as WithoutPlan\n")
	names := make([]string, len(withoutPlan))
	for i, p := range withoutPlan {
		names[i] = string(p)
	}
	fmt.Fprintf(&b, "  note right of WithoutPlan: %s\n", strings.Join(names, ", "))
	state := func(p Phase) string {
		if p == phaseStart {
			return "[*]"
		}
		return string(p)
	}
	for _, row := range lifecycle {
		if slices.Equal(row.From, withoutPlan) {
			fmt.Fprintf(&b, "  WithoutPlan --> %s: %s\n", row.To, row.Trigger)
			continue
		}
		for _, from := range row.From {
			fmt.Fprintf(&b, "  %s --> %s: %s\n", state(from), state(row.To), row.Trigger)
		}
	}
	return b.String()
}

// MemberCounts are a PodGroup's members as its status counts them: total,
// bound and running count the live ones (in the pod informer), succeeded
// those that finished successfully (gone from the informer).
type MemberCounts struct {
	Total, Bound, Running, Succeeded int
}

// PodGroupPhase is a scheduler-plugins PodGroup's status.phase: that
// API's own names for the gang's life (docs/explain.md maps them to
// Phase). Members that succeeded count toward minMember with the running
// and the bound ones, so a gang whose members finish one by one stays
// Running and ends Succeeded. keep: no member is live and the group has not
// succeeded, so the members that left (finished or deleted) leave the last
// phase, Running or Scheduled, as it was.
func PodGroupPhase(last v1alpha1.PodGroupPhase, minMember int, m MemberCounts, planned bool) (phase v1alpha1.PodGroupPhase, keep bool) {
	switch {
	case minMember > 0 && m.Total == 0 && m.Succeeded >= minMember:
		return v1alpha1.PodGroupSucceeded, false
	case m.Total == 0 && (last == v1alpha1.PodGroupRunning || last == v1alpha1.PodGroupScheduled):
		return last, true
	case minMember > 0 && m.Running+m.Succeeded >= minMember:
		return v1alpha1.PodGroupRunning, false
	case minMember > 0 && m.Bound+m.Succeeded >= minMember:
		return v1alpha1.PodGroupScheduled, false
	case planned:
		return v1alpha1.PodGroupScheduling, false
	}
	return v1alpha1.PodGroupPending, false
}

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

// trigger is the lifecycle's name for a drop for c: the cause decides
// between BackingOff and Dropped.
func (c DropCause) trigger() Trigger {
	if c.backsOff() {
		return TriggerDroppedBackingOff
	}
	return TriggerDroppedAtOnce
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
