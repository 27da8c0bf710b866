// Package schedulercmd builds the muster scheduler: kube-scheduler's command
// with muster's plugins registered (New, and Start for one process that runs
// it again and again), and Build, the constructor for a scheduler on a
// client and clock of the caller's (the simulator). All three take muster's
// plugins (Registry) and feature defaults (SetFeatureDefaults) from here;
// the command and Start construct through kube-scheduler's app.Setup, which
// builds its own clients from the flags, and Build passes the settings of the
// configuration that app.Setup passes.
package schedulercmd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/features"
	"sigs.k8s.io/yaml"
)

// New returns the scheduler command. Unlike plain kube-scheduler, it honours
// --kubeconfig together with --config when the configuration file names no
// kubeconfig (kube-scheduler silently ignores the flag then), so
// `muster-scheduler --config manifests/scheduler/scheduler-config.yaml
// --kubeconfig ~/.kube/config` runs outside a cluster.
//
// It also sets the feature gates in featureDefaults; --feature-gates
// overrides them.
func New() *cobra.Command {
	if err := SetFeatureDefaults(); err != nil {
		panic(err) // a gate of the linked kube-scheduler: cannot fail
	}
	cmd := app.NewSchedulerCommand(registryOption())
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if err := applyKubeconfigFlag(c.Flags()); err != nil {
			return err
		}
		return run(c, args)
	}
	return cmd
}

// Start runs the scheduler in this process the way the command does
// (muster's feature defaults, kube-scheduler's flags, --kubeconfig next to
// --config, muster's plugins, kube-scheduler's Setup and Run) until ctx
// ends; the channel yields Run's result. Unlike the command it installs no
// signal handler and frees the process-wide configz name, so one process may
// start it again and again: the demo, the integration tests and their HA
// replicas use it.
func Start(ctx context.Context, args []string) (<-chan error, error) {
	if err := SetFeatureDefaults(); err != nil {
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
	if err := applyKubeconfigFlag(fs); err != nil {
		return nil, err
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	cc, sched, err := app.Setup(ctx, opts, registryOption())
	if err != nil {
		return nil, fmt.Errorf("setting up scheduler: %w", err)
	}
	// Run registers the configuration under a process-wide name.
	configz.Delete("componentconfig")
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cc, sched) }()
	return done, nil
}

// featureDefaults are kube-scheduler feature gates muster sets differently.
//
// NominatedNodeNameForExpectation (on by default in 1.37) patches
// status.nominatedNodeName onto every pod that will wait at Permit. Every
// gang member waits there, so it cost one more API call per pod, on the
// client that also binds: with the default client QPS a burst of gangs took
// twice as long as a stock kube-scheduler's (docs/scheduling.md,
// "API calls"). muster's ledger already holds the capacity of waiting
// members; the nomination added nothing but that call.
//
// InterPodAffinityHostnameFastPath (alpha, off in 1.37) lets
// InterPodAffinity decide required terms on kubernetes.io/hostname from the
// candidate node's own pods instead of counting, in every PreFilter, the
// pods of the whole cluster that the incoming pod's terms match. Training
// jobs' workers carry such terms ("one worker per node", "not beside that
// service"), and every member's own cycle pays that PreFilter: on a busy
// 5000-node cluster it was 72% of muster's CPU (BENCHMARKS.md, "Paying the
// dearest PreFilters once"). It assumes what kubelets ensure, one node per
// hostname label value; the plan's own dry run assumes the same
// (pkg/plugins/mustergang/dryrun.go). --feature-gates=
// InterPodAffinityHostnameFastPath=false turns it off.
var featureDefaults = map[string]bool{
	string(features.NominatedNodeNameForExpectation):  false,
	string(features.InterPodAffinityHostnameFastPath): true,
}

// comparisonGates are the gates of featureDefaults that change how the
// framework's own plugins decide, not what muster does: a benchmark runs
// every scheduler it compares with them (ComparisonFeatureGates).
var comparisonGates = []string{string(features.InterPodAffinityHostnameFastPath)}

// SetFeatureDefaults applies featureDefaults to the process's feature gates.
// Call it before the command's flags are parsed, so --feature-gates wins.
func SetFeatureDefaults() error {
	return utilfeature.DefaultMutableFeatureGate.SetFromMap(featureDefaults)
}

// ComparisonFeatureGates are the feature gates muster sets that every
// scheduler in a comparison must run with too (comparisonGates).
func ComparisonFeatureGates() map[string]bool {
	out := map[string]bool{}
	for _, g := range comparisonGates {
		out[g] = featureDefaults[g]
	}
	return out
}

// applyKubeconfigFlag points --config at a copy of the configuration file
// with clientConnection.kubeconfig set from --kubeconfig (withKubeconfig).
func applyKubeconfigFlag(flags *pflag.FlagSet) error {
	kubeconfig, config := flags.Lookup("kubeconfig"), flags.Lookup("config")
	if kubeconfig == nil || config == nil || !kubeconfig.Changed || config.Value.String() == "" {
		return nil
	}
	data, err := os.ReadFile(config.Value.String())
	if err != nil {
		return err
	}
	path, err := filepath.Abs(kubeconfig.Value.String())
	if err != nil {
		return err
	}
	out, err := withKubeconfig(data, path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", config.Value.String(), err)
	}
	dir, err := os.MkdirTemp("", "muster-scheduler-")
	if err != nil {
		return err
	}
	merged := filepath.Join(dir, filepath.Base(config.Value.String()))
	if err := os.WriteFile(merged, out, 0o600); err != nil {
		return err
	}
	return flags.Set("config", merged)
}

// withKubeconfig returns the KubeSchedulerConfiguration config with
// clientConnection.kubeconfig set to kubeconfig, unless the file names one
// already (then the file decides, as in kube-scheduler). The rest of
// clientConnection (qps, burst) is kept.
func withKubeconfig(config []byte, kubeconfig string) ([]byte, error) {
	var cfg map[string]interface{}
	if err := yaml.Unmarshal(config, &cfg); err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = map[string]interface{}{}
	}
	conn, _ := cfg["clientConnection"].(map[string]interface{})
	if conn == nil {
		conn = map[string]interface{}{}
	}
	if existing, _ := conn["kubeconfig"].(string); existing != "" {
		return config, nil
	}
	conn["kubeconfig"] = kubeconfig
	cfg["clientConnection"] = conn
	return yaml.Marshal(cfg)
}
