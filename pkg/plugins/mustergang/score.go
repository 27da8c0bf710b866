package mustergang

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// Score gives a gang member's planned node the top score (it is the only
// feasible one) and ranks nodes for pods scheduled alone by their
// preemptible policy; bin-packing comes from NodeResourcesFit's
// MostAllocated strategy in the shipped configuration.
func (p *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readState(cs)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	if s.slot != "" {
		return fwk.MaxNodeScore, nil
	}
	if s.policy.Dislikes(p.preemptible(ni.Node())) {
		return fwk.MinNodeScore, nil
	}
	return fwk.MaxNodeScore, nil
}

// ScoreExtensions is nil: scores are already in [0, 100].
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }
