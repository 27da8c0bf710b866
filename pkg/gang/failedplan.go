package gang

import (
	"encoding/json"
	"sort"
	"time"
	"unicode/utf8"
)

// FailedPlanAnnotation, on a gang's object (Job, StatefulSet, PodGroup of
// either API), holds the scheduler's record of the gang's last failed plan
// as JSON (FailedPlan): the nodes it looked at, counted by the first reason
// each could not take a member. kubectl-muster reads it; nothing else
// depends on it.
const FailedPlanAnnotation = "muster.dev/last-failed-plan"

// Reasons a node cannot take a gang's member, in the order they are
// checked. The scheduler (TallyNodes) and kubectl-muster's live view use
// the same words.
const (
	NodeCordoned          = "Cordoned"
	NodeReclaiming        = "Reclaiming"
	NodePolicy            = "ExcludedByPolicy"
	NodeUnmatched         = "NodeConstraints" // taints, node selector or required node affinity
	NodeNoDomain          = "NoTopologyLabel"
	NodeInsufficientGPUs  = "InsufficientGPUs"
	NodeInsufficientOther = "InsufficientResources"
	NodeOutsideDomain     = "OutsideDomain"
	// NodeFilterRejected: the planner saw room, a framework filter (named
	// in NodeReasonCount.Filter) refused the member there.
	NodeFilterRejected = "FilterRejected"
	NodeHasRoom        = "HasRoom"
	// NodeOther folds the smallest counts beyond the bound.
	NodeOther = "Other"
)

// FailedPlan is what the scheduler records of a gang's last failed plan.
// Its size is bounded: at most maxReasonCounts counts and a message of at
// most maxFailedPlanMessage bytes.
type FailedPlan struct {
	Time time.Time `json:"time"`
	// Nodes counts every node the planner looked at once.
	Nodes   []NodeReasonCount `json:"nodes"`
	Message string            `json:"message"`
}

// NodeReasonCount is how many nodes share a reason (and, for
// FilterRejected, the filter).
type NodeReasonCount struct {
	Reason string `json:"reason"`
	Filter string `json:"filter,omitempty"`
	Nodes  int    `json:"nodes"`
}

const (
	maxReasonCounts      = 12
	maxFailedPlanMessage = 1024
)

// Encode is the annotation's value.
func (f *FailedPlan) Encode() string {
	out := *f
	if len(out.Message) > maxFailedPlanMessage {
		cut := maxFailedPlanMessage
		for cut > 0 && !utf8.RuneStart(out.Message[cut]) {
			cut--
		}
		out.Message = out.Message[:cut] + "…"
	}
	b, _ := json.Marshal(out) // plain strings, ints and a time: cannot fail
	return string(b)
}

// DecodeFailedPlan reads the annotation's value.
func DecodeFailedPlan(s string) (*FailedPlan, error) {
	f := &FailedPlan{}
	if err := json.Unmarshal([]byte(s), f); err != nil {
		return nil, err
	}
	return f, nil
}

// NodeReason is the first reason, in the order of the Node* reasons, that
// node n cannot take member m of req as the planner screens it;
// NodeHasRoom when it can. closest is the domain of the required level
// that came closest ("" when unknown): a node with room elsewhere is
// NodeOutsideDomain.
func NodeReason(req Request, m Member, n *NodeView, closest string) string {
	label := req.requiredLabel()
	switch {
	case n.Cordoned:
		return NodeCordoned
	case n.Unavailable():
		return NodeReclaiming
	case req.Policy.Excludes(n.Preemptible):
		return NodePolicy
	case !m.Constraints.Match(n.Node):
		return NodeUnmatched
	case label != "" && n.Node.Labels[label] == "":
		return NodeNoDomain
	case n.gpus(req.GPU) < m.Request.Scalars[req.GPU]:
		return NodeInsufficientGPUs
	case !n.Free.Fits(m.Request):
		return NodeInsufficientOther
	case label != "" && closest != "" && n.Node.Labels[label] != closest:
		return NodeOutsideDomain
	}
	return NodeHasRoom
}

// requiredLabel is the node label of the level req requires: "" when it
// requires none, or a level read from device attributes.
func (req Request) requiredLabel() string {
	for _, l := range req.Levels {
		if l.Name == req.Required {
			return l.Label
		}
	}
	return ""
}

// LargestMember is the member asking for the most GPUs (the first of
// them): the one a node must fit for any member to fit. req has members.
func (req Request) LargestMember() Member {
	m := req.Members[0]
	for _, other := range req.Members[1:] {
		if other.Request.Scalars[req.GPU] > m.Request.Scalars[req.GPU] {
			m = other
		}
	}
	return m
}

// TallyNodes counts nodes by the first reason they cannot take the gang's
// largest member (by GPUs): the planner's own screening of its views
// (NodeReason), then refusedBy, the framework filter that refused a member
// on the node in the plan's filter check ("" when none did), then closest,
// the domain of the required level that came closest (Unplaceable.Closest;
// a node with room elsewhere is OutsideDomain). The largest counts come
// first; at most maxReasonCounts, the rest folded into the last.
func TallyNodes(req Request, nodes []NodeView, refusedBy func(node string) string, closest string) []NodeReasonCount {
	if len(req.Members) == 0 {
		return nil
	}
	m := req.LargestMember()
	type key struct{ reason, filter string }
	counts := map[key]int{}
	var order []key
	for i := range nodes {
		n := &nodes[i]
		k := key{reason: NodeReason(req, m, n, closest)}
		if k.reason == NodeHasRoom || k.reason == NodeOutsideDomain {
			if refusedBy != nil {
				if f := refusedBy(n.Node.Name); f != "" {
					k = key{reason: NodeFilterRejected, filter: f}
				}
			}
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	out := make([]NodeReasonCount, len(order))
	for i, k := range order {
		out[i] = NodeReasonCount{Reason: k.reason, Filter: k.filter, Nodes: counts[k]}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Nodes > out[j].Nodes })
	if len(out) > maxReasonCounts {
		rest := out[maxReasonCounts-1:]
		other := NodeReasonCount{Reason: NodeOther}
		for _, c := range rest {
			other.Nodes += c.Nodes
		}
		out = append(out[:maxReasonCounts-1], other)
	}
	return out
}
