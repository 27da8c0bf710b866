package gang

import (
	"fmt"
	"iter"
	"sort"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Level is one topology level: a name users write in annotations and the node
// label whose value names a node's domain at that level, or a device
// attribute whose value on the node's devices names it (a DRA driver's
// NVLink clique, say; resolved through TopologyIndex.SetDeviceDomains).
type Level struct {
	Name      string
	Label     string
	Attribute string
}

// clusterLevel is the implicit widest domain: every eligible node.
const clusterLevel = "cluster"

// NodeView is what the planner knows of one node. NewNodeView also keeps
// the node's free GPUs and cordon beside Free: a plan reads them for every
// node, and reading them from the node's own map and object is a cache miss
// each, which on large clusters cost more than the rest of the plan (the
// profile is in the message of commit 19969e8; the planner's cost today is
// in BENCHMARKS.md, "Planning one gang").
type NodeView struct {
	Node *v1.Node
	// Free is allocatable minus everything requested, minus the capacity other
	// gangs' plans hold on it. Change it with Take, which keeps the cache.
	Free        Resources
	Preemptible bool
	// Reclaiming nodes (spot reclaim notice, disruption taint) and
	// Cordoned ones (spec.unschedulable) never receive a member
	// (Unavailable).
	Reclaiming bool
	Cordoned   bool

	gpu     v1.ResourceName // set by NewNodeView
	freeGPU int64           // Free.Scalars[gpu]
}

// NewNodeView returns the view of node with free resources free, gpu the
// name of the GPU resource the plans will ask for. The view keeps the
// node's cordon, so planning reads no node object for it.
func NewNodeView(node *v1.Node, free Resources, gpu v1.ResourceName, preemptible, reclaiming bool) NodeView {
	return NodeView{Node: node, Free: free, Preemptible: preemptible, Reclaiming: reclaiming, Cordoned: node.Spec.Unschedulable,
		gpu: gpu, freeGPU: free.Scalars[gpu]}
}

// Take takes r out of the view's free resources, in a copy of Free (views
// share it).
func (n *NodeView) Take(r Resources) {
	n.Free = n.Free.Clone()
	n.Free.Sub(r)
	n.freeGPU = n.Free.Scalars[n.gpu]
}

// gpus is the node's free GPUs of resource name.
func (n *NodeView) gpus(name v1.ResourceName) int64 {
	if n.gpu == name && name != "" {
		return n.freeGPU
	}
	return n.Free.Scalars[name]
}

// Unavailable reports that the node never receives a member: it is being
// reclaimed or it is cordoned. It is the one place that decides it, for
// plans and for choosing preemption victims.
func (n *NodeView) Unavailable() bool {
	return n.Reclaiming || n.Cordoned
}

// Eligible reports whether a gang of policy may use the node at all: it is
// available and the policy does not exclude it.
func (n *NodeView) Eligible(policy Policy) bool {
	return !n.Unavailable() && !policy.Excludes(n.Preemptible)
}

// Member is one pod to place.
type Member struct {
	UID     types.UID
	Name    string
	Request Resources
	// Fits evaluates the pod's node-level constraints (taints, node selector,
	// required node affinity). Members that share a pod template should share
	// one NodeConstraints so each node is evaluated once per template.
	Constraints *NodeConstraints
}

// Request is everything the planner needs to place one gang.
type Request struct {
	Gang    string
	Members []Member
	// Needed is how many of Members must be placed (quorum minus members
	// already bound). When fewer than all fit, a plan of Needed members is
	// accepted.
	Needed    int
	GPU       v1.ResourceName
	Levels    []Level
	Required  string // level name or ""
	Preferred string // level name or ""
	Policy    Policy
	// BoundNodes are the nodes of the gang's members that already run (one
	// entry per member). They are fixed parts of the plan: the topology
	// constraint covers them, so a replacement joins the gang's domain.
	BoundNodes []string
	// Check confirms each (member, node) choice with the scheduler's own
	// filters; nil accepts every choice the planner's screening allows.
	Check Checker
	// Topology, when built for Levels, keeps each node's domains between
	// plans; nil (or built for other levels) costs one label lookup per node
	// and level in this plan.
	Topology *TopologyIndex

	boundNodes map[string]*v1.Node // BoundNodes resolved by Compute
}

// Checker confirms the planner's choices with rules the planner does not
// evaluate itself (the scheduling framework's Filter plugins). The planner
// tries nodes in its own order and asks only about the node it would take.
type Checker interface {
	// Trial starts one attempt at placing the members; choices made in one
	// trial do not affect another.
	Trial() Trial
}

// Trial is one attempt at placing members.
type Trial interface {
	// Fits reports whether member m may go on node, given the members
	// placed so far in this trial.
	Fits(m *Member, node *v1.Node) bool
	// Assign records that m goes on node.
	Assign(m *Member, node *v1.Node)
}

// Plan is where every planned member goes.
type Plan struct {
	Slots map[types.UID]string
	// Level and Domain name the topology domain the gang was placed in.
	Level  string
	Domain string
	// PreemptibleNodes is how many distinct preemptible nodes the plan uses.
	PreemptibleNodes int
	Nodes            int
}

// Unplaceable explains why no plan exists.
type Unplaceable struct {
	Message string
	// Closest is the domain of the required topology level that came
	// closest to holding the gang (most members placed); "" without a
	// required level or when no member fit anywhere.
	Closest string
}

func (u *Unplaceable) Error() string { return u.Message }

// scan is what Compute reads of every eligible node once per plan, so the
// levels and domains it tries read slices rather than maps.
type scan struct {
	gpu     []int64   // free GPUs, never negative
	maxGPU  int64     // the most of gpu
	spots   []bool    // preemptible
	domains [][]int32 // per level, per node: its domain number (0: none)
	groups  []grouping
	names   [][]string
	// nameRanks[l][id] is the place of names[l][id] in sorted order.
	nameRanks [][]int32
	topo      *TopologyIndex
}

// planScratch holds Compute's per-node slices between plans: allocating
// and collecting them for every plan was a large part of a plan's cost on
// large clusters (BenchmarkCompute before and after: the message of commit
// 1376d84; today's figures: BENCHMARKS.md, "Planning one gang"). Nothing
// Compute returns refers to them.
type planScratch struct {
	eligible []*NodeView
	gpu      []int64
	spots    []bool
	slots    []int
}

var scratchPool = sync.Pool{New: func() any { return &planScratch{} }}

// grow returns buf resized to n, reusing its array when it is large enough.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	return buf[:n]
}

