// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/muster-sched/muster/pkg/apis/config
// +k8s:defaulter-gen=TypeMeta

// Package v1 is the versioned form of muster's plugin args, written by users
// in the pluginConfig of a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1).
package v1
