package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// MusterGangArgs configures the MusterGang plugin (internal form; see v1 for
// the documented, versioned form users write in pluginConfig).
type MusterGangArgs struct {
	metav1.TypeMeta

	// DefaultScheduleTimeoutSeconds bounds how long a planned gang may wait at
	// Permit for all its members when its PodGroup does not say otherwise.
	DefaultScheduleTimeoutSeconds int64
	// GangBackoffSeconds is how long a gang that failed (timeout, rejection)
	// waits before it is planned again.
	GangBackoffSeconds int64
	// GPUResourceName is the extended resource that topology and bin-packing
	// count.
	GPUResourceName string
	// GPUDeviceClasses are DeviceClasses whose devices count as GPUs,
	// beside every class whose extendedResourceName is GPUResourceName.
	GPUDeviceClasses []string
	// TopologyPreset names a built-in set of levels (see v1.TopologyPresets);
	// used when TopologyLevels is empty.
	TopologyPreset string
	// TopologyLevels lists topology domains, tightest first.
	TopologyLevels []TopologyLevel
	// PreemptibleNodeMatchers mark a node as preemptible (spot) when any matches.
	PreemptibleNodeMatchers []NodeMatcher
	// ReclaimTaintKeys are taint keys that mark a node as being reclaimed; such
	// a node never receives a new gang member.
	ReclaimTaintKeys []string
	// GangPreemption lets a gang (or a pod scheduled alone) that cannot be
	// placed evict whole lower-priority gangs and lone pods.
	GangPreemption bool
	// ProvisioningClassName is the class of the ProvisioningRequest a gang
	// that cannot be placed asks cluster-autoscaler for its nodes with;
	// empty: none is created.
	ProvisioningClassName string
}

// TopologyLevel names one level of the topology hierarchy and the node label
// whose value identifies a domain at that level.
type TopologyLevel struct {
	Name      string
	NodeLabel string
	// DeviceAttribute, when set instead of NodeLabel, is a DRA device
	// attribute (domain/name) whose value on the node's devices names the
	// node's domain.
	DeviceAttribute string
}

// NodeMatcherSource says where a NodeMatcher looks.
type NodeMatcherSource string

const (
	NodeMatcherLabel NodeMatcherSource = "Label"
	NodeMatcherTaint NodeMatcherSource = "Taint"
)

// NodeMatcher matches a node label (or taint) by key and, when Value is
// non-empty, by value.
type NodeMatcher struct {
	Source NodeMatcherSource
	Key    string
	Value  string
}
