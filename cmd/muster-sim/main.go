// Command muster-sim runs muster's demo on an in-process control plane (and,
// later, simulated-cluster benchmarks).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/muster-sched/muster/pkg/demo"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "demo" {
		fmt.Fprintln(os.Stderr, "usage: muster-sim demo [--logs]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	logs := fs.Bool("logs", false, "show control plane and scheduler logs on stderr")
	_ = fs.Parse(os.Args[2:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var logOut io.Writer
	if *logs {
		logOut = os.Stderr
	}
	if err := demo.Run(ctx, demo.Options{Out: os.Stdout, Logs: logOut}); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
