// Package manifests embeds the shipped manifests so tests and the demo run
// exactly what users apply, with no file paths to find.
package manifests

import "embed"

// FS holds the CRDs, the scheduler configuration and the examples.
//
//go:embed crds/*.yaml scheduler/scheduler-config.yaml examples/*.yaml
var FS embed.FS

// SchedulerConfig is the path in FS of the shipped KubeSchedulerConfiguration.
const SchedulerConfig = "scheduler/scheduler-config.yaml"

// MNISTExample is the path in FS of the MultiWorkerMirroredStrategy example.
const MNISTExample = "examples/mnist-mwms.yaml"
