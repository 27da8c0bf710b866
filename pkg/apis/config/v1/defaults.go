package v1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// The node vocabulary muster's defaults speak: the GPU resource and the node
// labels and taint of the presets and matchers below. The simulator, the
// test builders (internal/testobj) and the demo use these names, so what
// they build is what the defaults read. Labels that only one preset or
// matcher names stay literals there.
const (
	// DefaultGPUResourceName is the extended resource gpuResourceName
	// defaults to (NVIDIA's device plugin).
	DefaultGPUResourceName = "nvidia.com/gpu"
	// LabelHostname is the node level of every preset (Kubernetes' well-known label).
	LabelHostname = corev1.LabelHostname
	// LabelNVLinkClique is the NVLink domain NVIDIA's GPU Operator labels nodes with.
	LabelNVLinkClique = "nvidia.com/gpu.clique"
	// LabelRack is the rack level of the default preset.
	LabelRack = "topology.kubernetes.io/rack"
	// LabelZone is the zone level (Kubernetes' well-known label).
	LabelZone = corev1.LabelTopologyZone
	// LabelGKESpot marks a GKE spot node ("true"); the first preemptible node matcher.
	LabelGKESpot = "cloud.google.com/gke-spot"
	// TaintGKEImpendingTermination is put on a GKE node about to be reclaimed;
	// the first reclaim taint.
	TaintGKEImpendingTermination = "cloud.google.com/impending-node-termination"
)

// DefaultTopologyPreset is used when the args name neither a preset nor levels.
const DefaultTopologyPreset = "default"

// TopologyPresets are ready-made levels, tightest first, for the labels
// common platforms put on nodes. Level names stay familiar across presets
// (node, nvlink, rack, ...) so job annotations carry over.
var TopologyPresets = map[string][]TopologyLevel{
	// Kubernetes well-known labels plus NVIDIA GPU Operator's NVLink clique.
	"default": {
		{Name: "node", NodeLabel: LabelHostname},
		{Name: "nvlink", NodeLabel: LabelNVLinkClique},
		{Name: "rack", NodeLabel: LabelRack},
		{Name: "zone", NodeLabel: LabelZone},
	},
	// GKE compact placement: sub-block ≈ rack, block ≈ a group of racks.
	"gke": {
		{Name: "node", NodeLabel: LabelHostname},
		{Name: "rack", NodeLabel: "cloud.google.com/gce-topology-subblock"},
		{Name: "block", NodeLabel: "cloud.google.com/gce-topology-block"},
		{Name: "zone", NodeLabel: LabelZone},
	},
	// EC2 instance topology: layer 3 is the switch nearest the node.
	"aws": {
		{Name: "node", NodeLabel: LabelHostname},
		{Name: "rack", NodeLabel: "topology.k8s.aws/network-node-layer-3"},
		{Name: "spine", NodeLabel: "topology.k8s.aws/network-node-layer-2"},
		{Name: "core", NodeLabel: "topology.k8s.aws/network-node-layer-1"},
		{Name: "zone", NodeLabel: LabelZone},
	},
	// NVIDIA topograph: accelerator (NVLink) domain, then leaf/spine/core switches.
	"topograph": {
		{Name: "node", NodeLabel: LabelHostname},
		{Name: "nvlink", NodeLabel: "network.topology.nvidia.com/accelerator"},
		{Name: "rack", NodeLabel: "network.topology.nvidia.com/leaf"},
		{Name: "spine", NodeLabel: "network.topology.nvidia.com/spine"},
		{Name: "core", NodeLabel: "network.topology.nvidia.com/core"},
	},
}

// DefaultPreemptibleNodeMatchers recognise the spot/preemptible labels of GKE,
// EKS, Karpenter and AKS.
func DefaultPreemptibleNodeMatchers() []NodeMatcher {
	return []NodeMatcher{
		{Source: "Label", Key: LabelGKESpot, Value: "true"},
		{Source: "Label", Key: "cloud.google.com/gke-preemptible", Value: "true"},
		{Source: "Label", Key: "eks.amazonaws.com/capacityType", Value: "SPOT"},
		{Source: "Label", Key: "karpenter.sh/capacity-type", Value: "spot"},
		{Source: "Label", Key: "kubernetes.azure.com/scalesetpriority", Value: "spot"},
	}
}

// DefaultReclaimTaintKeys are taints that announce a node is going away.
// A cordon (and the node.kubernetes.io/unschedulable taint the node
// controller adds with it) is not among them: the planner leaves cordoned
// nodes out on its own, and the profile's NodeUnschedulable filter refuses
// them.
func DefaultReclaimTaintKeys() []string {
	return []string{
		TaintGKEImpendingTermination,
		"karpenter.sh/disrupted",
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
		obj.GPUResourceName = ptr.To(DefaultGPUResourceName)
	}
	if len(obj.TopologyLevels) == 0 {
		preset := ptr.Deref(obj.TopologyPreset, DefaultTopologyPreset)
		// An unknown preset leaves the levels empty; validation names it.
		obj.TopologyLevels = append([]TopologyLevel(nil), TopologyPresets[preset]...)
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
	if obj.GangPreemption == nil {
		obj.GangPreemption = ptr.To(true)
	}
}
