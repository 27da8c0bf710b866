package mustergang

import v1 "k8s.io/api/core/v1"

func (p *Plugin) preemptible(node *v1.Node) bool {
	for _, m := range p.args.PreemptibleNodeMatchers {
		if matchNode(node, m.Source == "Taint", m.Key, m.Value) {
			return true
		}
	}
	return false
}

// reclaiming reports a node whose capacity is going away: it carries one of
// the reclaim taints (a spot reclaim notice, a disruption). A cordon is not
// reclaiming: the profile's NodeUnschedulable filter keeps pods off a
// cordoned node, and the planner's NodeView.Unavailable leaves it out.
func (p *Plugin) reclaiming(node *v1.Node) bool {
	for _, key := range p.args.ReclaimTaintKeys {
		if matchNode(node, true, key, "") {
			return true
		}
	}
	return false
}

func matchNode(node *v1.Node, taint bool, key, value string) bool {
	if !taint {
		v, ok := node.Labels[key]
		return ok && (value == "" || v == value)
	}
	for _, t := range node.Spec.Taints {
		if t.Key == key && (value == "" || t.Value == value) {
			return true
		}
	}
	return false
}
