package gang

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Outcome is a gang's latest state as muster explains it to users: the
// reason of an Event on the gang's owner and of a PodGroup's Scheduled
// condition. The manager announces each change once (Effects.Notice);
// control follows the gang's Phase, never its outcome.
type Outcome string

// Outcomes; each value is the Event reason users see.
const (
	OutcomeWaitingForMembers Outcome = "GangWaitingForMembers"
	OutcomeUnschedulable     Outcome = "GangUnschedulable"
	OutcomeInvalid           Outcome = "GangInvalid"
	// OutcomeNotPossible: the pods can never form a gang (a StatefulSet
	// with podManagementPolicy OrderedReady creates them one at a time).
	OutcomeNotPossible Outcome = "GangNotPossible"
	OutcomePlanned     Outcome = "GangPlanned"
	OutcomeScheduled   Outcome = "GangScheduled"
	OutcomeRejected    Outcome = "GangRejected"
	OutcomeTimedOut    Outcome = "GangScheduleTimeout"
	OutcomePreempting  Outcome = "GangPreempting"
)

// Reason is the Event (and condition) reason of the outcome.
func (o Outcome) Reason() string { return string(o) }

// IsEvent reports whether the outcome is also recorded as an Event on the
// gang's owner. A plan is not: within moments the gang is either released
// (GangScheduled names the same placement) or its plan is dropped
// (GangScheduleTimeout, GangRejected); meanwhile the log and the PodGroup's
// Scheduled condition show it. One Event fewer per gang is one API call
// fewer per gang on a burst.
func (o Outcome) IsEvent() bool { return o != OutcomePlanned }

// PlannedAgainAtOnce ends the message of a plan dropped by a change that
// was not the gang's doing (PhaseDropped), where a plan dropped for a cause
// of its own says when it is retried (PhaseBackingOff).
const PlannedAgainAtOnce = "(planned again at once)"

// Phase is the phase a gang is in when it announces o with message: what
// kubectl muster shows for the gang's latest Event. GangScheduled is
// announced on entering Permitted (every member reserved, binding); a drop
// is GangRejected or GangScheduleTimeout whether it backs off or not, so
// the message tells Dropped from BackingOff.
func (o Outcome) Phase(message string) Phase {
	switch o {
	case OutcomeWaitingForMembers:
		return PhaseWaitingForMembers
	case OutcomeUnschedulable:
		return PhaseUnschedulable
	case OutcomeInvalid, OutcomeNotPossible:
		return PhaseInvalid
	case OutcomePlanned:
		return PhasePlanned
	case OutcomePreempting:
		return PhasePreempting
	case OutcomeScheduled:
		return PhasePermitted
	case OutcomeRejected, OutcomeTimedOut:
		if strings.HasSuffix(message, PlannedAgainAtOnce) {
			return PhaseDropped
		}
		return PhaseBackingOff
	}
	return PhasePending
}

// EventType is Warning for outcomes that need the user's attention.
func (o Outcome) EventType() string {
	switch o {
	case OutcomeUnschedulable, OutcomeInvalid, OutcomeNotPossible, OutcomeRejected, OutcomeTimedOut:
		return v1.EventTypeWarning
	}
	return v1.EventTypeNormal
}

// The reasons of the Events about a gang's ProvisioningRequest
// (docs/autoscaling.md). They say what the autoscaler was asked and
// answered, not where the gang is: they never set the phase kubectl muster
// shows (IsProvisioningReason).
const (
	ReasonProvisioningRequested   = "ProvisioningRequested"
	ReasonProvisioned             = "Provisioned"
	ReasonProvisioningFailed      = "ProvisioningFailed"
	ReasonProvisioningEnded       = "ProvisioningEnded"
	ReasonProvisioningNotAccepted = "ProvisioningNotAccepted"
)

// IsProvisioningReason reports whether an Event reason is one of a gang's
// ProvisioningRequest.
func IsProvisioningReason(reason string) bool {
	switch reason {
	case ReasonProvisioningRequested, ReasonProvisioned, ReasonProvisioningFailed, ReasonProvisioningEnded, ReasonProvisioningNotAccepted:
		return true
	}
	return false
}
