package mustergang

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// Filter keeps a gang member on its planned node, keeps every muster pod off
// nodes being reclaimed, and keeps pods scheduled alone out of the capacity
// gang plans hold and on the nodes their preemptible policy allows.
func (p *Plugin) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) *fwk.Status {
	s, err := readState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	node := ni.Node()
	if s.slot != "" && node.Name != s.slot {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("%s planned this member on node %s", s.key.Subject(), s.slot))
	}
	if p.nodes.reclaiming(node) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node is being reclaimed")
	}
	if s.slot != "" {
		return nil // the plan already applied policy and capacity
	}
	// Only a policy that keeps pods off some nodes needs the node's class.
	if s.policy.KeepsOff() && s.policy.Excludes(p.nodes.preemptible(node)) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("preemptible policy %s", s.policy))
	}
	if holdings, ok := s.held[node.Name]; ok {
		free := freeOnNode(ni)
		// The framework's first filter pass adds nominated pods to ni: a
		// nominated member is then counted by ni and by its holding. Put
		// it back so each holding is taken once (DRA GPUs are not in ni;
		// nodeGPUs sets them from the claims).
		for _, h := range holdings {
			if onNode(ni, h.UID) {
				free.Add(h.Request)
			}
		}
		nodeGPUs(&free, ni, v1.ResourceName(p.args.GPUResourceName), s.dra.freeOn(node.Name))
		for _, h := range holdings {
			free.Sub(h.Request)
		}
		if !free.Fits(s.request) {
			return fwk.NewStatus(fwk.Unschedulable, heldByPlans)
		}
	}
	return nil
}

// heldByPlans is Filter's reason for keeping a pod scheduled alone off a
// node: PostFilter reads it (cycle.HeldOut).
const heldByPlans = "capacity held for a planned gang"

// onNode reports whether the pod of uid is in ni, bound, assumed or added
// as nominated.
func onNode(ni fwk.NodeInfo, uid types.UID) bool {
	for _, pi := range ni.GetPods() {
		if pi.GetPod().UID == uid {
			return true
		}
	}
	return false
}