func newScan(req Request, eligible []*NodeView, scratch *planScratch) *scan {
	topo := req.Topology
	if !topo.serves(req.Levels) {
		topo = NewTopologyIndex(req.Levels)
	}
	scratch.gpu, scratch.spots = grow(scratch.gpu, len(eligible)), grow(scratch.spots, len(eligible))
	s := &scan{gpu: scratch.gpu, spots: scratch.spots, topo: topo}
	for i := range eligible {
		s.gpu[i] = max(eligible[i].gpus(req.GPU), 0)
		s.maxGPU = max(s.maxGPU, s.gpu[i])
		s.spots[i] = eligible[i].Preemptible
	}
	s.domains, s.groups, s.names, s.nameRanks = topo.domainsOf(eligible)
	return s
}

// domain is a set of eligible nodes sharing a label value at one level.
type domain struct {
	name        string
	nodes       []int // indexes into the eligible node slice (read-only)
	freeGPU     int64
	preemptGPU  int64
	eligibleCnt int
}

// placement is the outcome of placing members in one domain.
type placement struct {
	slots map[types.UID]string
	// chosen is the eligible node of each placed member, in placing order.
	chosen   []int
	placed   int
	cost     int // preemptible nodes used (avoid) or on-demand nodes used (prefer)
	nodes    int
	spotUsed int
	leftover int64
	level    string
	domain   string
	levelIdx int
}

