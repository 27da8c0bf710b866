package mustergang

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/muster-sched/muster/pkg/apis/config"
	"github.com/muster-sched/muster/pkg/gang"
)

// nodeViews is what muster knows of the nodes beside the framework's
// snapshot: the topology levels and the index of the nodes' domains at each
// level, each node's class (preemptible, reclaiming) and each node's
// NodeView, kept between plans.
type nodeViews struct {
	gpu      v1.ResourceName
	levels   []gang.Level
	topology *gang.TopologyIndex // the nodes' domains at each level
	classes  nodeClasses

	mu   sync.Mutex
	kept map[string]cachedView // by node name
	last []cachedView          // by position in the last nodes list
	buf  []gang.NodeView       // the views returned
	// heldBuf is buf with what plans hold taken out; heldTaken the
	// positions where it differs from buf.
	heldBuf   []gang.NodeView
	heldTaken []int
}

// cachedView is a node's NodeView as of one NodeInfo generation, and the
// node's position in the last nodes list views saw.
type cachedView struct {
	info       fwk.NodeInfo
	generation int64
	draFree    int64 // the node's free DRA GPUs the view counts
	view       gang.NodeView
	pos        int
	// pods is what the victim search reads of the node's pods, filled
	// on its first search at this generation (podsRead).
	pods     []boundPod
	podsRead bool
}

// freestDomain is the domain at label (a node label's value) whose nodes
// have the most free GPUs in the views kept, "" when no node has the label.
// Ties go to the first name.
func (n *nodeViews) freestDomain(label string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	free := map[string]int64{}
	for _, c := range n.kept {
		if c.view.Node == nil || c.view.Reclaiming || c.view.Cordoned {
			continue
		}
		if value, ok := c.view.Node.Labels[label]; ok {
			free[value] += c.view.Free.Scalars[n.gpu]
		}
	}
	best := ""
	for value, gpus := range free {
		if best == "" || gpus > free[best] || (gpus == free[best] && value < best) {
			best = value
		}
	}
	return best
}

// boundPod is what the victim search reads of a pod on a node that depends
// on the pod object alone. Every victim search used to compute it for every
// pod of the cluster; a month's soak on 2000 nodes spent half its CPU there.
type boundPod struct {
	info    fwk.PodInfo
	gang    gang.Key // gang.KeyOf
	inGang  bool
	request gang.Resources // its requests (podRequest); Scalars shared, never written
	// final: request is what the pod frees, whatever DRA serves: it has no
	// claims, and no extended resource but the GPU that a DeviceClass
	// could serve (draGPUs.request would change nothing).
	final bool
}

