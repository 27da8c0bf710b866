package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/plugins"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

// StartScheduler runs the muster scheduler in this process the way
// cmd/scheduler does (kube-scheduler's options, muster's feature-gate
// defaults, Setup and Run), configured
// from the shipped manifests/scheduler/scheduler-config.yaml with leader
// election and the secure port turned off. extraArgs are kube-scheduler flags.
// It stops when ctx is done; the returned channel yields Run's result.
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
	// The shipped file relies on in-cluster credentials; point it at this
	// control plane instead, as the muster command does with --kubeconfig.
	data, err := schedulercmd.WithKubeconfig(config, cp.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("scheduler configuration: %w", err)
	}
	if err := os.WriteFile(configPath, data, 0o600); err != nil {
		return nil, err
	}
	args := append([]string{
		"--config=" + configPath,
		"--leader-elect=false",
		"--secure-port=0",
	}, extraArgs...)

	if err := schedulercmd.SetFeatureDefaults(); err != nil {
		return nil, err
	}
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("muster-scheduler", pflag.ContinueOnError)
	for _, set := range opts.Flags.FlagSets {
		fs.AddFlagSet(set)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	cc, sched, err := app.Setup(ctx, opts, plugins.WithMusterPlugins())
	if err != nil {
		return nil, fmt.Errorf("setting up scheduler: %w", err)
	}
	// Run registers its configuration under a process-wide name; a test that
	// restarts the scheduler in the same process must free it first.
	configz.Delete("componentconfig")
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cc, sched) }()
	return done, nil
}