// Compute finds a placement for the gang: the tightest topology level whose
// best domain fits it, best fit among that level's domains (least GPUs left
// over), members packed onto as few nodes as possible. The preemptible policy
// filters nodes (forbid, require) or weighs them (avoid, prefer); a wider
// domain is chosen over a tighter one only when it uses fewer nodes the
// policy dislikes.
func Compute(req Request, nodes []NodeView) (*Plan, error) {
	if len(req.Members) == 0 {
		return &Plan{Slots: map[types.UID]string{}}, nil
	}
	scratch := scratchPool.Get().(*planScratch)
	defer func() {
		clear(scratch.eligible) // hold no views in the pool
		scratchPool.Put(scratch)
	}()
	eligible, excluded := eligibleNodes(req.Policy, nodes, scratch.eligible[:0])
	scratch.eligible = eligible
	if len(eligible) == 0 {
		return nil, &Unplaceable{Message: fmt.Sprintf("gang %s: no eligible node (%s)", req.Gang, excluded)}
	}

	if len(req.BoundNodes) > 0 {
		req.boundNodes = make(map[string]*v1.Node, len(req.BoundNodes))
		for _, name := range req.BoundNodes {
			req.boundNodes[name] = nil
		}
		for _, n := range nodes {
			if _, ok := req.boundNodes[n.Node.Name]; ok {
				req.boundNodes[n.Node.Name] = n.Node
			}
		}
	}
	startIdx, endIdx, err := levelRange(req)
	if err != nil {
		return nil, err
	}
	members := sortedMembers(req.Members)
	feasible := newFeasibility(members, eligible)
	sc := newScan(req, eligible, scratch)

	counts := []int{len(members)}
	if req.Needed > 0 && req.Needed < len(members) {
		counts = append(counts, req.Needed)
	}
	screenOnly := req
	screenOnly.Check = nil
	var best *placement
	mostPlaced, mostPlacedWhere := 0, ""
	for _, count := range counts {
		want := members[:count]
		needGPU := int64(0)
		for _, m := range want {
			needGPU += m.Request.Scalars[req.GPU]
		}
		fits, gpuMembers := memberSlots(want, sc, req.GPU, scratch)
		for li := startIdx; li <= endIdx; li++ {
			levelName, doms := domainsAt(req, li, sc, needGPU, fits, gpuMembers)
			for d := range doms {
				if d.freeGPU < needGPU || d.eligibleCnt == 0 {
					continue
				}
				// Screen first: the filters (req.Check) only refuse more, so
				// a domain the screening cannot fill is skipped without
				// running them.
				p := placeInDomain(want, d, eligible, sc, feasible, screenOnly, nil)
				if p.placed == count && req.Check != nil {
					if r := confirm(req.Check, want, p, eligible); r != nil {
						p = placeInDomain(want, d, eligible, sc, feasible, req, r)
					}
				}
				if p.placed > mostPlaced {
					mostPlaced, mostPlacedWhere = p.placed, levelName+" "+d.name
				}
				if p.placed < count {
					continue
				}
				p.level, p.domain, p.levelIdx = levelName, d.name, li
				if best == nil || p.cost < best.cost {
					best = p
				}
				break // domains are ranked: the first that fits is this level's best
			}
			if best != nil && best.cost == 0 {
				break // nothing wider can do better
			}
		}
		if best != nil {
			break
		}
	}
	if best == nil {
		// Say how close the gang came: the most members that fit in one
		// domain of the widest level it may use (by the planner's own
		// screening; what the filters rejected is reported by the Checker).
		levelName, doms := domainsAt(req, endIdx, sc, 0, nil, 0)
		for d := range doms {
			if p := placeInDomain(members, d, eligible, sc, feasible, screenOnly, nil); p.placed > mostPlaced {
				mostPlaced, mostPlacedWhere = p.placed, levelName+" "+d.name
			}
		}
		u := &Unplaceable{Message: unplaceableMessage(req, members, eligible, feasible, excluded, mostPlaced, mostPlacedWhere, endIdx)}
		if endIdx < len(req.Levels) && mostPlaced > 0 {
			u.Closest = strings.TrimPrefix(mostPlacedWhere, req.Levels[endIdx].Name+" ")
		}
		return nil, u
	}
	return &Plan{Slots: best.slots, Level: best.level, Domain: best.domain, PreemptibleNodes: best.spotUsed, Nodes: best.nodes}, nil
}

// eligibleNodes appends to eligible the nodes the policy allows that are
// not being reclaimed, and says why the others are not.
func eligibleNodes(policy Policy, nodes []NodeView, eligible []*NodeView) ([]*NodeView, string) {
	reclaiming, byPolicy := 0, 0
	for i := range nodes {
		n := &nodes[i]
		switch {
		case n.Unavailable():
			reclaiming++
		case policy.Excludes(n.Preemptible):
			byPolicy++
		default:
			eligible = append(eligible, n)
		}
	}
	var why []string
	if byPolicy > 0 {
		kind := "preemptible"
		if policy == PolicyRequire {
			kind = "on-demand"
		}
		why = append(why, fmt.Sprintf("policy %s excludes %d %s nodes", policy, byPolicy, kind))
	}
	if reclaiming > 0 {
		why = append(why, fmt.Sprintf("%d nodes are being reclaimed or cordoned", reclaiming))
	}
	if len(nodes) == 0 {
		why = append(why, "the cluster has no nodes")
	}
	return eligible, strings.Join(why, "; ")
}

