package gang

import (
	v1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// NodeConstraints are the node-level rules of a pod the planner evaluates
// itself: NoSchedule/NoExecute taints against tolerations, the node selector
// and required node affinity. Other filters (pod affinity, ports, volumes) are
// verified by the framework when each member's own cycle runs on its node.
type NodeConstraints struct {
	tolerations []v1.Toleration
	affinity    nodeaffinity.RequiredNodeAffinity
}

// ConstraintsOf extracts a pod's node constraints.
func ConstraintsOf(pod *v1.Pod) *NodeConstraints {
	return &NodeConstraints{
		tolerations: pod.Spec.Tolerations,
		affinity:    nodeaffinity.GetRequiredNodeAffinity(pod),
	}
}

// Match reports whether the pod may run on node.
func (c *NodeConstraints) Match(node *v1.Node) bool {
	if c == nil {
		return true
	}
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, c.tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, false); untolerated {
		return false
	}
	ok, err := c.affinity.Match(node)
	return ok && err == nil
}
