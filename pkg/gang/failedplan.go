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
// largest member (by GPUs): the planner's own screening of its views, then
// refusedBy, the framework filter that refused a member on the node in the
// plan's filter check ("" when none did), then closest, the domain of the
// required level that came closest (Unplaceable.Closest; a node with room
// elsewhere is OutsideDomain). The largest counts come first; at most
// maxReasonCounts, the rest folded into the last.
func TallyNodes(req Request, nodes []NodeView, refusedBy func(node string) string, closest string) []NodeReasonCount {
	if len(req.Members) == 0 {
		return nil
	}
	m := req.LargestMember()
	gpus := m.Request.Scalars[req.GPU]
	var label string
	for _, l := range req.Levels {
		if l.Name == req.Required {
			label = l.Label // "" for a device-attribute level
		}
	}
	type key struct{ reason, filter string }
	counts := map[key]int{}
	var order []key
	for i := range nodes {
		n := &nodes[i]
		k := key{reason: NodeHasRoom}
		switch {
		case n.Cordoned:
			k.reason = NodeCordoned
		case n.Unavailable():
			k.reason = NodeReclaiming
		case req.Policy.Excludes(n.Preemptible):
			k.reason = NodePolicy
		case !m.Constraints.Match(n.Node):
			k.reason = NodeUnmatched
		case label != "" && n.Node.Labels[label] == "":
			k.reason = NodeNoDomain
		case n.gpus(req.GPU) < gpus:
			k.reason = NodeInsufficientGPUs
		case !n.Free.Fits(m.Request):
			k.reason = NodeInsufficientOther
		default:
			if refusedBy != nil {
				if f := refusedBy(n.Node.Name); f != "" {
					k = key{reason: NodeFilterRejected, filter: f}
					break
				}
			}
			if label != "" && closest != "" && n.Node.Labels[label] != closest {
				k.reason = NodeOutsideDomain
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