// boundPods is the victim search's reading of ni's pods, kept with the
// node's view until its NodeInfo changes. views must have seen ni at its
// generation (searchVictims calls it first); else it is computed and not
// kept.
func (n *nodeViews) boundPods(ni fwk.NodeInfo) []boundPod {
	name, gen := ni.Node().Name, ni.GetGeneration()
	n.mu.Lock()
	c, ok := n.kept[name]
	n.mu.Unlock()
	if ok && c.generation == gen && c.podsRead {
		return c.pods
	}
	infos := ni.GetPods()
	pods := make([]boundPod, len(infos))
	for i, pi := range infos {
		pod := pi.GetPod()
		k, inGang := gang.KeyOf(pod)
		req := podRequest(pi.CalculateResource())
		final := len(pod.Spec.ResourceClaims) == 0
		for name := range req.Scalars {
			final = final && (name == n.gpu || !schedutil.IsDRAExtendedResourceName(name))
		}
		pods[i] = boundPod{info: pi, gang: k, inGang: inGang, request: req, final: final}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.kept[name]; ok && c.generation == gen {
		c.pods, c.podsRead = pods, true
		n.kept[name] = c
	}
	return pods
}

func newNodeViews(args *config.MusterGangArgs) *nodeViews {
	n := &nodeViews{gpu: v1.ResourceName(args.GPUResourceName), kept: map[string]cachedView{},
		classes: nodeClasses{preemptible: args.PreemptibleNodeMatchers, reclaimTaints: args.ReclaimTaintKeys}}
	for _, l := range args.TopologyLevels {
		n.levels = append(n.levels, gang.Level{Name: l.Name, Label: l.NodeLabel, Attribute: l.DeviceAttribute})
	}
	n.topology = gang.NewTopologyIndex(n.levels)
	return n
}

// nodeClasses remembers, per node object, what its labels and taints say:
// preemptible (spot) and reclaiming. Filter and Score ask on every node for
// every pod, and matching every configured label and taint each time cost
// more than the rest of MusterGang's Filter and Score together (profile of
// upstream's SchedulingBasic, BENCHMARKS.md). The informer replaces a node
// object on every change, so an entry holding the same pointer is current.
type nodeClasses struct {
	preemptible   []config.NodeMatcher
	reclaimTaints []string
	mu            sync.RWMutex
	byName        map[string]*nodeClass
}

type nodeClass struct {
	node        *v1.Node
	preemptible bool
	reclaiming  bool
}

// forget drops what is known of a deleted node: its class and its kept
// view (a snapshot that still lists it computes the view again).
func (n *nodeViews) forget(name string) {
	n.classes.mu.Lock()
	delete(n.classes.byName, name)
	n.classes.mu.Unlock()
	n.mu.Lock()
	delete(n.kept, name)
	n.mu.Unlock()
}

// classOf is node's class, computed once per node object.
func (c *nodeClasses) classOf(node *v1.Node) *nodeClass {
	c.mu.RLock()
	nc := c.byName[node.Name]
	c.mu.RUnlock()
	if nc != nil && nc.node == node {
		return nc
	}
	nc = &nodeClass{node: node, preemptible: c.matchesPreemptible(node), reclaiming: c.matchesReclaiming(node)}
	c.mu.Lock()
	if c.byName == nil {
		c.byName = map[string]*nodeClass{}
	}
	c.byName[node.Name] = nc
	c.mu.Unlock()
	return nc
}

func (n *nodeViews) preemptible(node *v1.Node) bool { return n.classes.classOf(node).preemptible }

// reclaiming reports a node whose capacity is going away: it carries one of
// the reclaim taints (a spot reclaim notice, a disruption). A cordon is not
// reclaiming: the profile's NodeUnschedulable filter keeps pods off a
// cordoned node, and the planner's NodeView.Unavailable leaves it out.
//
// Reclaim notices are taints: a node without taints is answered without the
// class lookup, which on every node for every pod was most of MusterGang's
// CPU on pods alone (bench/results/perf/basicscheduling-profile.txt).
func (n *nodeViews) reclaiming(node *v1.Node) bool {
	return len(node.Spec.Taints) > 0 && n.classes.classOf(node).reclaiming
}

func (c *nodeClasses) matchesPreemptible(node *v1.Node) bool {
	for _, m := range c.preemptible {
		if matchNode(node, m.Source == "Taint", m.Key, m.Value) {
			return true
		}
	}
	return false
}

func (c *nodeClasses) matchesReclaiming(node *v1.Node) bool {
	for _, key := range c.reclaimTaints {
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

// views is what the planner knows of the nodes: free resources,
// preemptible, reclaiming; views[i] is nodes[i]'s. It also returns the
// snapshot's generation: the highest of its NodeInfos (every change to a
// node or its pods raises it). Computing a view for every node in every plan
// cost more than the plan itself on large clusters (commit 4d7ad62; views and
// plan together are BenchmarkPlanGang in BENCHMARKS.md, "Planning one gang"),
// so each node's view is kept until its NodeInfo changes, and a pass over an
// unchanged snapshot reads only the NodeInfos' generations: the returned
// slice is the one the last call returned, with only the changed nodes' views
// rewritten. The planner never writes a NodeView's Free (views share it).
//
// The nodes' free DRA GPUs (dra, nil when none) are part of each view; a
// change of them rewrites the node's view, and of the generation returned.
func (n *nodeViews) views(nodes []fwk.NodeInfo, dra *draState) ([]gang.NodeView, int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.kept) > 2*len(nodes)+1024 {
		// Forget the nodes that left. Every node of this snapshot goes
		// back in on this pass, changed or not: subtractHeld finds nodes
		// only there.
		n.kept = make(map[string]cachedView, len(nodes))
		n.last = nil
	}
	// The snapshot updates its NodeInfos in place and keeps their order, so
	// most nodes are found at the same position as in the last call.
	last := n.last
	if len(last) != len(nodes) || len(n.buf) != len(nodes) {
		last = nil
		n.last = make([]cachedView, len(nodes))
		n.buf = make([]gang.NodeView, len(nodes))
		n.heldBuf, n.heldTaken = make([]gang.NodeView, len(nodes)), nil
	}
	views := n.buf
	var generation int64
	for i, ni := range nodes {
		gen := ni.GetGeneration()
		generation = max(generation, gen)
		var draFree int64
		if ni.Node() != nil {
			draFree = dra.freeOn(ni.Node().Name)
		}
		if last != nil && last[i].info == ni && last[i].generation == gen && last[i].draFree == draFree {
			continue // views[i] still holds its view
		}
		node := ni.Node()
		if node == nil {
			// Not in a scheduler's snapshot; keep views[i] nodes[i]'s.
			views[i] = gang.NodeView{Node: &v1.Node{}, Reclaiming: true}
			n.heldBuf[i] = views[i]
			n.last[i] = cachedView{pos: -1}
			continue
		}
		c, ok := n.kept[node.Name]
		if !ok || c.generation != gen || c.view.Node != node || c.draFree != draFree {
			free := freeOnNode(ni)
			nodeGPUs(&free, ni, n.gpu, draFree)
			c = cachedView{generation: gen, draFree: draFree, view: gang.NewNodeView(node, free, n.gpu,
				n.preemptible(node), n.reclaiming(node))}
		}
		c.info, c.pos = ni, i
		n.kept[node.Name] = c
		n.last[i] = c
		views[i], n.heldBuf[i] = c.view, c.view
	}
	if dra != nil {
		generation ^= dra.version << 1
	}
	return views, generation
}

// subtractHeld returns views (the answer of views) with held taken out of the
// nodes' free resources (a negative holding adds), in a copy: the views are
// kept between plans. The copy is kept too, equal to views but at the
// positions the last call took from, which are restored first; so a call
// costs as many nodes as are held, not the whole cluster. It finds a held
// node by its position in the last nodes list instead of reading the name
// of every node.
func (n *nodeViews) subtractHeld(views []gang.NodeView, held map[string]gang.Resources) []gang.NodeView {
	if len(held) == 0 {
		return views
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.heldBuf
	for _, pos := range n.heldTaken {
		out[pos] = views[pos]
	}
	n.heldTaken = n.heldTaken[:0]
	for name, h := range held {
		c, ok := n.kept[name]
		if !ok || c.pos < 0 || c.pos >= len(out) || out[c.pos].Node.Name != name {
			continue // not in this snapshot: nothing to take from
		}
		out[c.pos].Take(h)
		n.heldTaken = append(n.heldTaken, c.pos)
	}
	return out
}
