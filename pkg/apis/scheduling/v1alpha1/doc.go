// +k8s:deepcopy-gen=package

// Package v1alpha1 is the PodGroup API (podgroups.scheduling.x-k8s.io), schema
// compatible with kubernetes-sigs/scheduler-plugins so that Kubeflow's
// training-operator and other producers of PodGroups work unchanged.
package v1alpha1
