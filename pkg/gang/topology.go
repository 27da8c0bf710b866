package gang

import (
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// TopologyIndex numbers the domains of every topology level and remembers,
// per node object, the number of its domain at each level. Planning then
// sums and groups nodes by small integers instead of hashing the label
// strings of every node at every level in every plan. The scheduler's
// snapshot replaces a node object when the node changes, so an entry keyed
// by the object stays right for as long as that object is in use.
//
// One index serves every plan of a scheduler profile (Request.Topology);
// it is safe for concurrent use.
type TopologyIndex struct {
	mu     sync.Mutex
	levels []Level
	// ids[l] numbers level l's label values from 1; 0 is "no domain" (the
	// node lacks the label). names[l][id] is the value.
	ids   []map[string]int32
	names [][]string
	// nameRanks[l][id] is the place of names[l][id] among level l's names
	// in sorted order, so ranking domains compares integers; rebuilt (never
	// changed in place) when a level gains a domain.
	nameRanks [][]int32
	nodes     map[*v1.Node][]int32
	// recent remembers the last answers of domainsOf: consecutive plans
	// mostly see the same node objects in the same order.
	recent []domainsAnswer
	// devices resolves the levels named by a device attribute; its
	// version changes whenever an answer may have.
	devices        DeviceDomains
	devicesVersion int64
}

// DeviceDomains names a node's domain at a level taken from a device
// attribute: the attribute's value on the node's devices ("" for none).
type DeviceDomains interface {
	Domain(node, attribute string) string
}

// SetDeviceDomains makes d resolve the attribute levels; a new version
// forgets every node's remembered domains.
func (t *TopologyIndex) SetDeviceDomains(d DeviceDomains, version int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.devices == d && t.devicesVersion == version {
		return
	}
	t.devices, t.devicesVersion = d, version
	t.nodes, t.recent = map[*v1.Node][]int32{}, nil
}

// LabelDomain is node's domain at the level named level when that level
// is read from a node label; ok is false for the cluster, for an unknown
// level and for a level read from devices (no node event tells of those).
func (t *TopologyIndex) LabelDomain(level string, node *v1.Node) (domain string, ok bool) {
	for _, l := range t.levels {
		if l.Name == level && l.Attribute == "" {
			return node.Labels[l.Label], true
		}
	}
	return "", false
}

// valueOf is node's domain name at level l.
func (t *TopologyIndex) valueOf(l int, node *v1.Node) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.valueLocked(l, node)
}

func (t *TopologyIndex) valueLocked(l int, node *v1.Node) string {
	level := t.levels[l]
	if level.Attribute == "" {
		return node.Labels[level.Label]
	}
	if t.devices == nil {
		return ""
	}
	return t.devices.Domain(node.Name, level.Attribute)
}

type domainsAnswer struct {
	nodes    []*v1.Node
	perLevel [][]int32
	groups   []grouping
}

// grouping lists one level's nodes domain by domain: the nodes (indexes into
// the node list) of domain id are order[start[id]:start[id+1]], ascending.
// Domain membership only changes with the node list, so a plan reads its
// domains' node lists from here instead of collecting them.
type grouping struct {
	start []int32
	order []int
	// largest is the most nodes in one domain (0: the level has none).
	largest int32
}

func (g grouping) nodesOf(id int32) []int {
	if int(id)+1 >= len(g.start) {
		return nil
	}
	return g.order[g.start[id]:g.start[id+1]:g.start[id+1]]
}

// groupByDomain is a counting sort of the nodes by their domain number.
func groupByDomain(ids []int32, domains int) grouping {
	g := grouping{start: make([]int32, domains+1), order: make([]int, len(ids))}
	for _, id := range ids {
		g.start[id+1]++
	}
	for id := 2; id <= domains; id++ { // start[1] counts the nodes of no domain
		g.largest = max(g.largest, g.start[id])
	}
	for id := 1; id <= domains; id++ {
		g.start[id] += g.start[id-1]
	}
	next := append([]int32(nil), g.start[:domains]...)
	for i, id := range ids {
		g.order[next[id]] = i
		next[id]++
	}
	return g
}

// recentAnswers is how many node lists domainsOf remembers (gangs of
// different policies see different eligible nodes).
const recentAnswers = 4

// NewTopologyIndex returns an empty index for levels.
func NewTopologyIndex(levels []Level) *TopologyIndex {
	t := &TopologyIndex{levels: append([]Level(nil), levels...), nodes: map[*v1.Node][]int32{}}
	for range levels {
		t.ids = append(t.ids, map[string]int32{})
		t.names = append(t.names, []string{""})
	}
	return t
}

// serves reports whether the index was built for these levels.
func (t *TopologyIndex) serves(levels []Level) bool {
	if t == nil || len(t.levels) != len(levels) {
		return false
	}
	for i := range levels {
		if t.levels[i] != levels[i] {
			return false
		}
	}
	return true
}

