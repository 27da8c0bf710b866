package v1

import (
	"k8s.io/utils/ptr"
)

// DefaultTopologyLevels are the levels used when the args name none.
func DefaultTopologyLevels() []TopologyLevel {
	return []TopologyLevel{
		{Name: "node", NodeLabel: "kubernetes.io/hostname"},
		{Name: "nvlink", NodeLabel: "nvidia.com/gpu.clique"},
		{Name: "rack", NodeLabel: "topology.kubernetes.io/rack"},
		{Name: "zone", NodeLabel: "topology.kubernetes.io/zone"},
	}
}

// DefaultPreemptibleNodeMatchers recognise the spot/preemptible labels of GKE,
// EKS, Karpenter and AKS.
func DefaultPreemptibleNodeMatchers() []NodeMatcher {
	return []NodeMatcher{
		{Source: "Label", Key: "cloud.google.com/gke-spot", Value: "true"},
		{Source: "Label", Key: "cloud.google.com/gke-preemptible", Value: "true"},
		{Source: "Label", Key: "eks.amazonaws.com/capacityType", Value: "SPOT"},
		{Source: "Label", Key: "karpenter.sh/capacity-type", Value: "spot"},
		{Source: "Label", Key: "kubernetes.azure.com/scalesetpriority", Value: "spot"},
	}
}

// DefaultReclaimTaintKeys are taints that announce a node is going away.
func DefaultReclaimTaintKeys() []string {
	return []string{
		"cloud.google.com/impending-node-termination",
		"karpenter.sh/disrupted",
		"node.kubernetes.io/unschedulable",
		"aws-node-termination-handler/spot-itn",
	}
}

// SetDefaults_MusterGangArgs fills every unset field.
func SetDefaults_MusterGangArgs(obj *MusterGangArgs) {
	if obj.DefaultScheduleTimeoutSeconds == nil {
		obj.DefaultScheduleTimeoutSeconds = ptr.To[int64](120)
	}
	if obj.GangBackoffSeconds == nil {
		obj.GangBackoffSeconds = ptr.To[int64](5)
	}
	if obj.GPUResourceName == nil {
		obj.GPUResourceName = ptr.To("nvidia.com/gpu")
	}
	if len(obj.TopologyLevels) == 0 {
		obj.TopologyLevels = DefaultTopologyLevels()
	}
	if obj.PreemptibleNodeMatchers == nil {
		obj.PreemptibleNodeMatchers = DefaultPreemptibleNodeMatchers()
	}
	for i := range obj.PreemptibleNodeMatchers {
		if obj.PreemptibleNodeMatchers[i].Source == "" {
			obj.PreemptibleNodeMatchers[i].Source = "Label"
		}
	}
	if obj.ReclaimTaintKeys == nil {
		obj.ReclaimTaintKeys = DefaultReclaimTaintKeys()
	}
}
