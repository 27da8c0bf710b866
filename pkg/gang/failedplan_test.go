package gang

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Every node is counted once, by the first reason it cannot take the
// gang's largest member, in the order kubectl-muster explains them; a node
// the planner saw room on but a framework filter refused counts under that
// filter's name.
func TestTallyNodesCountsEachNodeByItsFirstReason(t *testing.T) {
	nodes := views(
		testNode{name: "cordoned", rack: "r1", cordoned: true},
		testNode{name: "reclaimed", rack: "r1", reclaiming: true, spot: true},
		testNode{name: "spot", rack: "r1", spot: true},
		testNode{name: "tainted", rack: "r1", taints: []v1.Taint{{Key: "dedicated", Value: "infer", Effect: v1.TaintEffectNoSchedule}}},
		testNode{name: "no-rack"},
		testNode{name: "full", rack: "r1", used: 4},
		testNode{name: "refused", rack: "r2"},
		testNode{name: "room-1", rack: "r2"},
		testNode{name: "room-2", rack: "r3"},
	)
	nodes[5].Free.Pods = 0 // no effect: its GPUs come first
	small := Member{UID: "a", Name: "a", Request: Resources{MilliCPU: 1000, Scalars: map[v1.ResourceName]int64{gpu: 2}}}
	large := Member{UID: "b", Name: "b", Request: Resources{MilliCPU: 1000, Scalars: map[v1.ResourceName]int64{gpu: 8}},
		Constraints: ConstraintsOf(klog.Background(), &v1.Pod{})}
	req := Request{Gang: "ns/g", Members: []Member{small, large}, GPU: gpu, Levels: defaultLevels, Required: "rack", Policy: PolicyForbid}
	got := TallyNodes(req, nodes, func(node string) string {
		if node == "refused" || node == "spot" {
			return "InterPodAffinity" // spot: the policy comes first
		}
		return ""
	}, "r2")
	want := []NodeReasonCount{
		{Reason: NodeCordoned, Nodes: 1},
		{Reason: NodeReclaiming, Nodes: 1},
		{Reason: NodePolicy, Nodes: 1},
		{Reason: NodeUnmatched, Nodes: 1},
		{Reason: NodeNoDomain, Nodes: 1},
		{Reason: NodeInsufficientGPUs, Nodes: 1},
		{Reason: NodeFilterRejected, Filter: "InterPodAffinity", Nodes: 1},
		{Reason: NodeHasRoom, Nodes: 1},       // room-1, in the closest rack
		{Reason: NodeOutsideDomain, Nodes: 1}, // room-2, in r3
	}
	assert.Equal(t, want, got)

	// Enough GPUs but no pod slot left: the other resources.
	nodes = views(testNode{name: "n1", rack: "r1"})
	nodes[0].Free.Pods = 0
	small.Request.Pods = 1
	assert.Equal(t, []NodeReasonCount{{Reason: NodeInsufficientOther, Nodes: 1}},
		TallyNodes(Request{Members: []Member{small}, GPU: gpu}, nodes, nil, ""))
	assert.Nil(t, TallyNodes(Request{GPU: gpu}, nodes, nil, ""), "no members, nothing to count")
}

// The planner names the domain of the required level that came closest:
// what the record counts nodes outside of.
func TestUnplaceableNamesTheClosestDomain(t *testing.T) {
	nodes := views(testNode{name: "a1", rack: "r1"}, testNode{name: "a2", rack: "r1"}, testNode{name: "b1", rack: "r2"})
	var members []Member
	for i := range 3 {
		members = append(members, Member{UID: types.UID(fmt.Sprint(i)), Name: fmt.Sprint(i), Request: Resources{Scalars: map[v1.ResourceName]int64{gpu: 8}}})
	}
	req := Request{Gang: "ns/g", Members: members, Needed: 3, GPU: gpu, Levels: defaultLevels, Required: "rack"}
	_, err := Compute(req, nodes)
	var u *Unplaceable
	require.ErrorAs(t, err, &u)
	assert.Equal(t, "r1", u.Closest, "rack r1 holds 2 of 3: %s", u.Message)
	req.Required = ""
	_, err = Compute(req, views(testNode{name: "a1", rack: "r1"}))
	require.ErrorAs(t, err, &u)
	assert.Empty(t, u.Closest, "no required level")
}

// The record stays small: at most maxReasonCounts counts (the smallest
// folded into Other) and a bounded message, cut on a rune boundary.
func TestFailedPlanIsBounded(t *testing.T) {
	var nodes []testNode
	for i := range 40 {
		for range i + 1 {
			nodes = append(nodes, testNode{name: fmt.Sprintf("n%d-%d", i, len(nodes)), rack: "r1"})
		}
	}
	m := Member{UID: "a", Name: "a", Request: Resources{Scalars: map[v1.ResourceName]int64{gpu: 1}}}
	counts := TallyNodes(Request{Members: []Member{m}, GPU: gpu}, views(nodes...), func(node string) string {
		return "Filter" + strings.Split(node, "-")[0]
	}, "")
	require.Len(t, counts, maxReasonCounts)
	total := 0
	for _, c := range counts {
		total += c.Nodes
	}
	assert.Equal(t, len(nodes), total, "every node counted once")
	assert.Equal(t, NodeReasonCount{Reason: NodeFilterRejected, Filter: "Filtern39", Nodes: 40}, counts[0])
	assert.Equal(t, NodeOther, counts[maxReasonCounts-1].Reason)

	f := &FailedPlan{Time: time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC), Nodes: counts, Message: strings.Repeat("é", maxFailedPlanMessage)}
	encoded := f.Encode()
	assert.Less(t, len(encoded), 2*maxFailedPlanMessage)
	back, err := DecodeFailedPlan(encoded)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(back.Message, "…"))
	assert.True(t, strings.HasPrefix(f.Message, strings.TrimSuffix(back.Message, "…")), "cut inside a rune")
	assert.Equal(t, f.Nodes, back.Nodes)
	assert.True(t, f.Time.Equal(back.Time))
	_, err = DecodeFailedPlan("{")
	assert.Error(t, err)
}

// A level read from device attributes has no node label for a node to
// miss: NodeReason never counts a node as NoTopologyLabel for it.
func TestNodeReasonDeviceAttributeLevel(t *testing.T) {
	nodes := views(testNode{name: "n1"})
	levels := []Level{{Name: "node", Label: v1.LabelHostname}, {Name: "nvlink", Attribute: "gpu.example.com/nvlinkDomain"}}
	req := request(gangOf(1, 2), func(r *Request) { r.Levels, r.Required = levels, "nvlink" })
	assert.Equal(t, NodeHasRoom, NodeReason(req, req.Members[0], &nodes[0], ""))
	req.Levels, req.Required = defaultLevels, "rack"
	assert.Equal(t, NodeNoDomain, NodeReason(req, req.Members[0], &nodes[0], ""), "a label level the node lacks")
}
