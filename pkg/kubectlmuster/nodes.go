package kubectlmuster

import (
	corev1 "k8s.io/api/core/v1"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/gang"
)

// nodeState is one node as the plugin accounts for it: allocatable minus
// what the pods bound to it request, as the scheduler's cache counts.
type nodeState struct {
	node  *corev1.Node
	alloc gang.Resources
	free  gang.Resources
	// heldGPUs are the GPUs bound pods request.
	heldGPUs   int64
	spot       bool
	reclaiming bool // a reclaim taint
	allocGPUs  int64
	freeGPUs   int64
}

// view is the planner's view of the node as it stands: what decides, as in
// the scheduler, whether it can take a member (gang.NodeView.Unavailable,
// Eligible).
func (s *nodeState) view(gpu corev1.ResourceName) gang.NodeView {
	return gang.NewNodeView(s.node, s.free, gpu, s.spot, s.reclaiming)
}

// unavailable reports that the node never receives a member.
func (s *nodeState) unavailable() bool {
	view := s.view("")
	return view.Unavailable()
}

// nodeStates accounts every node; the snapshot must hold every pod.
func (ix *index) nodeStates() []nodeState {
	states := make([]nodeState, len(ix.snap.Nodes))
	byName := make(map[string]int, len(states))
	for i := range ix.snap.Nodes {
		n := &ix.snap.Nodes[i]
		alloc := resourcesOf(n.Status.Allocatable, 0)
		states[i] = nodeState{node: n, alloc: alloc, free: alloc.Clone(),
			spot: matchesAny(n, ix.opts.Spot), reclaiming: hasTaint(n, ix.opts.Reclaim)}
		byName[n.Name] = i
	}
	for i := range ix.snap.Pods {
		pod := &ix.snap.Pods[i]
		if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		j, ok := byName[pod.Spec.NodeName]
		if !ok {
			continue
		}
		req := ix.requestOf(pod)
		states[j].free.Sub(req)
		states[j].heldGPUs += req.Scalars[ix.opts.GPU]
	}
	for i := range states {
		s := &states[i]
		s.allocGPUs = s.alloc.Scalars[ix.opts.GPU]
		s.freeGPUs = s.free.Scalars[ix.opts.GPU]
	}
	return states
}

// views are the planner's node views of the states.
func (ix *index) views(states []nodeState) []gang.NodeView {
	views := make([]gang.NodeView, len(states))
	for i := range states {
		views[i] = states[i].view(ix.opts.GPU)
	}
	return views
}

// matchesAny reports whether a preemptible-node matcher matches the node,
// as muster's plugin reads its preemptibleNodeMatchers.
func matchesAny(node *corev1.Node, matchers []configv1.NodeMatcher) bool {
	for _, m := range matchers {
		if m.Source == "Taint" {
			for _, t := range node.Spec.Taints {
				if t.Key == m.Key && (m.Value == "" || t.Value == m.Value) {
					return true
				}
			}
			continue
		}
		if v, ok := node.Labels[m.Key]; ok && (m.Value == "" || v == m.Value) {
			return true
		}
	}
	return false
}

func hasTaint(node *corev1.Node, keys []string) bool {
	for _, t := range node.Spec.Taints {
		for _, k := range keys {
			if t.Key == k {
				return true
			}
		}
	}
	return false
}
