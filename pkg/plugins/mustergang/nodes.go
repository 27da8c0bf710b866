package mustergang

import (
	"sync"

	v1 "k8s.io/api/core/v1"
)

// nodeClasses remembers, per node object, what its labels and taints say:
// preemptible (spot) and reclaiming. Filter and Score ask on every node for
// every pod, and matching every configured label and taint each time cost
// more than the rest of MusterGang's Filter and Score together (profile of
// upstream's SchedulingBasic, BENCHMARKS.md). The informer replaces a node
// object on every change, so an entry holding the same pointer is current.
type nodeClasses struct {
	mu     sync.RWMutex
	byName map[string]*nodeClass
}

type nodeClass struct {
	node        *v1.Node
	preemptible bool
	reclaiming  bool
}

func (c *nodeClasses) forget(name string) {
	c.mu.Lock()
	delete(c.byName, name)
	c.mu.Unlock()
}

// classOf is node's class, computed once per node object.
func (p *Plugin) classOf(node *v1.Node) *nodeClass {
	p.classes.mu.RLock()
	c := p.classes.byName[node.Name]
	p.classes.mu.RUnlock()
	if c != nil && c.node == node {
		return c
	}
	c = &nodeClass{node: node, preemptible: p.matchesPreemptible(node), reclaiming: p.matchesReclaiming(node)}
	p.classes.mu.Lock()
	if p.classes.byName == nil {
		p.classes.byName = map[string]*nodeClass{}
	}
	p.classes.byName[node.Name] = c
	p.classes.mu.Unlock()
	return c
}

func (p *Plugin) preemptible(node *v1.Node) bool { return p.classOf(node).preemptible }

// reclaiming reports a node whose capacity is going away: it carries one of
// the reclaim taints (a spot reclaim notice, a disruption). A cordon is not
// reclaiming: the profile's NodeUnschedulable filter keeps pods off a
// cordoned node, and the planner's NodeView.Unavailable leaves it out.
//
// Reclaim notices are taints: a node without taints is answered without the
// class lookup, which on every node for every pod was most of MusterGang's
// CPU on pods alone (bench/results/perf/basicscheduling-profile.txt).
func (p *Plugin) reclaiming(node *v1.Node) bool {
	return len(node.Spec.Taints) > 0 && p.classOf(node).reclaiming
}

func (p *Plugin) matchesPreemptible(node *v1.Node) bool {
	for _, m := range p.args.PreemptibleNodeMatchers {
		if matchNode(node, m.Source == "Taint", m.Key, m.Value) {
			return true
		}
	}
	return false
}

func (p *Plugin) matchesReclaiming(node *v1.Node) bool {
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
