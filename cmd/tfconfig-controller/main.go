// Command tfconfig-controller runs muster's TF_CONFIG controller; see
// pkg/controllercmd.
package main

import (
	"os"

	"github.com/muster-sched/muster/pkg/controllercmd"
)

func main() {
	os.Exit(controllercmd.Main(os.Args[1:]))
}
