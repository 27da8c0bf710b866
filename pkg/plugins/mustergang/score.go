package mustergang

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

var _ fwk.PreScorePlugin = &Plugin{}

// PreScore skips Score when it would give every feasible node the same
// score: a planned member (its slot is the only feasible node) or a pod
// alone whose policy likes or dislikes all of them alike (no spot node among
// them, say, for the default policy avoid). Reading the cached node classes
// here costs less than the framework's per-node Score calls.
func (p *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s, err := readState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.slot != "" || len(nodes) == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	first := s.policy.Dislikes(p.nodes.preemptible(nodes[0].Node()))
	for _, ni := range nodes[1:] {
		if s.policy.Dislikes(p.nodes.preemptible(ni.Node())) != first {
			return nil
		}
	}
	return fwk.NewStatus(fwk.Skip)
}

// Score gives a gang member's planned node the top score (it is the only
// feasible one) and ranks nodes for pods scheduled alone by their
// preemptible policy; bin-packing comes from MusterBinPack (NodeResourcesFit's
// MostAllocated scoring) in the shipped configuration.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readState(cs)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	if s.slot != "" {
		return fwk.MaxNodeScore, nil
	}
	if s.policy.Dislikes(p.nodes.preemptible(ni.Node())) {
		return fwk.MinNodeScore, nil
	}
	return fwk.MaxNodeScore, nil
}

// ScoreExtensions is nil: scores are already in [0, 100].
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }
