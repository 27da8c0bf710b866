// Command kubectl-muster is a kubectl plugin for the muster scheduler:
// `kubectl muster gangs`, `kubectl muster explain <kind>/<name>` and
// `kubectl muster top`. Install it on the PATH (go install
// github.com/muster-sched/muster/cmd/kubectl-muster@latest) and kubectl
// finds it; see docs/explain.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/muster-sched/muster/pkg/kubectlmuster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cmd := kubectlmuster.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		stop()
		os.Exit(1)
	}
}
