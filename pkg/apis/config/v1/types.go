package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// MusterGangArgs configures the MusterGang plugin. Every field is optional.
type MusterGangArgs struct {
	metav1.TypeMeta `json:",inline"`

	// DefaultScheduleTimeoutSeconds bounds how long a planned gang waits at
	// Permit for all its members, unless its PodGroup sets
	// scheduleTimeoutSeconds. 1..900, default 120.
	DefaultScheduleTimeoutSeconds *int64 `json:"defaultScheduleTimeoutSeconds,omitempty"`
	// GangBackoffSeconds is how long a gang that failed waits before it is
	// planned again. 0..3600, default 5.
	GangBackoffSeconds *int64 `json:"gangBackoffSeconds,omitempty"`
	// GPUResourceName is the extended resource topology and bin-packing count.
	// Default nvidia.com/gpu.
	GPUResourceName *string `json:"gpuResourceName,omitempty"`
	// GPUDeviceClasses are DeviceClasses whose devices count as GPUs
	// beside every class whose extendedResourceName is GPUResourceName
	// (dynamic resource allocation), e.g. gpu.nvidia.com for jobs that ask
	// for devices with ResourceClaims.
	GPUDeviceClasses []string `json:"gpuDeviceClasses,omitempty"`
	// TopologyPreset picks built-in levels for a platform: default, gke,
	// aws or topograph (see TopologyPresets). Ignored when TopologyLevels is
	// set.
	TopologyPreset *string `json:"topologyPreset,omitempty"`
	// TopologyLevels, tightest first. Default: the preset's levels; the
	// default preset is node=kubernetes.io/hostname,
	// nvlink=nvidia.com/gpu.clique, rack=topology.kubernetes.io/rack,
	// zone=topology.kubernetes.io/zone.
	TopologyLevels []TopologyLevel `json:"topologyLevels,omitempty"`
	// PreemptibleNodeMatchers mark a node preemptible (spot) when any matches.
	// Default: the GKE, EKS, Karpenter and AKS spot labels.
	PreemptibleNodeMatchers []NodeMatcher `json:"preemptibleNodeMatchers,omitempty"`
	// ReclaimTaintKeys mark a node being reclaimed; it never receives a new
	// gang member. Default: cloud.google.com/impending-node-termination,
	// karpenter.sh/disrupted, aws-node-termination-handler/spot-itn.
	// (A cordoned node never receives one either; it needs no key here.)
	ReclaimTaintKeys []string `json:"reclaimTaintKeys,omitempty"`
	// GangPreemption lets a gang (or a pod scheduled alone) that cannot be
	// placed evict whole gangs and lone pods of strictly lower priority,
	// as few GPUs as possible. Default true.
	GangPreemption *bool `json:"gangPreemption,omitempty"`
	// ProvisioningClassName, when set, makes a gang that cannot be placed
	// on the cluster's nodes ask cluster-autoscaler for its nodes as one
	// ProvisioningRequest (autoscaling.x-k8s.io/v1) of this class, e.g.
	// best-effort-atomic-scale-up.autoscaling.x-k8s.io; its members consume
	// the request (docs/autoscaling.md). Default empty: off.
	ProvisioningClassName *string `json:"provisioningClassName,omitempty"`
}

// TopologyLevel is one level of the topology hierarchy.
type TopologyLevel struct {
	// Name is what pods write in muster.dev/topology-required/-preferred.
	Name string `json:"name"`
	// NodeLabel is the node label whose value names the node's domain.
	NodeLabel string `json:"nodeLabel,omitempty"`
	// DeviceAttribute, instead of NodeLabel, takes the node's domain from
	// a device attribute its DRA driver publishes in the node's
	// ResourceSlices (domain/name, e.g. the NVLink clique of NVIDIA's
	// driver): the value of the first of the node's devices that has it.
	DeviceAttribute string `json:"deviceAttribute,omitempty"`
}

// NodeMatcher matches a node label or taint by key and optionally value.
type NodeMatcher struct {
	// Source is Label (default) or Taint.
	Source string `json:"source,omitempty"`
	Key    string `json:"key"`
	// Value, when set, must equal the label (or taint) value.
	Value string `json:"value,omitempty"`
}