// levelRange returns the first and last level index to try; len(Levels)
// stands for the whole cluster.
func levelRange(req Request) (int, int, error) {
	index := func(name string) (int, error) {
		for i, l := range req.Levels {
			if l.Name == name {
				return i, nil
			}
		}
		return 0, fmt.Errorf("unknown topology level %q (known: %s)", name, levelNames(req.Levels))
	}
	start, end := 0, len(req.Levels)
	if req.Required != "" {
		i, err := index(req.Required)
		if err != nil {
			return 0, 0, err
		}
		end = i
	}
	if req.Preferred != "" {
		i, err := index(req.Preferred)
		if err != nil {
			return 0, 0, err
		}
		if i <= end {
			start = i
		}
	}
	return start, end, nil
}

func levelNames(levels []Level) string {
	names := make([]string, len(levels))
	for i, l := range levels {
		names[i] = l.Name
	}
	return strings.Join(names, ", ")
}

// sortedMembers orders members largest GPU request first, then by name, so
// placement is deterministic and big members claim big holes first.
func sortedMembers(members []Member) []Member {
	out := append([]Member(nil), members...)
	sort.SliceStable(out, func(i, j int) bool {
		gi, gj := totalScalars(out[i].Request), totalScalars(out[j].Request)
		if gi != gj {
			return gi > gj
		}
		if out[i].Request.MilliCPU != out[j].Request.MilliCPU {
			return out[i].Request.MilliCPU > out[j].Request.MilliCPU
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func totalScalars(r Resources) int64 {
	var sum int64
	for _, q := range r.Scalars {
		sum += q
	}
	return sum
}

// feasibility evaluates each distinct set of node constraints on a node the
// first time a placement looks at that node: a plan mostly looks at a few
// domains, so most nodes are never evaluated.
type feasibility struct {
	eligible []*NodeView
	known    map[*NodeConstraints][]int8 // per node: 0 not yet, 1 fits, 2 does not
}

func newFeasibility(members []Member, eligible []*NodeView) *feasibility {
	f := &feasibility{eligible: eligible, known: map[*NodeConstraints][]int8{}}
	for _, m := range members {
		if _, done := f.known[m.Constraints]; !done {
			f.known[m.Constraints] = make([]int8, len(eligible))
		}
	}
	return f
}

func (f *feasibility) fits(c *NodeConstraints, i int) bool {
	known := f.known[c]
	if known[i] == 0 {
		known[i] = 2
		if c.Match(f.eligible[i].Node) {
			known[i] = 1
		}
	}
	return known[i] == 1
}

// excludedForAll counts the eligible nodes whose taints, labels or fields
// no member's constraints accept: why a gang with free GPUs in view found
// no place, in its Unplaceable message.
func (f *feasibility) excludedForAll() int {
	n := 0
	for i := range f.eligible {
		usable := false
		for c := range f.known {
			if f.fits(c, i) {
				usable = true
				break
			}
		}
		if !usable {
			n++
		}
	}
	return n
}

// memberSlots is, per eligible node, how many of the members' smallest
// positive GPU request its free GPUs hold: an upper bound on the GPU members
// it can take. It also returns how many members ask for GPUs: only they need
// a slot. A member without GPUs (a PS, a Chief) needs a node that takes its
// CPU and memory, which placing the members checks node by node; counting it
// in GPU slots would refuse a domain that holds the whole gang.
func memberSlots(members []Member, sc *scan, gpu v1.ResourceName, scratch *planScratch) ([]int, int) {
	smallest, gpuMembers := smallestGPUAsked(members, gpu)
	if gpuMembers == 0 {
		return nil, 0 // no GPUs asked: no bound from GPUs
	}
	// Members that all keep one per node (required anti-affinity against
	// each other) take at most one slot of any node.
	perNode := len(sc.gpu) + len(members)
	if onePerNode(members) {
		perNode = 1
	}
	scratch.slots = grow(scratch.slots, len(sc.gpu))
	slots := scratch.slots
	for i, free := range sc.gpu {
		slots[i] = min(int(free/smallest), perNode)
	}
	return slots, gpuMembers
}

func onePerNode(members []Member) bool {
	for _, m := range members {
		if m.Constraints == nil || !m.Constraints.OnePerNode {
			return false
		}
	}
	return len(members) > 0
}

// smallestGPUAsked is the least GPUs a member that asks for GPUs asks for,
// and how many members ask for GPUs: the members without GPUs are left out
// (smallestGPU counts them).
func smallestGPUAsked(members []Member, gpu v1.ResourceName) (smallest int64, gpuMembers int) {
	for _, m := range members {
		if g := m.Request.Scalars[gpu]; g > 0 {
			gpuMembers++
			if smallest == 0 || g < smallest {
				smallest = g
			}
		}
	}
	return smallest, gpuMembers
}

// smallestGPU is the least GPUs any member asks for: 0 when one asks none
// (smallestGPUAsked leaves those out).
func smallestGPU(members []Member, gpu v1.ResourceName) int64 {
	smallest := int64(-1)
	for _, m := range members {
		if g := m.Request.Scalars[gpu]; smallest < 0 || g < smallest {
			smallest = g
		}
	}
	return max(smallest, 0)
}

// domainsAt ranks the domains of level li (the cluster when li ==
// len(Levels)) that have at least minGPU free GPUs and, when slots is given,
// room for minMembers members by memberSlots. Nodes without the label (or
// with an empty value) form no domain at that level. Only per-domain sums are
// computed here; a domain's node list comes from the topology index's
// grouping when the ranking reaches it, so a level with thousands of
// qualifying one-node domains costs one pass over the nodes and a heap.
func domainsAt(req Request, li int, sc *scan, minGPU int64, slots []int, minMembers int) (string, iter.Seq[*domain]) {
	if li == len(req.Levels) {
		d := &domain{name: "*", nodes: make([]int, 0, len(sc.gpu))}
		for i, free := range sc.gpu {
			d.add(i, free, sc.spots[i])
		}
		return clusterLevel, func(yield func(*domain) bool) { yield(d) }
	}
	none := func(func(*domain) bool) {}
	// Members that already run fix the domain: every one of them must be
	// in it, so at most one domain of this level qualifies.
	boundValue, boundOK := boundDomainAt(req, sc.topo, li)
	if !boundOK {
		return req.Levels[li].Name, none
	}
	bound := int32(0)
	if boundValue != "" {
		if bound = domainIn(sc.names[li], boundValue); bound < 0 {
			return req.Levels[li].Name, none // no eligible node is in it
		}
	}
	ids, names, nameRanks, group := sc.domains[li], sc.names[li], sc.nameRanks[li], sc.groups[li]
	if int64(group.largest)*sc.maxGPU < minGPU || group.largest == 0 {
		// No domain of this level can qualify (the node level for a gang
		// larger than any node's free GPUs, a label no node carries):
		// skip the pass over every node.
		return req.Levels[li].Name, none
	}
	return req.Levels[li].Name, func(yield func(*domain) bool) {
		sums := sumsPool.Get().(*domainSums)
		defer sumsPool.Put(sums)
		gpus, spot, room, count := sums.reset(len(names))
		for i, id := range ids {
			gpus[id] += sc.gpu[i]
			count[id]++
			if sc.spots[i] {
				spot[id] += sc.gpu[i]
			}
			if slots != nil {
				room[id] += int32(slots[i])
			}
		}
		q := qualifier{policy: req.Policy, bound: bound, minGPU: minGPU, minMembers: int32(minMembers), useRoom: slots != nil,
			gpus: gpus, spot: spot, room: room, count: count, nameRanks: nameRanks}
		for r := range q.ranked() {
			d := &domain{name: names[r.id], nodes: group.nodesOf(r.id), freeGPU: r.free, preemptGPU: r.spot, eligibleCnt: int(r.nodes)}
			if !yield(d) {
				return
			}
		}
	}
}

// domainSums is domainsAt's scratch: per domain number, its free GPUs, free
// GPUs on preemptible nodes, member room and eligible nodes.
type domainSums struct {
	gpus, spot  []int64
	room, count []int32
}

var sumsPool = sync.Pool{New: func() any { return &domainSums{} }}

func (s *domainSums) reset(n int) (gpus, spot []int64, room, count []int32) {
	if len(s.gpus) < n {
		s.gpus, s.spot, s.room, s.count = make([]int64, n), make([]int64, n), make([]int32, n), make([]int32, n)
	}
	gpus, spot, room, count = s.gpus[:n], s.spot[:n], s.room[:n], s.count[:n]
	clear(gpus)
	clear(spot)
	clear(room)
	clear(count)
	return gpus, spot, room, count
}

// boundDomainAt is the domain (label or attribute value) holding every
// bound member's node: "" when the gang has no bound members; ok is false
// when they span several domains of this level or a bound node has none.
func boundDomainAt(req Request, topo *TopologyIndex, level int) (value string, ok bool) {
	for _, name := range req.BoundNodes {
		n := req.boundNodes[name]
		if n == nil {
			continue // the node is gone from the snapshot
		}
		v := topo.valueOf(level, n)
		if v == "" || (value != "" && v != value) {
			return "", false
		}
		value = v
	}
	return value, true
}

func (d *domain) add(i int, freeGPU int64, preemptible bool) {
	d.nodes = append(d.nodes, i)
	d.freeGPU += freeGPU
	if preemptible {
		d.preemptGPU += freeGPU
	}
	d.eligibleCnt++
}

// ranked is a domain as qualifier.ranked orders it.
type ranked struct {
	cost, free, spot int64
	nodes, id        int32
	nameRank         int32 // the domain name's place in sorted order
}

// rankedLess orders domains by the GPUs the policy dislikes that the gang
// would have to use, then best fit (fewest free GPUs left over), then name.
func rankedLess(a, b *ranked) bool {
	if a.cost != b.cost {
		return a.cost < b.cost
	}
	if a.free != b.free {
		return a.free < b.free // least left over after need
	}
	return a.nameRank < b.nameRank
}

// policyCost is how many of the needed GPUs a domain can only offer on nodes
// the policy dislikes (Policy.Dislikes): of its free GPUs, spot are on
// preemptible nodes.
func policyCost(policy Policy, needGPU, free, spot int64) int64 {
	var disliked int64
	switch {
	case policy.Dislikes(true):
		disliked = spot
	case policy.Dislikes(false):
		disliked = free - spot
	default:
		return 0
	}
	return max(0, needGPU-(free-disliked))
}

// qualifier picks, from one level's per-domain sums, the domains a gang
// may use: those with room for it (and the bound members' domain, when
// bound is set).
type qualifier struct {
	policy                 Policy
	bound                  int32
	minGPU                 int64
	minMembers             int32
	useRoom                bool
	gpus, spot             []int64
	room, count, nameRanks []int32
}

// ok reports whether domain id qualifies (small enough to inline: most
// domains of a level do not).
func (q *qualifier) ok(id int32) bool {
	return (q.bound == 0 || id == q.bound) && q.count[id] > 0 && q.gpus[id] >= q.minGPU && (!q.useRoom || q.room[id] >= q.minMembers)
}

func (q *qualifier) rank(id int32) ranked {
	return ranked{cost: policyCost(q.policy, q.minGPU, q.gpus[id], q.spot[id]), free: q.gpus[id], spot: q.spot[id],
		nodes: q.count[id], id: id, nameRank: q.nameRanks[id]}
}

// ranked yields the qualifying domains in rankedLess order. Callers
// usually stop at the first domain that fits, so the best is found by one
// plain pass and the others are collected and ordered only when asked for
// (small gangs qualify in thousands of single-node domains).
func (q *qualifier) ranked() iter.Seq[ranked] {
	return func(yield func(ranked) bool) {
		var best ranked
		n := 0
		for id := int32(1); id < int32(len(q.count)); id++ {
			if q.ok(id) {
				if r := q.rank(id); n == 0 || rankedLess(&r, &best) {
					best = r
				}
				n++
			}
		}
		if n == 0 || !yield(best) {
			return
		}
		rest := make([]ranked, 0, n-1)
		for id := int32(1); id < int32(len(q.count)); id++ {
			if id != best.id && q.ok(id) {
				rest = append(rest, q.rank(id))
			}
		}
		order := newLazyOrder(rest, rankedLess)
		for i := 0; ; i++ {
			d := order.at(i)
			if d == nil || !yield(*d) {
				return
			}
		}
	}
}

// placeInDomain packs members (largest first) best-fit onto the domain's
// nodes: each goes to the node the policy likes that has the fewest free GPUs
// and still fits it, so members share nodes and big holes stay free.
func placeInDomain(members []Member, d *domain, eligible []*NodeView, sc *scan, feasible *feasibility, req Request, resume *resumePoint) *placement {
	type slot struct {
		idx     int
		gpuFree int64
		// free is copied from the node on first use: most nodes of a big
		// domain are only looked at.
		free *Resources
		rank int // 0 for nodes the policy likes
		// used: the gang has a member there (planned or running);
		// planned: this placement put a member there.
		used, planned bool
	}
	// Nodes with fewer free GPUs than the smallest member asks for take no
	// member: leave them out of the ordering.
	smallest := smallestGPU(members, req.GPU)
	slots := make([]slot, 0, len(d.nodes))
	for _, idx := range d.nodes {
		if smallest > 0 && sc.gpu[idx] < smallest {
			continue
		}
		n := eligible[idx]
		rank := 0
		if req.Policy.Dislikes(n.Preemptible) {
			rank = 1
		}
		_, bound := req.boundNodes[n.Node.Name]
		gpuFree := sc.gpu[idx] // the free GPUs, or 0 when over-committed
		if smallest == 0 {
			gpuFree = n.gpus(req.GPU) // an over-committed node takes no member
		}
		slots = append(slots, slot{idx: idx, gpuFree: gpuFree, rank: rank, used: bound})
	}
	less := func(a, b *slot) bool {
		if a.rank != b.rank {
			return a.rank < b.rank
		}
		// Nodes the gang already uses first: fewer nodes per gang.
		if a.used != b.used {
			return a.used
		}
		if a.gpuFree != b.gpuFree {
			return a.gpuFree < b.gpuFree
		}
		return eligible[a.idx].Node.Name < eligible[b.idx].Node.Name
	}
	order := newLazyOrder(slots, less)

	var trial Trial
	switch {
	case resume != nil:
		trial = resume.trial
	case req.Check != nil:
		trial = req.Check.Trial()
	}
	p := &placement{slots: make(map[types.UID]string, len(members)), chosen: make([]int, 0, len(members))}
	for mi := range members {
		m := &members[mi]
		gpus := m.Request.Scalars[req.GPU]
		for i := 0; ; i++ {
			s := order.at(i)
			if s == nil {
				break
			}
			if s.gpuFree < gpus || (s.planned && m.Constraints != nil && m.Constraints.OnePerNode) || !feasible.fits(m.Constraints, s.idx) {
				continue
			}
			free := s.free
			if free == nil {
				free = &eligible[s.idx].Free
			}
			if !free.Fits(m.Request) {
				continue
			}
			switch {
			case trial == nil:
			case resume != nil && mi < resume.confirmed:
				// Placed in the trial already: the screening chose this
				// very node, and the filters accepted it.
			case resume != nil && mi == resume.confirmed && s.idx == resume.refused:
				continue
			default:
				if !trial.Fits(m, eligible[s.idx].Node) {
					continue
				}
				trial.Assign(m, eligible[s.idx].Node)
			}
			if s.free == nil {
				c := eligible[s.idx].Free.Clone()
				s.free = &c
			}
			s.free.Sub(m.Request)
			s.gpuFree -= gpus
			if !s.planned {
				s.planned, s.used = true, true
				p.nodes++
				if s.rank == 1 {
					p.cost++
				}
				if eligible[s.idx].Preemptible {
					p.spotUsed++
				}
			}
			p.slots[m.UID] = eligible[s.idx].Node.Name
			p.chosen = append(p.chosen, s.idx)
			p.placed++
			order.moveUp(i) // its key only went down
			break
		}
	}
	return p
}

// confirm asks the filters about a screened placement's choices in the
// order it made them. Placing with the filters makes the same choices as
// long as they accept, so when they accept every one the screened
// placement is the answer (nil) and the domain is ordered once. At the
// first refusal it returns where placing with the filters resumes.
func confirm(check Checker, members []Member, p *placement, eligible []*NodeView) *resumePoint {
	trial := check.Trial()
	for i := range members {
		m := &members[i]
		node := eligible[p.chosen[i]].Node
		if !trial.Fits(m, node) {
			return &resumePoint{trial: trial, confirmed: i, refused: p.chosen[i]}
		}
		trial.Assign(m, node)
	}
	return nil
}

// resumePoint is a trial whose first confirmed members are placed (on the
// screened choices) and whose next member the filters refused on refused.
type resumePoint struct {
	trial     Trial
	confirmed int
	refused   int // eligible node index
}

func unplaceableMessage(req Request, members []Member, eligible []*NodeView, feasible *feasibility, excluded string, mostPlaced int, where string, endIdx int) string {
	var b strings.Builder
	need := len(members)
	if req.Needed > 0 && req.Needed < need {
		need = req.Needed
	}
	fmt.Fprintf(&b, "gang %s needs %s", req.Gang, describeMembers(members, req.GPU))
	if need < len(members) {
		fmt.Fprintf(&b, " (at least %d of them)", need)
	}
	if endIdx < len(req.Levels) {
		fmt.Fprintf(&b, " in one %s (topology-required)", req.Levels[endIdx].Name)
	}
	if strings.HasPrefix(where, clusterLevel) {
		where = "the cluster"
	}
	switch {
	case mostPlaced >= need:
		// The screening fits them; only the scheduler's filters (reported
		// by the Checker) refused.
		fmt.Fprintf(&b, "; their requests fit in %s, but not the scheduler's filters", where)
	case mostPlaced > 0:
		fmt.Fprintf(&b, "; at most %d fit (in %s)", mostPlaced, where)
	default:
		fmt.Fprintf(&b, "; none fit")
	}
	var freeGPU int64
	for _, n := range eligible {
		freeGPU += max(n.gpus(req.GPU), 0)
	}
	fmt.Fprintf(&b, "; %d eligible nodes have %d free %s", len(eligible), freeGPU, req.GPU)
	if n := feasible.excludedForAll(); n > 0 {
		fmt.Fprintf(&b, "; %d of them no member may use (untolerated taints, node selector or required node affinity)", n)
	}
	if excluded != "" {
		fmt.Fprintf(&b, "; %s", excluded)
	}
	return b.String()
}

// describeMembers says what the members ask for, grouped by request in
// their placing order: "4 members of 8 nvidia.com/gpu", or for a TFJob
// "2 members of 8 nvidia.com/gpu and 1 of 2000m cpu".
func describeMembers(members []Member, gpu v1.ResourceName) string {
	var parts []string
	last, count := "", 0
	flush := func() {
		if count == 0 {
			return
		}
		if len(parts) == 0 {
			parts = append(parts, fmt.Sprintf("%d members of %s", count, last))
		} else {
			parts = append(parts, fmt.Sprintf("%d of %s", count, last))
		}
	}
	for _, m := range members {
		d := describeRequest(m.Request, gpu)
		if d != last {
			flush()
			last, count = d, 0
		}
		count++
	}
	flush()
	return strings.Join(parts, " and ")
}

func describeRequest(r Resources, gpu v1.ResourceName) string {
	if g := r.Scalars[gpu]; g > 0 {
		return fmt.Sprintf("%d %s", g, gpu)
	}
	return fmt.Sprintf("%dm cpu", r.MilliCPU)
}

// FreeGPUs sums the free GPUs of the nodes a gang of policy may use: what
// preemption need not free.
func FreeGPUs(nodes []NodeView, policy Policy, gpu v1.ResourceName) int64 {
	var free int64
	for i := range nodes {
		if n := &nodes[i]; n.Eligible(policy) {
			free += max(n.gpus(gpu), 0)
		}
	}
	return free
}

// NeededGPUs is the least number of GPUs a plan for req places: the
// smallest GPU requests of req.Needed members (all of them when Needed is 0).
func NeededGPUs(req Request) int64 {
	gpus := make([]int64, len(req.Members))
	for i, m := range req.Members {
		gpus[i] = m.Request.Scalars[req.GPU]
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i] < gpus[j] })
	n := len(gpus)
	if req.Needed > 0 && req.Needed < n {
		n = req.Needed
	}
	var sum int64
	for _, g := range gpus[:n] {
		sum += g
	}
	return sum
}
