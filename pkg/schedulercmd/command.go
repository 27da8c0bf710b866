// Package schedulercmd builds the muster scheduler's command: kube-scheduler's
// command with muster's plugins registered.
package schedulercmd

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/pkg/plugins"
)

// New returns the scheduler command. Unlike plain kube-scheduler, it honours
// --kubeconfig together with --config when the configuration file names no
// kubeconfig (kube-scheduler silently ignores the flag then), so
// `muster-scheduler --config manifests/scheduler/scheduler-config.yaml
// --kubeconfig ~/.kube/config` runs outside a cluster.
func New() *cobra.Command {
	cmd := app.NewSchedulerCommand(plugins.WithMusterPlugins())
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if err := applyKubeconfigFlag(c); err != nil {
			return err
		}
		return run(c, args)
	}
	return cmd
}

func applyKubeconfigFlag(c *cobra.Command) error {
	flags := c.Flags()
	kubeconfig, config := flags.Lookup("kubeconfig"), flags.Lookup("config")
	if kubeconfig == nil || config == nil || !kubeconfig.Changed || config.Value.String() == "" {
		return nil
	}
	data, err := os.ReadFile(config.Value.String())
	if err != nil {
		return err
	}
	var cfg map[string]interface{}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("reading %s: %w", config.Value.String(), err)
	}
	conn, _ := cfg["clientConnection"].(map[string]interface{})
	if conn == nil {
		conn = map[string]interface{}{}
	}
	if existing, _ := conn["kubeconfig"].(string); existing != "" {
		return nil // the file decides, as in kube-scheduler
	}
	path, err := filepath.Abs(kubeconfig.Value.String())
	if err != nil {
		return err
	}
	conn["kubeconfig"] = path
	cfg["clientConnection"] = conn
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
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
