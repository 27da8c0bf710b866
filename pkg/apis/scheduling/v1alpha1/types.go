package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of PodGroup.
const GroupName = "scheduling.x-k8s.io"

// PodGroupLabel on a pod names the PodGroup (in the pod's namespace) it joins.
const PodGroupLabel = GroupName + "/pod-group"

// SchemeGroupVersion is the group version of PodGroup.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource is the PodGroup resource for dynamic clients and informers.
var Resource = SchemeGroupVersion.WithResource("podgroups")

// PodGroupPhase is the phase of a pod group.
type PodGroupPhase string

// Phases, as in scheduler-plugins.
const (
	PodGroupPending    PodGroupPhase = "Pending"
	PodGroupScheduling PodGroupPhase = "Scheduling"
	PodGroupScheduled  PodGroupPhase = "Scheduled"
	PodGroupRunning    PodGroupPhase = "Running"
	PodGroupSucceeded  PodGroupPhase = "Succeeded"
	PodGroupFailed     PodGroupPhase = "Failed"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodGroup is a set of pods scheduled together, all or none.
type PodGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PodGroupSpec   `json:"spec,omitempty"`
	Status PodGroupStatus `json:"status,omitempty"`
}

// PodGroupSpec is what the group needs.
type PodGroupSpec struct {
	// MinMember is the least number of pods that must be placed together.
	MinMember int32 `json:"minMember,omitempty"`
	// MinResources is informational for muster: it plans per node from the
	// pods' own requests, never from a cluster-wide sum.
	MinResources corev1.ResourceList `json:"minResources,omitempty"`
	// ScheduleTimeoutSeconds bounds how long placed members wait for the rest.
	ScheduleTimeoutSeconds *int32 `json:"scheduleTimeoutSeconds,omitempty"`
}

// PodGroupStatus is what the scheduler observed.
type PodGroupStatus struct {
	Phase             PodGroupPhase      `json:"phase,omitempty"`
	OccupiedBy        string             `json:"occupiedBy,omitempty"`
	Scheduled         int32              `json:"scheduled,omitempty"`
	Running           int32              `json:"running,omitempty"`
	Succeeded         int32              `json:"succeeded,omitempty"`
	Failed            int32              `json:"failed,omitempty"`
	ScheduleStartTime *metav1.Time       `json:"scheduleStartTime,omitempty"`
	Conditions        []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodGroupList is a list of PodGroups.
type PodGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodGroup `json:"items"`
}
