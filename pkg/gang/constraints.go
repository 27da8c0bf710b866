package gang

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
	// logger is the scheduler's, for what the toleration matcher reports
	// (an unparsable comparison toleration).
	logger klog.Logger
	// OnePerNode: the pod has required anti-affinity against its own labels
	// per hostname ("one worker per node"), the one intra-gang rule the
	// planner models. Other affinity between members is checked only by each
	// member's own cycle (a mismatch drops the plan).
	OnePerNode bool
}

// ConstraintsOf extracts a pod's node constraints; logger is the scheduler's.
func ConstraintsOf(logger klog.Logger, pod *v1.Pod) *NodeConstraints {
	return &NodeConstraints{
		logger:      logger,
		tolerations: pod.Spec.Tolerations,
		affinity:    nodeaffinity.GetRequiredNodeAffinity(pod),
		OnePerNode:  antiAffinityPerNode(pod),
	}
}

func antiAffinityPerNode(pod *v1.Pod) bool {
	if pod.Spec.Affinity == nil || pod.Spec.Affinity.PodAntiAffinity == nil {
		return false
	}
	for _, term := range pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if term.TopologyKey != v1.LabelHostname || (len(term.Namespaces) > 0 && !slices.Contains(term.Namespaces, pod.Namespace)) {
			continue
		}
		selector, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && !selector.Empty() && selector.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}

// Match reports whether the pod may run on node.
func (c *NodeConstraints) Match(node *v1.Node) bool {
	if c == nil {
		return true
	}
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(c.logger, node.Spec.Taints, c.tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, false); untolerated {
		return false
	}
	ok, err := c.affinity.Match(node)
	return ok && err == nil
}
