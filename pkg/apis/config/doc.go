// +k8s:deepcopy-gen=package

// Package config holds the internal (unversioned) types of muster's plugin
// arguments, their validation, and the registration of both the internal and
// the v1 types into kube-scheduler's configuration schemes.
package config
