// Command scheduler is kube-scheduler with muster's plugins registered.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	"github.com/muster-sched/muster/pkg/schedulercmd"
)

func main() {
	os.Exit(cli.Run(schedulercmd.New()))
}
