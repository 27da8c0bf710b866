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
// Every such wake goes through wake with its reason (gang.WakeReason), which
// is logged and counted (muster_gang_wakes_total). Nothing else calls
// handle.Activate. Most are effects of the gang manager's transitions
// (gang.Effects.Wake); the informer handlers ask for the rest.

// wake moves pods, members of gang key, to the active queue because of why.
// It is the only caller of handle.Activate. It takes the queue's lock: never
// call it from PreEnqueue or QueueSort.
func (p *Plugin) wake(logger klog.Logger, key gang.Key, why gang.WakeReason, pods []*v1.Pod) {
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
	for _, m := range p.source.members(key).pending {
		if _, planned := plan.Slots[m.UID]; planned && !plan.Reserved.Has(m.UID) && m.UID != self {
			todo = append(todo, m)
		}
	}
	return todo
}
