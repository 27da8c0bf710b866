package mustergang

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

// A gang's pending pods reach the active queue by two paths.
//
// The framework's path: EventsToRegister and the QueueingHints (queue.go)
// move a pod the framework parked as unschedulable when a cluster event
// (a pod added or deleted, a node added or given room) may let it in. The
// framework decides when, per pod, from events it sees.
//
// muster's own path, wake: events the framework cannot see or cannot
// attribute to a gang. They come from muster's own state (a plan made, a
// member waiting at Permit, a plan dropped, a backoff or an avoidance over)
// or from the plugin's own informers (a member completing the quorum, a
// member that finished, the gang's Job, StatefulSet or PodGroup changing).
// Every such wake goes through wake with its reason, which is logged and
// counted (muster_gang_wakes_total). Nothing else calls handle.Activate.

// wakeReason says why muster moves pods of a gang to the active queue.
type wakeReason int

const (
	// wakePlanMade: a plan was installed in one member's cycle; its other
	// planned members are sent to their slots now.
	wakePlanMade wakeReason = iota
	// wakeMemberWaiting: a member reached Permit and waits there; the
	// planned members not reserved yet are hurried so the wait is short.
	wakeMemberWaiting
	// wakeVictimsGone: the last pod preempted for the gang's plan is gone;
	// its planned members go ahead.
	wakeVictimsGone
	// wakeCapacityFreed: another gang's plan was dropped and the capacity it
	// held is free; gangs that found no room try again.
	wakeCapacityFreed
	// wakeBackoffEnded: the backoff after the gang's own plan was dropped
	// is over.
	wakeBackoffEnded
	// wakeAvoidEnded: a (member, node) pair a Filter rejected may be planned
	// again.
	wakeAvoidEnded
	// wakeQuorumReached: a new pending member completed the gang's quorum;
	// PreEnqueue held the others back until now.
	wakeQuorumReached
	// wakeMemberSucceeded: a PodGroup member finished successfully and
	// counts toward the quorum, so the rest need fewer members.
	wakeMemberSucceeded
	// wakeOwnerChanged: the gang's Job, StatefulSet or PodGroup was added or
	// changed in a way that can change its quorum.
	wakeOwnerChanged
	numWakeReasons
)

// wakeReasonNames are the reasons' log values and metric labels.
var wakeReasonNames = [numWakeReasons]string{
	wakePlanMade:        "plan_made",
	wakeMemberWaiting:   "member_waiting",
	wakeVictimsGone:     "victims_gone",
	wakeCapacityFreed:   "capacity_freed",
	wakeBackoffEnded:    "backoff_ended",
	wakeAvoidEnded:      "avoid_ended",
	wakeQuorumReached:   "quorum_reached",
	wakeMemberSucceeded: "member_succeeded",
	wakeOwnerChanged:    "owner_changed",
}

func (r wakeReason) String() string {
	if r < 0 || r >= numWakeReasons {
		return "unknown"
	}
	return wakeReasonNames[r]
}

// wake moves pods, members of gang key, to the active queue because of why.
// It is the only caller of handle.Activate. It takes the queue's lock: never
// call it from PreEnqueue or QueueSort.
func (p *Plugin) wake(logger klog.Logger, key gang.Key, why wakeReason, pods []*v1.Pod) {
	if len(pods) == 0 {
		return
	}
	toActivate := make(map[string]*v1.Pod, len(pods))
	for _, m := range pods {
		toActivate[m.Namespace+"/"+m.Name] = m
	}
	wakes.WithLabelValues(why.String()).Inc()
	logger.V(4).Info("Waking gang members", "gang", key, "reason", why.String(), "pods", len(toActivate))
	p.handle.Activate(logger, toActivate)
}

// unreservedSiblings lists the plan's pending members not reserved yet,
// except the pod whose cycle is running (self; empty for none).
func (p *Plugin) unreservedSiblings(key gang.Key, plan *gang.ActivePlan, self types.UID) []*v1.Pod {
	var todo []*v1.Pod
	for _, m := range p.members(key).pending {
		if _, planned := plan.Slots[m.UID]; planned && !plan.Reserved.Has(m.UID) && m.UID != self {
			todo = append(todo, m)
		}
	}
	return todo
}
