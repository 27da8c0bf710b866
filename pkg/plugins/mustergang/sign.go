package mustergang

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

var _ fwk.SignPlugin = &Plugin{}

// signPolicyKey names MusterGang's fragment of a pod's signature.
const signPolicyKey = "muster.dev/preemptible-policy"

// SignPod lets the framework batch pods scheduled alone (opportunistic
// batching, KEP-5598: consecutive pods with equal signatures reuse the last
// cycle's ranking of nodes, and the hinted node still passes every Filter).
// A profile in which one Filter or Score plugin cannot sign batches
// nothing, which made every plain pod pay full filtering and scoring under
// muster. For a pod alone, MusterGang's Filter and Score depend on the node
// and on the pod only through its preemptible policy, so the policy is the
// fragment. A gang member is refused: its plan decides its node, and a
// member's cycles are not interchangeable. (A pod alone that preempted has a
// plan too; its Filter refuses a hinted node that is not its slot, so a
// stale signature costs one Filter call, never a wrong placement.)
func (p *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	info, inGang, err := p.source.resolve(pod)
	switch {
	case err != nil && !inGang:
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	case err != nil || inGang:
		return nil, fwk.NewStatus(fwk.Unschedulable, "a gang member is placed by its gang's plan")
	}
	return []fwk.SignFragment{{Key: signPolicyKey, Value: string(info.Constraints.Policy)}}, nil
}
