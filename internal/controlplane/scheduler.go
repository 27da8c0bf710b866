package controlplane

import (
	"context"
	"os"
	"path/filepath"

	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

// StartScheduler runs the muster scheduler in this process the way
// cmd/scheduler does (schedulercmd.Start), configured from the shipped
// manifests/scheduler/scheduler-config.yaml with leader election and the
// secure port turned off. extraArgs are kube-scheduler flags. It stops when
// ctx is done; the returned channel yields Run's result.
func (cp *ControlPlane) StartScheduler(ctx context.Context, extraArgs ...string) (<-chan error, error) {
	data, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		return nil, err
	}
	return cp.StartSchedulerWithConfig(ctx, data, extraArgs...)
}

// StartSchedulerWithConfig is StartScheduler with another
// KubeSchedulerConfiguration (e.g. kube-scheduler's default profile, to
// compare with, or a broken one, to see it rejected).
func (cp *ControlPlane) StartSchedulerWithConfig(ctx context.Context, config []byte, extraArgs ...string) (<-chan error, error) {
	configPath := filepath.Join(cp.tb.TempDir(), "scheduler-config.yaml")
	if err := os.WriteFile(configPath, config, 0o600); err != nil {
		return nil, err
	}
	// The shipped file relies on in-cluster credentials; --kubeconfig points
	// it at this control plane, as a user running the command outside a
	// cluster does.
	args := append([]string{
		"--config=" + configPath,
		"--kubeconfig=" + cp.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}, extraArgs...)
	return schedulercmd.Start(ctx, args)
}