// domainsOf returns, per level, the domain number of each node, the nodes
// grouped by domain, and the domain names by number (append-only: safe to
// read while others plan).
func (t *TopologyIndex) domainsOf(nodes []*NodeView) (perLevel [][]int32, groups []grouping, names [][]string, nameRanks [][]int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, a := range t.recent {
		if sameNodes(a.nodes, nodes) {
			copy(t.recent[1:i+1], t.recent[:i]) // most recent first
			t.recent[0] = a
			names, nameRanks = t.namesLocked()
			return a.perLevel, a.groups, names, nameRanks
		}
	}
	// Forget objects of nodes that changed or left once they dominate,
	// and the domains only they were in: a fleet that replaces its nodes
	// (spot, autoscaling) brings new hostnames every day.
	if len(t.nodes) > 2*len(nodes)+1024 {
		t.nodes = make(map[*v1.Node][]int32, len(nodes))
		t.renumberLocked()
	}
	perLevel = make([][]int32, len(t.levels))
	for l := range perLevel {
		perLevel[l] = make([]int32, len(nodes))
	}
	for i := range nodes {
		ids, ok := t.nodes[nodes[i].Node]
		if !ok {
			ids = make([]int32, len(t.levels))
			for l := range t.levels {
				ids[l] = t.idLocked(l, t.valueLocked(l, nodes[i].Node))
			}
			t.nodes[nodes[i].Node] = ids
		}
		for l, id := range ids {
			perLevel[l][i] = id
		}
	}
	names, nameRanks = t.namesLocked() // new domains were numbered above
	groups = make([]grouping, len(t.levels))
	for l := range groups {
		groups[l] = groupByDomain(perLevel[l], len(names[l]))
	}
	answer := domainsAnswer{nodes: make([]*v1.Node, len(nodes)), perLevel: perLevel, groups: groups}
	for i := range nodes {
		answer.nodes[i] = nodes[i].Node
	}
	if len(t.recent) < recentAnswers {
		t.recent = append(t.recent, domainsAnswer{})
	}
	copy(t.recent[1:], t.recent)
	t.recent[0] = answer
	return perLevel, groups, names, nameRanks
}

// namesLocked returns the names of every level's domains and their ranks,
// ranking the names of a level that gained domains since the last call.
func (t *TopologyIndex) namesLocked() (names [][]string, nameRanks [][]int32) {
	if len(t.nameRanks) != len(t.names) {
		t.nameRanks = make([][]int32, len(t.names))
	}
	for l, levelNames := range t.names {
		if len(t.nameRanks[l]) == len(levelNames) {
			continue
		}
		order := make([]int32, len(levelNames))
		for id := range order {
			order[id] = int32(id)
		}
		slices.SortFunc(order, func(a, b int32) int { return strings.Compare(levelNames[a], levelNames[b]) })
		ranks := make([]int32, len(levelNames))
		for rank, id := range order {
			ranks[id] = int32(rank)
		}
		t.nameRanks[l] = ranks
	}
	names = make([][]string, len(t.names))
	copy(names, t.names)
	nameRanks = make([][]int32, len(t.nameRanks))
	copy(nameRanks, t.nameRanks)
	return names, nameRanks
}

func sameNodes(known []*v1.Node, nodes []*NodeView) bool {
	if len(known) != len(nodes) {
		return false
	}
	for i := range nodes {
		if known[i] != nodes[i].Node {
			return false
		}
	}
	return true
}

// renumberLocked forgets every domain number; the nodes seen next are
// numbered afresh. A plan under way keeps the names and numbers domainsOf
// gave it (new slices replace these, none is changed in place), and the
// recent answers, numbered the old way, go.
func (t *TopologyIndex) renumberLocked() {
	for l := range t.levels {
		t.ids[l] = map[string]int32{}
		t.names[l] = []string{""}
	}
	t.nameRanks, t.recent = nil, nil
}

// domainIn returns the number of value among a plan's domain names (from
// domainsOf), or -1 when no node of the plan is in that domain.
func domainIn(names []string, value string) int32 {
	if i := slices.Index(names, value); i > 0 {
		return int32(i)
	}
	return -1
}

func (t *TopologyIndex) idLocked(l int, value string) int32 {
	if value == "" {
		return 0
	}
	id, ok := t.ids[l][value]
	if !ok {
		id = int32(len(t.names[l]))
		t.ids[l][value] = id
		t.names[l] = append(t.names[l], value)
	}
	return id
}

// Sizes counts what the index keeps: node objects with their domain
// numbers, domain names over every level, and remembered answers. Both
// are bounded by the nodes of the last lists (domainsOf renumbers when
// nodes that left dominate), not by every node ever seen.
func (t *TopologyIndex) Sizes() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{"topology nodes": len(t.nodes), "topology answers": len(t.recent), "topology domains": 0}
	for _, ids := range t.ids {
		out["topology domains"] += len(ids)
	}
	return out
}
